"""Structured outputs in the GPU scheduler's C++ (built with g++, driven on the CPU): the admission copies the
staged tables into the arena and writes each slot's grammar as host mode's loader does, preemption by
recompute re-walks the output, and the plans stay the Python scheduler's. The fake forward plays the
sampler's grammar part over the arena the scheduler wrote (tests/device/harness.py)."""
from __future__ import annotations

import json
import random

import pytest

from blink.grammar.arena import GrammarArena, Resident, arena_geometry
from blink.grammar.compiler import GrammarCompiler
from blink.kernels.sampling_state import FLAG_GRAMMAR, SamplingState
from blink.request import Constraint, FinishReason, SamplingParams
from tests.device.harness import reference

pytestmark = pytest.mark.timeout(120)

VOCAB, ARENA = 50, 128 << 10
CHARS = "abcdefghijklmnopqrstuvwxyz0123456789{}[]:,\" "
PIECES = [None, None] + [c.encode() for c in CHARS] + [b"ab", b"12", b'"a', b"},"]  # 0: special, 1: EOS
REGEX = Constraint("regex", "[a-c]{2,4}(x|yz)")
CHOICE = Constraint("choice", json.dumps(["yes", "no", "maybe"]))
SCHEMA = Constraint("json_schema", json.dumps({"type": "object", "properties": {
    "n": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["n"], "additionalProperties": False}))
GRAMMAR_KW = dict(vocab_size=VOCAB, eos=(1,), grammar_arena_bytes=ARENA)


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    _, states, cells = arena_geometry(VOCAB, ARENA)
    return GrammarCompiler(PIECES, (1,), states, cells)


def constrained(c: Constraint, max_tokens=12, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, constraint=c, **kw)


def text(tokens: list[int]) -> str:
    return b"".join(PIECES[t] for t in tokens if t != 1).decode()


@pytest.mark.parametrize("team", [1, 4])
def test_admission_copies_the_tables_and_writes_the_slots_as_host_mode(make, compiler, team):
    h = make(max_num_seqs=6, team=team, **GRAMMAR_KW)
    requests = [(1, REGEX), (2, CHOICE), (3, SCHEMA), (4, REGEX), (5, None)]  # 4 shares 1's slot
    for rid, c in requests:
        params = constrained(c, seed=rid) if c else SamplingParams(temperature=0.5, max_tokens=4, seed=rid)
        h.submit(rid, [2 + rid, 3], params, compiler.compile(c) if c else None)
    seen = {}
    h.after_prepare = lambda *_: seen.update({k: v.copy() for k, v in h.sampling.items()})
    h.step()

    staging = h.producer.staging
    gids = {c: staging.slot_of(c) for c in (REGEX, CHOICE, SCHEMA)}
    assert sorted(gids.values()) == [0, 1, 2]
    host = SamplingState(h.cfg.max_num_seqs + 1, VOCAB, "cpu", ARENA)
    arena = GrammarArena(host)
    for c, gid in gids.items():  # host mode's loader, into the same partition
        arena._load(Resident(gid, compiler.compile(c)))
    S, C = host.grammar_states_per_slot, host.grammar_cells_per_slot
    for c, gid in gids.items():
        t = compiler.compile(c)
        rows, cells = slice(gid * S, gid * S + t.num_states), slice(gid * C, gid * C + t.num_states * t.num_classes)
        assert (seen["grammar_classes"][gid] == host.grammar_classes[gid].numpy()).all()
        assert (seen["grammar_row_base"][rows] == host.grammar_row_base[rows].numpy()).all()
        assert (seen["grammar_cells"][cells] == host.grammar_cells[cells].numpy()).all()
    # Slots are taken lowest first in admission (FCFS) order: request k sits in slot k - 1.
    for rid, c in requests:
        slot = rid - 1
        params = constrained(c, seed=rid) if c else SamplingParams(temperature=0.5, max_tokens=4, seed=rid)
        grammar = (gids[c], gids[c] * S) if c else None  # slot_grammar's answer for an empty output
        host.set_slot(slot, params, rid, [2 + rid, 3], (), grammar)
        for name in ("temperature", "top_p", "top_k", "seed", "flags", "num_logprobs", "grammar_id", "grammar_state"):
            if name == "grammar_id" and c is None:
                continue  # read only under FLAG_GRAMMAR
            assert seen[name][slot] == getattr(host, name)[slot].item(), (rid, name)
        assert bool(seen["flags"][slot] & FLAG_GRAMMAR) == (c is not None)


@pytest.mark.parametrize("team", [1, 3])
def test_constrained_requests_with_preemption_match_the_host_scheduler(make, compiler, team):
    """A KV pool far too small: constrained requests are preempted and recomputed; the re-admission walks
    the output so far, so every request still yields the masked reference's tokens (a wrong state after
    the walk changes them), each output matches its constraint, and every plan is host mode's."""
    from blink.core.outputs import SampledToken
    from blink.core.scheduler import Scheduler
    from blink.core.sequence import Sequence

    h = make(max_num_seqs=5, max_num_batched_tokens=12, num_blocks=14, max_requests=10, max_model_len=40,
             team=team, **GRAMMAR_KW)
    host = Scheduler(14, 4, 5, 12, max_model_len=40, eos_token_ids=(1,))
    rng = random.Random(1)
    reqs = []
    for rid in range(1, 41):
        c = rng.choice([REGEX, CHOICE, SCHEMA, None])
        prompt = [rng.randrange(2, VOCAB) for _ in range(rng.randrange(1, 16))]
        params = constrained(c, 40 - len(prompt)) if c else SamplingParams(temperature=0.0, max_tokens=8)
        reqs.append((rid, prompt, params))
    pending, steps = list(reqs), 0
    while pending or h.busy():
        if pending and h.producer.descriptors.free() and h.info()["free_entries"] > 2 and rng.random() < 0.6:
            rid, prompt, params = pending.pop(0)
            c = params.constraint
            h.submit(rid, prompt, params, compiler.compile(c) if c else None)
            host.add(Sequence(rid, prompt, params, 0, rid))
        plan = host.schedule()
        rows = h.step()
        steps += 1
        assert rows == len(plan.chunks) and steps < 5000
        if rows:
            assert h.plans[-1] == [(c.seq.req_id, c.start, c.num_tokens, c.samples) for c in plan.chunks]
            device_events = [h.events[c.seq.req_id][-1] if c.samples else None for c in plan.chunks]
            host.update_from_output(plan, [SampledToken(e.token_id, 0.0, [], []) if e else None
                                           for e in device_events])
    assert h.info()["preemptions"] > 0
    for rid, prompt, params in reqs:
        c = params.constraint
        tables = compiler.compile(c) if c else None
        tokens, reason = h.outputs(rid)
        assert (tokens, reason) == reference(prompt, params, VOCAB, (1,), 40, tables), rid
        if c is not None:  # the grammar alone forces a complete, matching output, then EOS
            assert reason == FinishReason.STOP and tokens[-1] == 1
            out = text(tokens)
            if c is CHOICE:
                assert out in ("yes", "no", "maybe")
            elif c is SCHEMA:
                assert set(json.loads(out)) == {"n"} and 0 <= json.loads(out)["n"] <= 99
            else:
                import re
                assert re.fullmatch(c.spec, out)
    assert h.producer.staging.held_keys() == set(), "every slot is free once every last record was read"


def test_a_resident_generation_is_not_copied_again(make, compiler):
    """Identical constraints later on reuse the slot and its generation, so the GPU copies nothing: the
    staged bytes are scribbled over here (which the front end never does) and the arena keeps the tables."""
    h = make(**GRAMMAR_KW)
    h.submit(1, [5, 6], constrained(REGEX), compiler.compile(REGEX))
    h.run()
    gid = h.producer.staging.slot_of(REGEX)
    before = h.sampling["grammar_cells"].copy(), h.sampling["grammar_classes"].copy()
    h.producer.staging.words[gid, :] = 3
    h.submit(2, [7, 8, 9], constrained(REGEX), compiler.compile(REGEX))
    h.run()
    assert (h.sampling["grammar_cells"] == before[0]).all() and (h.sampling["grammar_classes"] == before[1]).all()
    assert h.outputs(2) == reference([7, 8, 9], constrained(REGEX), VOCAB, (1,), h.cfg.max_model_len,
                                     compiler.compile(REGEX))


def test_a_new_constraint_in_a_freed_slot_is_copied(make, compiler):
    """Sixteen slots, seventeen constraints one after another: the LRU slot is rewritten with a new
    generation and the GPU copies it; outputs follow their own grammar throughout."""
    h = make(**GRAMMAR_KW)
    constraints = [Constraint("choice", json.dumps([f"a{i}", f"b{i}x"])) for i in range(17)]
    for rid, c in enumerate(constraints, 1):
        h.submit(rid, [4, 5], constrained(c), compiler.compile(c))
        h.run()
        tokens, reason = h.outputs(rid)
        assert reason == FinishReason.STOP and text(tokens) in json.loads(c.spec)
    assert h.producer.staging.slot_of(constraints[0]) is None  # evicted: the oldest


def test_descriptors_without_staged_tables_are_refused(make):
    """A constrained descriptor the scheduler cannot serve (no staged tables: a host-mode producer's) gets
    an ERROR record; the engine stays up."""
    h = make(max_model_len=32, vocab_size=50, num_blocks=8, block_size=4)
    h.submit(1, [2, 3, 4], constrained(REGEX, 4))
    h.submit(2, [2, 3], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    h.run()
    assert [(e.token_id, e.finish_reason) for e in h.events[1]] == [(-1, FinishReason.ERROR)]
    tokens, reason = h.outputs(2)
    assert len(tokens) == 3 and reason == FinishReason.LENGTH
