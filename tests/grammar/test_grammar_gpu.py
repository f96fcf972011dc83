"""Constrained sampling on the GPU: Triton equals the CPU reference on a real-size vocabulary, and the
host engine with CUDA graphs produces valid, seed-reproducible outputs (equal to its eager path)."""
import json

import jsonschema
import numpy as np
import pytest
import torch

from blink.grammar.arena import GrammarArena
from blink.grammar.compiler import GrammarCompiler
from blink.kernels.sampling import sample, sample_ref
from blink.kernels.sampling_grammar_advance import advance_grammar, advance_grammar_ref
from blink.kernels.sampling_state import SamplingState
from blink.request import Constraint, SamplingParams
from tests.grammar.test_host_structured import SCHEMAS, engine, run, strict_json, text_of

pytestmark = pytest.mark.gpu
VOCAB = 128256


def synthetic_compiler() -> GrammarCompiler:
    """A 128k vocabulary of random 1-6 byte pieces over JSON's characters (every byte also alone)."""
    rng = np.random.default_rng(0)
    alphabet = list(b'{}[]":, abcdefghijklmnopqrstuvwxyz0123456789-.')
    pieces = [bytes([b]) for b in range(256)]
    while len(pieces) < VOCAB - 2:
        pieces.append(bytes(rng.choice(alphabet, rng.integers(1, 7)).tolist()))
    return GrammarCompiler(pieces + [None, None], (VOCAB - 1,), max_states=1 << 14, max_cells=1 << 22)


def test_triton_equals_reference_on_a_real_vocab():
    compiler = synthetic_compiler()
    constraints = [Constraint("json_schema", json.dumps(s)) for s in SCHEMAS] + [Constraint("regex", "[a-z]{3,9}")]
    states = {}
    for device in ("cpu", "cuda"):
        state = SamplingState(9, VOCAB, device, grammar_arena_bytes=256 << 20)
        arena = GrammarArena(state)
        for slot in range(8):
            c = constraints[slot % len(constraints)]
            arena.acquire(c, compiler.compile(c))
            params = SamplingParams(temperature=[0.0, 0.8, 1.0, 1.3][slot % 4], top_k=[0, 50][slot % 2],
                                    top_p=[1.0, 0.9][slot // 4], repetition_penalty=[1.0, 1.2][slot % 2])
            state.set_slot(slot, params, seed=slot, prompt_ids=[1, 2, 3], grammar=arena.slot_grammar(c, []))
        states[device] = state
    slots = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, -1], dtype=torch.int32)
    gen = torch.Generator().manual_seed(0)
    for step in range(12):
        logits = (torch.randn(len(slots), VOCAB, generator=gen) * 3).bfloat16().float()
        positions = torch.full((len(slots),), step, dtype=torch.int64)
        ref = sample_ref(logits, slots, positions, states["cpu"], 20)
        got = sample(logits.cuda(), slots.cuda(), positions.cuda(), states["cuda"], 20)
        assert got.token_ids.cpu().tolist() == ref.token_ids.tolist(), step
        advance_grammar_ref(slots, ref.token_ids, states["cpu"])
        advance_grammar(slots.cuda(), got.token_ids, states["cuda"])
        assert torch.equal(states["cuda"].grammar_state.cpu(), states["cpu"].grammar_state)


def test_engine_on_gpu_outputs_validate():
    from tokenizers import Tokenizer

    from blink.model.demo import ensure_default_model

    demo = Tokenizer.from_file(str(ensure_default_model() / "tokenizer.json"))
    outputs = {}
    for enforce_eager in (False, True):
        eng = engine(device="cuda", enforce_eager=enforce_eager, num_kv_blocks=128)
        assert bool(eng.runner.graphs) != enforce_eager
        requests = {10 * i + j: ([5, 6, 7], SamplingParams(temperature=1.0, seed=10 * i + j, max_tokens=150,
                                                          constraint=Constraint("json_schema", json.dumps(s))))
                    for i, s in enumerate(SCHEMAS) for j in range(4)}
        tokens, reasons = run(eng, requests)
        for rid, ids in tokens.items():
            assert reasons[rid].name == "STOP"
            jsonschema.validate(strict_json(text_of(demo, eng, ids)), SCHEMAS[rid // 10])
        outputs[enforce_eager] = tokens
    assert outputs[False] == outputs[True]  # seeded: graphs and eager give the same tokens
