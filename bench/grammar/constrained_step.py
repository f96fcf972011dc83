"""Decode-step time with every row constrained vs none (GPU): what the grammar costs inside the graph.

    python -m bench.grammar.constrained_step [--preset llama3-8b] [--batches 1,8,32] [--context 1024]

Same set-up as `blink bench step` (random weights of the preset's shapes, bf16, one CUDA graph per
bucket, median of --iters replays). The constrained run loads a typical schema (bench_compile's
"person") compiled over a synthetic vocabulary of the preset's size (random 1-6 byte pieces over
JSON's characters: the class tables then have a realistic width) and points every row's slot at it.
The mask reads each row's class row and one cell per token whatever the state, so the time does not
depend on where the automaton is.
"""
from __future__ import annotations

import argparse
import json

import numpy as np

from blink.bench.step import decode_plan, graph_replay_ms
from blink.config import EngineArgs


def synthetic_compiler(vocab: int, eos: int, max_states: int, max_cells: int):
    from blink.grammar.compiler import GrammarCompiler

    rng = np.random.default_rng(0)
    alphabet = list(b'{}[]":, abcdefghijklmnopqrstuvwxyz0123456789-.')
    pieces: list[bytes | None] = [bytes([b]) for b in range(256)]
    while len(pieces) < vocab:
        pieces.append(bytes(rng.choice(alphabet, rng.integers(1, 7)).tolist()))
    pieces[eos] = None
    return GrammarCompiler(pieces, (eos,), max_states=max_states, max_cells=max_cells)


def time_graph(graph, iters: int) -> float:
    if graph is None:  # --device cpu: a dry run of the set-up (eager, wall clock)
        return 0.0
    return graph_replay_ms(graph, iters)


def main() -> int:
    from bench.grammar.compile_libraries import SCHEMAS
    from blink.core.loaded_model import LoadedModel
    from blink.core.runner import ModelRunner
    from blink.grammar.arena import GrammarArena
    from blink.request import Constraint, SamplingParams

    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="llama3-8b")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--num-layers", type=int, default=None)
    ap.add_argument("--result-json", default=None)
    ap.add_argument("--device", default="cuda", help="cpu: check the set-up without timing (no graphs)")
    ns = ap.parse_args()
    cuda = ns.device == "cuda"
    batches = [int(b) for b in ns.batches.split(",")]
    max_b = max(batches)
    args = EngineArgs(model=ns.preset, dtype="bfloat16" if cuda else "float32", device=ns.device, max_num_seqs=max_b,
                      max_num_batched_tokens=max_b, num_kv_blocks=max_b * (-(-(ns.context + 1) // 16)),
                      max_model_len=ns.context + 16)
    m = LoadedModel.load(args, num_layers=ns.num_layers)
    runner = ModelRunner.for_model(m, use_graphs=cuda)
    state = m.sampling_state
    compiler = synthetic_compiler(m.vocab_size, m.eos_token_ids[0], state.grammar_states_per_slot,
                                  state.grammar_cells_per_slot)
    c = Constraint("json_schema", json.dumps(SCHEMAS["person"]))
    tables = compiler.compile(c)
    arena = GrammarArena(state)
    arena.acquire(c, tables)
    rows = []
    for b in batches:
        plan = decode_plan(None, b, ns.context, 16)
        bucket = runner.bucket_for(b, b)
        runner.prepare(plan, runner.buffers, bucket)
        ms = {}
        for constrained in (False, True):
            for slot in range(b):
                grammar = arena.slot_grammar(c, []) if constrained else None
                state.set_slot(slot, SamplingParams(temperature=1.0, top_p=0.95, max_tokens=8), seed=slot,
                               prompt_ids=[1], grammar=grammar)
            if not cuda:
                runner.run(bucket)  # eager: the constrained rows' tokens must obey the grammar
                ids = runner.buffers.sampled_ids[:b].tolist()
                assert not constrained or all(tables.allowed(0)[t] for t in ids), ids
            ms[constrained] = time_graph(runner.graphs.get(bucket), ns.iters)
        row = {"preset": ns.preset, "batch": b, "unconstrained_ms": round(ms[False], 4),
               "constrained_ms": round(ms[True], 4), "ratio": round(ms[True] / max(ms[False], 1e-9), 4),
               "states": tables.num_states, "classes": tables.num_classes}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if ns.result_json:
        with open(ns.result_json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
