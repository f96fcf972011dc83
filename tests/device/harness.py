"""Drives the scheduler's C++ logic on the CPU (host build) over a real shared-memory segment, with a
fake model standing in for the forward graph.

The fake model writes each token (id, position) into a fake KV cache through slot_mapping and predicts
the next token from the whole history *read back through the block table*, so a wrong block table,
a leaked or double-owned block, or a broken recompute after preemption changes the tokens.
"""
from __future__ import annotations

import contextlib
import ctypes as C
import itertools
import os
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from blink.core.step_buffers import StepBuffers
from blink.device import structs
from blink.device.build import load_host_library
from blink.kernels.sampling_state import SamplingState
from blink.request import FinishReason, SamplingParams, TokenEvent
from blink.transport.layout import ENGINE_MODE_DEVICE, SegmentLayout, grammar_staging
from blink.transport.rings import EgressConsumer, IngressProducer
from blink.transport.shm import Segment
from tests.device.fake_model import fake_forward, fake_prompt_entry, reference  # noqa: F401 (re-exported)

INFO = ("running", "waiting", "free_blocks", "free_slots", "free_entries", "plan_rows", "plan_tokens",
        "plan_bucket", "parity", "preemptions", "steps", "tokens", "error_code", "fast_plans", "cached_free_blocks",
        "prefix_queries", "prefix_hits", "resets_done", "team_matches",
        "team_shares", "plan_searchless")
_names = itertools.count()


@dataclass
class Config:
    max_num_seqs: int = 4
    max_num_batched_tokens: int = 16
    max_model_len: int = 64
    block_size: int = 4
    num_blocks: int = 64
    max_requests: int = 16
    vocab_size: int = 50
    eos: tuple[int, ...] = (1,)
    ingress_capacity: int = 16
    arena_capacity: int = 512
    egress_capacity: int = 256
    buckets: list[tuple[int, int]] = field(default_factory=list)
    team: int = 1  # host threads standing in for the CTA's threads
    # As the GPU loop: a step's records are written and published only after the next launch (or on an idle
    # turn), and requests that arrive meanwhile are ingested then (work_during_forward)
    defer_publish: bool = False
    # As the GPU loop (with defer_publish): the next step's inputs are written while a forward runs and launched
    # once its tokens are in, when nothing else changed (csrc/sched_ahead.h); its step is finished after
    launch_ahead: bool = False
    peers: int = 0  # tensor-parallel ranks besides rank 0, whose buffers the scheduler writes too
    prefix_caching: bool = False  # share cached prefixes' blocks (csrc/sched_prefix.h)
    sampler_variants: int = 2  # graphs per bucket: with the searchless one, each plan picks its variant
    grammar_arena_bytes: int = 0  # structured outputs: the sampling state's grammar arena and the staging section
    prompt_logprob_rows: int = 0  # prompt-logprob rows per step (StepBuffers.prompt_*)


def _buffers(tmax: int, smax: int, mb: int, prompt_rows: int = 0) -> dict[str, np.ndarray]:
    """A step-buffer set as the runtime allocates it (StepBuffers, on the CPU), as numpy views."""
    buffers = StepBuffers.allocate(tmax, smax, mb, "cpu", prompt_rows=prompt_rows)
    return {name: getattr(buffers, name).numpy() for name in structs.STEP_BUFFER_FIELDS}


def _sampling(slots: int, vocab: int, grammar_arena_bytes: int = 0) -> tuple[SamplingState, dict[str, np.ndarray]]:
    """The sampling state as the runtime allocates it, with stale rows (admissions must overwrite them)."""
    state = SamplingState(slots, vocab, "cpu", grammar_arena_bytes)
    out = {name: getattr(state, name).numpy() for name in structs.SAMPLING_FIELDS}
    out["output_counts"][:], out["prompt_mask"][:], out["num_logprobs"][:] = 7, 9, 5
    out["grammar_state"][:], out["grammar_id"][:], out["grammar_classes"][:] = 5, 3, 1
    out["grammar_row_base"][:], out["grammar_cells"][:] = 2, 4
    return state, out


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


