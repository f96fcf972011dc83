"""Device mode's host side: provision everything once, launch the GPU loop, then stay out of its way.

`DeviceLoop(loaded, args, segment)` allocates the scheduler state, two StepBuffers sets, captures each
bucket's forward graph once per buffer set (with the step_done kernel as its last node), instantiates
them for device launch, registers the shared-memory segment for the GPU and builds the scheduler's own
graph. `start()` launches it once on a non-blocking stream; from then on nothing here touches the device
(no synchronize, no .item(), no allocation: cudaFree and the caching allocator's OOM retry synchronize
and would hang behind the resident kernel). `stop()` raises stop_flag and joins; `close()` frees.
"""
from __future__ import annotations

import ctypes as C
import gc
import time

import numpy as np
import torch

from blink.core.limits import publish_limits
from blink.core.runner import ModelRunner
from blink.device import structs
from blink.device.build import load_device_library
from blink.device.device_graphs import (
    CUDA_ERROR_NOT_READY,
    STEP_TIMEOUT_S,
    capture_device_graphs,
    cuda_check,
    destroy_execs,
    exec_table,
    struct_on_device,
)
from blink.device.idle import ParkWatcher, apply_device_idle
from blink.kernels.sampling_grid import SEARCHLESS_DEFAULT
from blink.transport.shm import HEAD_INDEX, TAIL_INDEX
from blink.util.startup import phase

DEFAULT_TRACE_CAPACITY = 1 << 16
TOKEN_STORE_BUDGET = 256 << 20  # bytes for prompt + output tokens of every queued request


def max_requests_for(max_num_seqs: int, max_model_len: int) -> int:
    """Request table size: room for a deep FCFS queue, within the token store's memory budget."""
    fit = TOKEN_STORE_BUDGET // (4 * (max_model_len + 1))
    return int(max(max_num_seqs, min(4096, max(4 * max_num_seqs, 256), fit)))


