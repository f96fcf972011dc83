"""The sampler under a grammar: Triton (interpreted here) equals the torch reference; tokens obey the DFA."""
import json
import re

import torch

from blink.grammar.arena import ArenaFull, GrammarArena
from blink.kernels.sampling import sample_ref, sample_triton
from blink.kernels.sampling_grammar_advance import advance_grammar_ref, advance_grammar_triton
from blink.kernels.sampling_state import SamplingState
from blink.request import Constraint, SamplingParams

REGEX = Constraint("regex", r"(ab|cd)[0-9]{1,3}")
CHOICE = Constraint("choice", json.dumps(["alpha", "beta"]))
PARAMS = [  # slot: params, constraint
    (SamplingParams(temperature=0.0), REGEX),
    (SamplingParams(temperature=0.9, top_k=5, logprobs=2), REGEX),
    (SamplingParams(temperature=1.1, top_p=0.8, repetition_penalty=1.2, logit_bias={5: 30.0}), CHOICE),
    (SamplingParams(temperature=0.7), None),
]


def constrained_state(compiler, vocab):
    state = SamplingState(len(PARAMS) + 1, vocab, "cpu", grammar_arena_bytes=8 << 20)
    arena = GrammarArena(state)
    for slot, (params, c) in enumerate(PARAMS):
        grammar = None
        if c is not None:
            arena.acquire(c, compiler.compile(c))
            grammar = arena.slot_grammar(c, [])
        state.set_slot(slot, params, seed=77 + slot, prompt_ids=[1, 2, 3], grammar=grammar)
    return state, arena


def test_the_updates_after_the_choice_inside_the_sampler_equal_the_separate_ones(demo_compiler, demo_vocab):
    """sample(record=True): the finish kernel counts each token in its slot's penalty history and advances the
    constrained slots' DFA states (runner.py's step), as record_tokens and advance_grammar after sample_ref do;
    two rows of one unconstrained slot with penalties (slot 4) that choose the same token both count."""
    _, _, vocab = demo_vocab
    ref_state, _ = constrained_state(demo_compiler, vocab)
    tri_state, _ = constrained_state(demo_compiler, vocab)
    for state in (ref_state, tri_state):
        state.set_slot(4, SamplingParams(temperature=0.0, frequency_penalty=0.5), seed=1, prompt_ids=[1])
    slots = torch.tensor([0, 1, 2, 3, 4, 4, -1], dtype=torch.int32)
    gen = torch.Generator().manual_seed(3)
    for step in range(6):
        logits = torch.randn(len(slots), vocab, generator=gen) * 4
        logits[5] = logits[4]  # greedy twins: the same token, counted twice
        positions = torch.full((len(slots),), 20 + step, dtype=torch.int64)
        ref = sample_ref(logits, slots, positions, ref_state, 2)
        assert ref.token_ids[4] == ref.token_ids[5]
        ref_state.record_tokens(slots, ref.token_ids)
        advance_grammar_ref(slots, ref.token_ids, ref_state)
        tri = sample_triton(logits, slots, positions, tri_state, 2, record=True)
        assert torch.equal(ref.token_ids, tri.token_ids)
        assert torch.equal(ref_state.grammar_state, tri_state.grammar_state)
        assert torch.equal(ref_state.output_counts, tri_state.output_counts)
    assert tri_state.output_counts[4].sum() == 12 and tri_state.output_counts[2].sum() == 6  # greedy twins: 2 a step
    assert tri_state.output_counts[0].sum() == 0  # no penalties: not counted


