"""Device mode's idle policy (issue 19, idle energy): `--device-idle` into the scheduler's config
(csrc/sched_idle.h), and the host thread that relaunches a parked loop.

A resident kernel keeps the GPU busy in NVML's eyes (100% utilisation) and its clocks up, even asleep in
__nanosleep between polls. `deep` lengthens the sleeps once idle for a while (more added latency for the
first request, fewer wake-ups and PCIe reads); `park` ends the kernel after a longer idle, and
ParkWatcher relaunches it when the ingress ring or a command word changes, so an idle GPU runs nothing.
The watcher's work is per idle period and per wake-up, never per token: while the loop runs it only asks
cudaStreamQuery, every PARK_CHECK_S, whether the kernel parked; parked, it reads the ring and the command
words every POLL_US (`park:AFTER_MS:POLL_US`, 1 ms by default, as host mode's idle readers): measured on a
2-core CPU, 0.02 cores at 1 ms, 0.11 at 100 us (tests/device/test_idle.py has the wake-up).
"""
from __future__ import annotations

import threading
import time

import torch

from blink.config import DeviceIdle, parse_device_idle
from blink.transport.shm import HEAD_INDEX, TAIL_INDEX

SPIN_MAX_NS = 8192  # today's cap, and the first idle period's in every mode
PARK_CHECK_S = 5e-3  # running: how often to ask whether the kernel parked (0.1 ms of CPU a second)


def apply_device_idle(cfg, spec: str, tensor_parallel: bool) -> DeviceIdle:
    """Fill SchedConfig's idle fields from `--device-idle`; park is refused under tensor parallelism (the
    followers' loops would have to park and wake in step)."""
    idle = parse_device_idle(spec)
    if idle.mode == "park" and tensor_parallel:
        raise ValueError("--device-idle park: not with tensor parallelism (use deep)")
    cfg.idle_max_ns = SPIN_MAX_NS
    cfg.idle_deep_max_ns = idle.deep_max_us * 1000 if idle.mode != "spin" else SPIN_MAX_NS
    cfg.idle_deep_after_ns = int(idle.deep_after_ms * 1e6) if idle.mode != "spin" else 0
    cfg.idle_park_after_ns = int(idle.park_after_ms * 1e6) if idle.mode == "park" else 0
    return idle


def loop_needed(ctl, ring) -> bool:
    """A parked loop must run again: a descriptor it has not consumed, or a command it has not applied.
    ring: the ingress RingHeader's words (Segment.ring_header)."""
    return bool(ring[TAIL_INDEX] != ring[HEAD_INDEX] or ctl.stop_flag or ctl.ingress_closed
                or ctl.reset_prefix_cache != ctl.prefix_cache_resets)


class ParkWatcher:
    """Relaunches the scheduler graph after the kernel parked (stream idle, `exited` not set) once
    loop_needed(); keeps the heartbeat moving meanwhile (the front end's /health watches it)."""

    def __init__(self, lib, loop_exec, stream, segment, device: torch.device, poll_s: float = 1e-3):
        if device.type == "cuda" and device.index is None:  # the watcher's thread needs the index itself
            device = torch.device("cuda", torch.cuda.current_device())
        self.lib, self.exec, self.stream, self.segment, self.device = lib, loop_exec, stream, segment, device
        self.poll_s = poll_s
        self.parks = 0  # parked periods seen (each ended by a relaunch or a stop)
        self.error: str | None = None  # a relaunch that failed (the loop is then down: alive() says so)
        self._stop = threading.Event()
        self._parked = threading.Event()
        self._thread = threading.Thread(target=self._run, name="blink-device-park-watcher", daemon=True)

    def start(self) -> ParkWatcher:
        self._thread.start()
        return self

    def parked(self) -> bool:
        """The kernel is parked right now (so an idle stream is not a dead loop)."""
        return self._parked.is_set()

    def watching(self) -> bool:
        """Still on duty: an idle stream without `exited` is a parked loop, not a dead one."""
        return self._thread.is_alive() and self.error is None and not self._stop.is_set()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        try:
            self._watch()
        except Exception as e:  # a dead watcher must not pass for a parked loop: alive() reads error
            self.error = f"park watcher: {type(e).__name__}: {e}"

    def _watch(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # the runtime calls below act on the current device
        ctl, ring = self.segment.control, self.segment.ring_header(self.segment.layout.ingress_header)
        while not self._stop.is_set():
            if self.lib.blink_stream_query(self.stream) != 0 or ctl.exited:  # running, failed or done
                if ctl.exited:
                    return
                time.sleep(PARK_CHECK_S)  # cheaper than Event.wait; stop() waits at most this long
                continue
            self._parked.set()
            self.parks += 1
            while not self._stop.is_set() and not loop_needed(ctl, ring):
                ctl.heartbeat += 1  # the parked kernel cannot
                time.sleep(self.poll_s)
            if self._stop.is_set():
                return  # stop() sees the parked loop: nothing runs, nothing to join
            code = self.lib.blink_loop_launch(self.exec, self.stream)
            self._parked.clear()
            if code != 0:
                self.error = f"relaunching the parked loop: {self.lib.blink_cuda_error_string(code).decode()} ({code})"
                return