class DeviceLoop:
    def __init__(self, loaded, args, segment, *, trace_capacity: int = DEFAULT_TRACE_CAPACITY,
                 max_requests: int | None = None, bad_bucket: int | None = None, relaunch_each_step: bool = False,
                 ingest_between_forwards: bool = False, launch_ahead: bool = True, warm_ahead: bool = True,
                 peers=None):
        """bad_bucket (self-test only): launches of that bucket index (negative counts from the end) report
        a launch error (cudaErrorLaunchFailure) instead of launching, exercising the error path. (Passing
        the device runtime an exec it cannot launch is not an error it reports: it faults the context.)
        relaunch_each_step: instead of staying resident and spinning on the completion counter, the
        scheduler fire-and-forgets the forward and tail-relaunches itself (probe pattern (a)): slower per
        step on trivial graphs, but it leaves the SM free while the forward runs. For comparison.
        ingest_between_forwards (self-test only): requests are taken in between forwards only, as before the
        loop ingested while a forward runs (issue 17's control gap). For comparison.
        launch_ahead=False (self-test only): every step is planned after the last one finished, as before the
        loop launched the next decode step ahead (csrc/sched_ahead.h). warm_ahead=False (self-test only): the wait
        loop does not keep the check's lines in L2. For comparison.
        peers (device-mode tensor parallelism): called once this rank's graphs are captured (the other ranks
        capture theirs in lockstep), it returns the follower ranks' PeerMappings (blink/parallel/ipc.py)."""
        m = self.loaded = loaded
        self.segment = segment
        self.lib = lib = load_device_library()
        self.device = torch.device(m.device)
        self.runner = ModelRunner.for_model(m, use_graphs=False)
        buckets = self.runner.buckets
        if len(buckets) > structs.MAX_BUCKETS or len(m.eos_token_ids) > structs.MAX_EOS:
            raise ValueError(f"device mode supports {structs.MAX_BUCKETS} buckets and {structs.MAX_EOS} EOS ids")
        self.stream, self.loop_exec, self.execs, self.graphs = C.c_void_p(), C.c_void_p(), [], {}
        self.registered = self.running = False
        self.watcher: ParkWatcher | None = None  # --device-idle park: relaunches the parked loop
        self.peer_maps = []  # keep the followers' IPC mappings open while the loop may write them
        self.fault: str | None = None  # a CUDA error seen on the loop's stream
        cuda_check(lib, lib.blink_stream_create(C.byref(self.stream)), "cudaStreamCreate")
        try:
            hooks = None  # the self-test's variants only: production passes none
            if bad_bucket is not None or relaunch_each_step or ingest_between_forwards or not launch_ahead or \
                    not warm_ahead:
                hooks = structs.LoopHooks(relaunch_each_step=int(relaunch_each_step),
                                          fail_bucket=-1 if bad_bucket is None else bad_bucket % len(buckets),
                                          ingest_between_forwards=int(ingest_between_forwards),
                                          no_launch_ahead=int(not launch_ahead), no_warm_ahead=int(not warm_ahead))
            self._provision(args, trace_capacity, max_requests, hooks, peers)
        except BaseException:
            self.close()
            raise

    def _provision(self, args, trace_capacity, max_requests, hooks, peers) -> None:
        m, lib, segment, buckets = self.loaded, self.lib, self.segment, self.runner.buckets

        lim = m.limits
        cfg = self.cfg = structs.SchedConfig(
            max_num_seqs=lim.max_num_seqs, max_num_batched_tokens=lim.max_num_batched_tokens,
            max_model_len=lim.max_model_len, block_size=lim.block_size, num_blocks=lim.num_kv_blocks,
            max_blocks_per_seq=lim.max_blocks_per_seq, vocab_size=lim.vocab_size,
            max_requests=max_requests or max_requests_for(lim.max_num_seqs, lim.max_model_len),
            num_buckets=len(buckets), num_eos=len(m.eos_token_ids), trace_capacity=trace_capacity,
            launches_per_kernel=structs.LAUNCHES_PER_KERNEL, step_timeout_ns=int(STEP_TIMEOUT_S * 1e9),
            enable_prefix_caching=int(lim.enable_prefix_caching), prompt_logprob_rows=lim.prompt_logprob_rows,
            sampler_variants=2 if SEARCHLESS_DEFAULT else 1, decode_pace_us=round(args.decode_pace_ms * 1000),
            decode_pace_max_batch=args.decode_pace_max_batch)
        structs.grammar_config(cfg, m.sampling_state)  # structured outputs: the arena its admission copies into
        self.idle = apply_device_idle(cfg, args.device_idle, peers is not None or args.tensor_parallel_size > 1)
        for i, (t, s) in enumerate(buckets):
            cfg.bucket_tokens[i], cfg.bucket_seqs[i] = t, s
        for i, e in enumerate(m.eos_token_ids):
            cfg.eos_ids[i] = e

        # Everything the loop touches, allocated now.
        self.state = torch.zeros(lib.blink_sched_state_bytes(C.byref(cfg)), dtype=torch.uint8, device=self.device)
        self.trace = torch.zeros(trace_capacity * structs.TRACE_WORDS, dtype=torch.int64, device=self.device)
        words = lambda off: segment.ring_header(off)
        lay = segment.layout
        torch.cuda.synchronize(self.device)  # the zero fills run on torch's stream, the init on ours
        cuda_check(lib, lib.blink_sched_init_device(
            self.state.data_ptr(), C.byref(cfg), int(words(lay.ingress_header)[HEAD_INDEX]),
            int(words(lay.arena_header)[HEAD_INDEX]), int(words(lay.egress_header)[TAIL_INDEX]), self.stream),
            "scheduler state init")
        cuda_check(lib, lib.blink_stream_synchronize(self.stream), "scheduler state init")
        self.done_counter = lib.blink_done_counter(self.state.data_ptr())

        self.buffer_sets = [self.runner.new_buffers(), self.runner.new_buffers()]
        phase("engine", "device scheduler built; capturing the forward graphs")
        table = capture_device_graphs(lib, self.runner, self.buffer_sets, self.stream, self.done_counter,
                                      self.graphs, self.execs, searchless=SEARCHLESS_DEFAULT)
        phase("engine", f"{len(self.execs)} device-launchable graphs captured")
        self.exec_table = exec_table(table, self.device)

        cuda_check(lib, lib.blink_host_register(segment.address, segment.size), "cudaHostRegister(segment)")
        self.registered = True
        dev = C.c_void_p()
        cuda_check(lib, lib.blink_host_device_pointer(segment.address, C.byref(dev)), "cudaHostGetDevicePointer")
        if dev.value != segment.address:
            raise RuntimeError("the GPU sees the shared segment at another address (needs UVA)")

        params = structs.LoopParams(cfg=cfg, state=self.state.data_ptr(),
                                    rings=structs.ring_pointers(segment.address, lay),
                                    graph_execs=self.exec_table.data_ptr(), trace=self.trace.data_ptr())
        for k, buf in enumerate(self.buffer_sets):
            for name, ptr in buf.pointers().items():
                setattr(params.buffers[k], name, ptr)
        for name in structs.SAMPLING_FIELDS:
            setattr(params.sampling, name, getattr(m.sampling_state, name).data_ptr())
        if peers is not None:
            self.peer_maps = peers()
            self.peer_table = struct_on_device(peer_table(self.peer_maps), self.device)
            params.peers = self.peer_table.data_ptr()
        self.hooks = None
        if hooks is not None:
            self.hooks = struct_on_device(hooks, self.device)
            params.hooks = self.hooks.data_ptr()
        self.params = struct_on_device(params, self.device)
        self.loop_exec = C.c_void_p()
        cuda_check(lib, lib.blink_loop_create(self.params.data_ptr(), self.stream, C.byref(self.loop_exec)),
                   "scheduler graph")
        torch.cuda.synchronize(self.device)

    # -- life cycle -----------------------------------------------------------------------------------
    def start(self) -> None:
        # Collect garbage now: a CUDA graph or pool freed later, while the loop runs, would cudaFree, which
        # synchronizes the device and waits forever behind the resident kernel.
        gc.collect()
        torch.cuda.synchronize(self.device)  # every set-up copy done before the loop owns the device
        ctl = self.segment.control
        ctl.stop_flag = 0
        ctl.exited = 0
        publish_limits(self.loaded.limits, ctl)  # before the GPU sets `ready`
        cuda_check(self.lib, self.lib.blink_loop_launch(self.loop_exec, self.stream), "launching the scheduler")
        self.running = True
        if self.idle.mode == "park":
            self.watcher = ParkWatcher(self.lib, self.loop_exec, self.stream, self.segment, self.device,
                                       poll_s=self.idle.park_poll_us * 1e-6).start()

    def wait_ready(self, timeout: float = 60.0) -> None:
        ctl, deadline = self.segment.control, time.monotonic() + timeout
        while not (ctl.ready and ctl.heartbeat):
            if ctl.exited:
                raise RuntimeError(f"the device loop exited at start: {self.error()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the device loop did not start within {timeout:.0f} s")
            time.sleep(0.001)

    def alive(self) -> bool:
        """Still serving: the loop's stream is busy (cudaStreamQuery never blocks) and it did not exit.
        A kernel fault shows up here as the stream's error, which error() then reports."""
        if not self.running:
            return False
        code = self.lib.blink_stream_query(self.stream)
        if code not in (0, CUDA_ERROR_NOT_READY):
            self.fault = f"{self.lib.blink_cuda_error_string(code).decode()} ({code})"
        if self.watcher is not None and self.watcher.error:
            self.fault = self.watcher.error
        parked = code == 0 and self.watcher is not None and self.watcher.watching()  # parked, or parking
        return (code == CUDA_ERROR_NOT_READY or parked) and not self.segment.control.exited

    def error(self) -> str:
        text = structs.describe_error(int(self.segment.control.error_code))
        return f"{text}; the loop's stream failed: {self.fault}" if self.fault else text

    def stop(self, timeout: float = 60.0) -> None:
        """Raise stop_flag; the loop finishes its step and exits; then join the stream."""
        if not self.running:
            return
        if self.watcher is not None:  # no relaunch after this; a parked loop has nothing left to finish
            self.watcher.stop()
        ctl = self.segment.control
        ctl.stop_flag = 1
        deadline = time.monotonic() + timeout
        while not ctl.exited and self.lib.blink_stream_query(self.stream) == CUDA_ERROR_NOT_READY:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the device loop did not exit within {timeout:.0f} s "
                                   f"(heartbeat {ctl.heartbeat}, {self.error()})")
            time.sleep(0.001)
        code = self.lib.blink_stream_synchronize(self.stream)
        self.running = False
        cuda_check(self.lib, code, f"the device loop ({self.error()})")

    def read_trace(self) -> np.ndarray:
        """[launches, TRACE_WORDS] (structs.TRACE_PHASES), oldest first. After stop()."""
        assert not self.running, "reading the trace synchronizes: stop the loop first"
        return self._trace_rows(self.launched())

    def trace_snapshot(self) -> np.ndarray:
        """read_trace() while the loop runs: copies on torch's stream (the loop's own stream is never
        waited for), so the newest rows may be half written; only launches known complete are returned."""
        return self._trace_rows(self._read_launched() - 1)

    def launched(self) -> int:
        """Forward graphs launched so far (SchedState.launched; reading it synchronizes: after stop())."""
        assert not self.running, "reading the state synchronizes: stop the loop first"
        return self._read_launched()

    def _read_launched(self) -> int:
        at = structs.SCHED_STATE_LAUNCHED
        return int(self.state[at:at + 8].cpu().view(torch.int64).item())

    def _trace_rows(self, count: int) -> np.ndarray:
        """The rows of launches 0..count-1 still in the trace ring, oldest first."""
        cap = self.cfg.trace_capacity
        t = self.trace.view(cap, structs.TRACE_WORDS).cpu().numpy()
        n = min(max(count, 0), cap)
        return t[np.arange(count - n, count) % cap]

    def close(self) -> None:
        if self.running:
            try:
                self.stop(timeout=10)
            except RuntimeError:
                return  # the loop is wedged: freeing what it uses would fault; the process has to exit
        lib = self.lib
        destroy_execs(lib, [*self.execs, self.loop_exec.value])
        self.execs, self.loop_exec = [], C.c_void_p()
        if self.registered:
            lib.blink_host_unregister(self.segment.address)
            self.registered = False
        if self.stream:
            lib.blink_stream_destroy(self.stream)
            self.stream = C.c_void_p()
        self.graphs.clear()
        for peer in self.peer_maps:
            peer.close(lib)
        self.peer_maps = []


def peer_table(peers: list) -> structs.PeerTable:
    if len(peers) > structs.MAX_PEERS:
        raise ValueError(f"device mode supports tensor parallelism up to {structs.MAX_PEERS + 1} ranks")
    table = structs.PeerTable(num_peers=len(peers))
    for j, peer in enumerate(peers):
        table.peers[j].mailbox = peer.mailbox
        for k in (0, 1):
            for name in structs.STEP_BUFFER_FIELDS:
                setattr(table.peers[j].buffers[k], name, peer.buffers[k][name])
    return table