def test_triton_equals_reference_and_obeys_the_grammar(demo_compiler, demo_vocab):
    tok, eos, vocab = demo_vocab
    ref_state, _ = constrained_state(demo_compiler, vocab)
    tri_state, _ = constrained_state(demo_compiler, vocab)
    slots = torch.tensor([0, 1, 2, 3, -1], dtype=torch.int32)
    outputs = [[] for _ in PARAMS]
    gen = torch.Generator().manual_seed(0)
    for step in range(8):
        logits = torch.randn(len(slots), vocab, generator=gen) * 4
        positions = torch.full((len(slots),), 10 + step, dtype=torch.int64)
        ref = sample_ref(logits, slots, positions, ref_state, 4)
        tri = sample_triton(logits, slots, positions, tri_state, 4)
        assert torch.equal(ref.token_ids, tri.token_ids)
        assert torch.allclose(ref.logprobs, tri.logprobs)
        advance_grammar_ref(slots, ref.token_ids, ref_state)
        advance_grammar_triton(slots, tri.token_ids, tri_state)
        assert torch.equal(ref_state.grammar_state, tri_state.grammar_state)
        for slot in range(3):
            if not outputs[slot] or outputs[slot][-1] not in eos:
                outputs[slot].append(int(ref.token_ids[slot]))
    for slot, (_, c) in enumerate(PARAMS[:3]):  # every prefix stays inside the language
        tables = demo_compiler.compile(c)
        assert tables.walk([t for t in outputs[slot] if t not in eos]) >= 0, (slot, outputs[slot])
        if outputs[slot][-1] in eos:
            text = tok.decode(outputs[slot][:-1])
            assert text in ("alpha", "beta") if c is CHOICE else re.fullmatch(r"(ab|cd)[0-9]{1,3}", text)


def test_eos_only_where_accepting(demo_compiler, demo_vocab):
    _, eos, vocab = demo_vocab
    state, _ = constrained_state(demo_compiler, vocab)
    slots = torch.tensor([0], dtype=torch.int32)
    logits = torch.zeros(1, vocab)
    logits[0, list(eos)] = 50.0  # the model wants to stop at once: the grammar says not yet
    out = sample_ref(logits, slots, torch.zeros(1, dtype=torch.int64), state, 0)
    assert int(out.token_ids[0]) not in eos


def test_arena_partitions_and_sharing(demo_compiler, demo_vocab):
    _, _, vocab = demo_vocab
    state = SamplingState(4, vocab, "cpu", grammar_arena_bytes=8 << 20)
    arena = GrammarArena(state)
    tables = demo_compiler.compile(REGEX)
    a = arena.acquire(REGEX, tables)
    assert arena.acquire(REGEX, tables) is a  # shared, not loaded twice
    for i in range(state.grammar_slots - 1):
        arena.acquire(Constraint("regex", f"x{i}"), demo_compiler.compile(Constraint("regex", f"x{i}")))
    try:
        arena.acquire(CHOICE, demo_compiler.compile(CHOICE))
        raise AssertionError("a full arena must refuse")
    except ArenaFull:
        pass
    arena.release(REGEX)
    arena.release(REGEX)
    assert arena.acquire(CHOICE, demo_compiler.compile(CHOICE)).gid == a.gid


def test_constrained_rows_without_the_search(demo_compiler, demo_vocab):
    """The engines' searchless graphs (sample's search=False) take constrained rows that have no filter: the
    penalties kernel still masks by the grammar and the finish advances the DFA, as the reference does."""
    _, _, vocab = demo_vocab
    states = [constrained_state(demo_compiler, vocab) for _ in range(2)]
    for state, arena in states:  # slot 4: sampled (temperature, no filter) under the choice grammar
        state.set_slot(4, SamplingParams(temperature=0.8), seed=5, prompt_ids=[1],
                       grammar=arena.slot_grammar(CHOICE, []))
    (ref_state, _), (tri_state, _) = states
    slots = torch.tensor([0, 3, 4, -1], dtype=torch.int32)
    assert not any(PARAMS[s][0].needs_search for s in (0, 3))
    gen = torch.Generator().manual_seed(9)
    for step in range(6):
        logits = torch.randn(len(slots), vocab, generator=gen) * 4
        positions = torch.full((len(slots),), 30 + step, dtype=torch.int64)
        ref = sample_ref(logits, slots, positions, ref_state, 2)
        advance_grammar_ref(slots, ref.token_ids, ref_state)
        tri = sample_triton(logits, slots, positions, tri_state, 2, record=True, search=False)
        assert torch.equal(ref.token_ids, tri.token_ids), step
        assert torch.equal(ref_state.grammar_state, tri_state.grammar_state), step