class HostScheduler:
    def __init__(self, cfg: Config | None = None):
        self.cfg = c = cfg or Config()
        if not c.buckets:
            c.buckets = [(t, min(t, c.max_num_seqs)) for t in (1, 2, 4, 8)
                         if t < c.max_num_batched_tokens] + [(c.max_num_batched_tokens, c.max_num_seqs)]
        self.lib = load_host_library()
        layout = SegmentLayout(c.ingress_capacity, c.arena_capacity, c.egress_capacity,
                               *grammar_staging(c.grammar_arena_bytes))
        self.seg = Segment.create(f"blink-test-{os.getpid()}-{next(_names)}", layout)
        self.producer, self.consumer = IngressProducer(self.seg), EgressConsumer(self.seg)
        self.mb = -(-c.max_model_len // c.block_size)
        sc = structs.SchedConfig(
            max_num_seqs=c.max_num_seqs, max_num_batched_tokens=c.max_num_batched_tokens,
            max_model_len=c.max_model_len, block_size=c.block_size, num_blocks=c.num_blocks,
            max_blocks_per_seq=self.mb, max_requests=c.max_requests, vocab_size=c.vocab_size,
            num_buckets=len(c.buckets), num_eos=len(c.eos), trace_capacity=1, launches_per_kernel=119,
            step_timeout_ns=10**9, enable_prefix_caching=int(c.prefix_caching),
            prompt_logprob_rows=c.prompt_logprob_rows, sampler_variants=c.sampler_variants)
        self.sampling_state, self.sampling = _sampling(c.max_num_seqs + 1, c.vocab_size, c.grammar_arena_bytes)
        structs.grammar_config(sc, self.sampling_state)
        for i, (t, s) in enumerate(c.buckets):
            sc.bucket_tokens[i], sc.bucket_seqs[i] = t, s
        for i, e in enumerate(c.eos):
            sc.eos_ids[i] = e
        self.sched_cfg = sc
        nbytes = self.lib.blink_sched_state_bytes(C.byref(sc))
        self._state_raw = np.zeros(nbytes + 256, np.uint8)
        self.state = (_ptr(self._state_raw) + 255) // 256 * 256
        self.lib.blink_sched_init(self.state, C.byref(sc), 0, 0, 0)
        tmax, smax = c.buckets[-1][0], max(s for _, s in c.buckets)
        self.buffers = [_buffers(tmax, smax, self.mb, c.prompt_logprob_rows) for _ in range(2)]
        p = structs.LoopParams(cfg=sc, state=self.state,
                               rings=structs.ring_pointers(self.seg.address, layout))
        for k in range(2):
            for name in structs.STEP_BUFFER_FIELDS:
                setattr(p.buffers[k], name, _ptr(self.buffers[k][name]))
        for name in structs.SAMPLING_FIELDS:
            setattr(p.sampling, name, _ptr(self.sampling[name]))
        # Peer ranks' buffer sets (garbage at first: the scheduler must write everything a step reads).
        self.peer_buffers = [[{k: np.full_like(v, 77) for k, v in _buffers(tmax, smax, self.mb).items()}
                              for _ in range(2)] for _ in range(c.peers)]
        self.mailboxes = np.zeros(max(c.peers, 1), np.uint64)
        self.peer_table = structs.PeerTable(num_peers=c.peers)
        for j, sets in enumerate(self.peer_buffers):
            self.peer_table.peers[j].mailbox = _ptr(self.mailboxes) + 8 * j
            for k in range(2):
                for name in structs.STEP_BUFFER_FIELDS:
                    setattr(self.peer_table.peers[j].buffers[k], name, _ptr(sets[k][name]))
        if c.peers:
            p.peers = C.addressof(self.peer_table)
        if c.grammar_arena_bytes:
            self.seg.control.engine_mode = ENGINE_MODE_DEVICE  # as the GPU loop sets it: grammars get staged
            self.seg.control.vocab_size = c.vocab_size
        self.after_prepare = None  # test hook: called with (parity, bucket) after each prepared step
        self.during_forward = None  # test hook (defer_publish): called once a step is launched, before the loop's
        # work during its forward (submit or abort there to arrive while it runs)
        self.params = p
        self.kv_tok = np.full(c.num_blocks * c.block_size, -1, np.int64)
        self.kv_pos = np.full(c.num_blocks * c.block_size, -1, np.int64)
        self.events: dict[int, list[TokenEvent]] = {}
        self.plans: list[list[tuple[int, int, int, bool]]] = []
        self.searchless: list[bool] = []  # per plan: its variant (csrc/sched_variant.h)
        self.fail_next = False

    # -- driving -----------------------------------------------------------------------------------
    def submit(self, req_id: int, prompt: list[int], params: SamplingParams, tables=None) -> None:
        """tables: a constrained request's GrammarTables, staged first as the front end does (then released:
        the submitted request holds its slot until its last record)."""
        staging = self.producer.staging
        if tables is not None:
            staging.reserve(params.constraint, tables.token_class, tables.next_state)
        try:
            assert self.producer.submit(req_id, prompt, params, timeout=0), "ingress full"
        finally:
            if tables is not None:
                staging.unreserve(params.constraint)

    def abort(self, req_id: int) -> None:
        assert self.producer.abort(req_id, timeout=0)

    def step(self) -> int:
        """One scheduler step with the fake forward; returns the step's rows (0 = idle). With launch_ahead, the
        steps launched ahead of it too (the GPU loop's inner loop)."""
        if self.cfg.launch_ahead:
            return self.step_ahead()
        rows = self.lib.blink_sched_prepare(C.byref(self.params), self.cfg.team)
        launched = False
        if rows:
            info = self.info()
            self.plans.append(self.plan(rows))
            self.searchless.append(bool(info["plan_searchless"]))
            if self.after_prepare is not None:
                self.after_prepare(info["parity"], self.cfg.buckets[info["plan_bucket"]])
            if self.fail_next:  # as a failed launch: the step's requests end with ERROR
                self.fail_next = False
                self.lib.blink_sched_fail(C.byref(self.params), structs.ERR_LAUNCH_BASE + 1)
            else:
                launched = True
        if self.cfg.defer_publish:  # where the GPU loop writes and publishes: right after the launch, or idle
            if self.during_forward is not None and launched:
                self.during_forward()
            self.lib.blink_sched_during_forward(C.byref(self.params), self.cfg.team, int(launched))
            self.lib.blink_sched_publish(C.byref(self.params))
        if launched:
            self.forward(self.buffers[info["parity"]], self.cfg.buckets[info["plan_bucket"]], rows)
            defer = int(self.cfg.defer_publish)
            self.lib.blink_sched_complete(C.byref(self.params), self.cfg.team, 1 - defer, defer)
        self.drain()
        assert self.check() == 0, f"invariant {self.check()} broken"
        return rows

    def step_ahead(self) -> int:
        """The GPU loop's order with launching ahead: launch, records and ingest, the next step's inputs, the
        forward, then either the next step launched ahead (and this one finished) or this one completed."""
        p, team = C.byref(self.params), self.cfg.team
        rows = first = self.lib.blink_sched_prepare(p, team)
        if rows and self.fail_next:  # as a failed launch: the step's requests end with ERROR
            self.fail_next = False
            self.plans.append(self.plan(rows))
            self.lib.blink_sched_fail(p, structs.ERR_LAUNCH_BASE + 1)
            rows = 0
        launched = False  # this step was launched ahead (its parity is then the one before `launched & 1`)
        while rows:
            info = self.info()
            parity, bucket = info["parity"] ^ int(launched), self.cfg.buckets[info["plan_bucket"]]
            self.plans.append(self.plan(rows))
            self.searchless.append(bool(info["plan_searchless"]))
            if self.after_prepare is not None:
                self.after_prepare(parity, bucket)
            if not launched:
                self.lib.blink_sched_launch(p)
            if self.during_forward is not None:
                self.during_forward()
            self.lib.blink_sched_during_forward(p, team, 1)
            self.lib.blink_sched_publish(p)
            ahead = self.lib.blink_sched_prepare_ahead(p, team)
            self.forward(self.buffers[parity], bucket, rows)
            launched = bool(ahead and self.lib.blink_sched_take_ahead(p, team))
            if not launched:
                self.lib.blink_sched_complete_launched(p, team, 0, 1)
                break
            self.lib.blink_sched_launch(p)
            assert self.lib.blink_sched_finish_behind(p, team) == 1, "a step launched ahead was not the plan's"
            rows = self.info()["plan_rows"]
            self.drain()
            assert self.check() == 0, f"invariant {self.check()} broken"
        if not first:  # the idle turn's flush; after a step, its records wait for the next launch, as on the GPU
            self.lib.blink_sched_during_forward(p, team, 0)
        self.lib.blink_sched_publish(p)
        self.drain()
        assert self.check() == 0, f"invariant {self.check()} broken"
        return first

    def ahead_counts(self) -> tuple[int, int]:
        """(steps launched ahead, inputs written ahead but not taken)."""
        out = (C.c_uint64 * 2)()
        self.lib.blink_sched_ahead_counts(self.state, out)
        return int(out[0]), int(out[1])

    def drain(self) -> list[TokenEvent]:
        got = self.consumer.poll()
        for ev in got:
            self.events.setdefault(ev.req_id, []).append(ev)
        return got

    def run(self, max_steps: int = 10_000) -> int:
        steps = 0
        while self.busy():
            self.step()
            steps += 1
            assert steps < max_steps, "the scheduler made no progress"
        if self.cfg.defer_publish:
            self.step()  # the idle step publishes the last records
        return steps

    def busy(self) -> bool:
        i = self.info()
        return bool(i["running"] or i["waiting"] or self.producer.descriptors.used())

    # -- the fake forward --------------------------------------------------------------------------
    def forward(self, b: dict[str, np.ndarray], bucket: tuple[int, int], rows: int) -> None:
        fake_forward(self, b, bucket, rows)

    # -- inspection ---------------------------------------------------------------------------------
    def info(self) -> dict[str, int]:
        out = (C.c_int64 * len(INFO))()
        self.lib.blink_sched_info(self.state, out)
        return dict(zip(INFO, out, strict=True))

    def plan(self, rows: int) -> list[tuple[int, int, int, bool]]:
        out = (C.c_int64 * (4 * rows))()
        self.lib.blink_sched_plan(self.state, out)
        return [(out[4 * r], out[4 * r + 1], out[4 * r + 2], bool(out[4 * r + 3])) for r in range(rows)]

    def drain_done(self) -> bool:
        """The GPU loop's exit test on an idle turn (ingress closed, all it carried finished)."""
        return bool(self.lib.blink_sched_drain_done(C.byref(self.params)))

    def check(self) -> int:
        return self.lib.blink_sched_check(self.state, C.byref(self.sched_cfg))

    def outputs(self, req_id: int) -> tuple[list[int], FinishReason]:
        """The request's tokens and finish reason, after checking its records are well formed."""
        evs = self.events[req_id]
        assert [e.position for e in evs if e.token_id >= 0] == list(range(sum(e.token_id >= 0 for e in evs)))
        assert [e.finished for e in evs] == [False] * (len(evs) - 1) + [True], "exactly one finish, last"
        return [e.token_id for e in evs if e.token_id >= 0], evs[-1].finish_reason

    def close(self) -> None:
        self.producer = self.consumer = None
        self.seg.close()
        self.seg.unlink()


@contextlib.contextmanager
def slow_reader(h: HostScheduler, period_s: float, expect_events: int):
    """Only a background thread reads egress, one record per `period_s`, so the scheduler meets a full
    ring. Yields the list it fills; on exit waits (up to 10 s) for `expect_events` records, then stops."""
    got: list[TokenEvent] = []
    stop = threading.Event()
    consumer = h.consumer

    def reader():
        while not stop.is_set():
            got.extend(consumer.poll(1))
            time.sleep(period_s)

    t = threading.Thread(target=reader)
    h.consumer = type("NoRead", (), {"poll": lambda self: []})()
    t.start()
    try:
        yield got
        deadline = time.time() + 10
        while len(got) < expect_events and time.time() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        t.join()
        h.consumer = consumer
