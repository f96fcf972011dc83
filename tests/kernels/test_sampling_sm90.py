"""The sampler's kernels compiled for sm_90 on this CPU machine (the interpreter forgives what the compiler refuses),
each with the old and new ways of issue 17's levers and, where it takes PDL, with and without it."""
import pytest

from tests.kernels.sm90 import run_uninterpreted

HOPPER_COMPILE = """
import inspect
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from blink.kernels import (
    sampling_bucket,
    sampling_choose,
    sampling_compact,
    sampling_grammar_advance,
    sampling_penalties,
)
from blink.kernels import sampling_reject, sampling_resolve, sampling_select

V = 128256
ints = {"slots_ptr": "*i32", "flags_ptr": "*i32", "top_k_ptr": "*i32", "counts_ptr": "*i32", "prompt_mask_ptr": "*u8",
        "bias_ids_ptr": "*i32", "positions_ptr": "*i64", "seed_ptr": "*i64", "part_token_ptr": "*i32",
        "part_smallest_ptr": "*i32", "part_largest_ptr": "*i32", "num_logprobs_ptr": "*i32", "token_ptr": "*i64",
        "top_ids_ptr": "*i64", "gstate_ptr": "*i32", "gid_ptr": "*i32", "classes_ptr": "*i32", "row_base_ptr": "*i32",
        "cells_ptr": "*i32", "state_ptr": "*i32", "tokens_ptr": "*i64", "key_max_ptr": "*i32", "kept_min_ptr": "*i32",
        "part_total_ptr": "*i64", "hist_ptr": "*i32", "sums_ptr": "*i64", "counter_ptr": "*i32", "cand_ptr": "*i32",
        "fell_back_ptr": "*i32", "plan_ptr": "*i64", "race_count_ptr": "*i32", "race_ids_ptr": "*i32",
        "chunk_hist_ptr": "*i32",
        "top_keys_ptr": "*i32", "cand_key_ptr": "*i32", "cand_id_ptr": "*i32", "reject_ptr": "*i64",
        "part_weight_ptr": "*i64", "part_count_ptr": "*i32", "launch": "i32", "first_token_ptr": "*i32",
        "floor_keys_ptr": "*i32", "pool_ptr": "*i64", "num_rows": "i32", "words_ptr": "*i32", "pool_words_ptr": "*i32"}
NB = sampling_bucket.NUM_BUCKETS
rows = dict(vocab_size=V, NB=NB, P=63, P_PAD=64)
levels = dict(rows, LOG2_NB=NB.bit_length() - 1)
kernels = [
    (sampling_penalties._penalties_kernel, dict(vocab_size=V, NUM_BIAS=300, BIAS_BLOCK=512, PENALIZE=1, NB=2 * NB, P=63,
                                                ZERO=triton.next_power_of_2(-(-2 * NB // 63)), K=20, CHUNK=2048,
                                                BLOCK=1024, KEY_BYTES=12), 4),
    (sampling_bucket._bucket_kernel, dict(rows, CHUNK=2048, BLOCK=1024), 4),
    (sampling_bucket._refine_kernel, dict(levels, CHUNK=2048, BLOCK=1024), 4),
    (sampling_compact._compact_kernel, dict(rows, CAND=4096, K=20, CHUNK=2048, BLOCK=1024), 8),
    (sampling_resolve._resolve_kernel, dict(vocab_size=V, P=63, P_PAD=64, CAND=4096, SMALL=256, BLOCK=4096), 16),
    (sampling_select.keep_threshold_kernel, dict(vocab_size=V, BLOCK=4096), 16),
    (sampling_choose._choose_kernel, dict(vocab_size=V, NUM_CHUNKS=63, KEY_BYTES=12, CHUNK=2048, BLOCK=1024), 4),
    (sampling_choose._finish_kernel, dict(vocab_size=V, NUM_CHUNKS=63, CHUNKS_PAD=64, K=20, K_PAD=32, CAND=4096,
                                   SMALL=256, BLOCK=4096), 16),
    (sampling_grammar_advance._advance_kernel, dict(vocab_size=V, ROWS=64, BLOCK=64), 1),
    (sampling_reject._reject_round_kernel, dict(vocab_size=V, P=63, P_PAD=64, KEY_BYTES=12, RACE=16384, CHUNK=2048,
                                                BLOCK=1024, SLACK=sampling_reject.BOUND_SLACK), 4),
]
# the old and new ways of issue 17's levers: the row or list race (RACE, sampling_race), the compaction's two reads
# or one (ONCE, sampling_compact; CHUNK_HIST: the histograms it reads), the rejection before the search (REJECT; TOP_K:
# its top_k rows; FIRST: its first round, which takes the penalties kernel's race; TEST_FIRST: a first round that
# only tests; ROUNDS: the rounds in one launch, sampling_reject_sync; FLOOR: top_k rows by the lane floor,
# sampling_floor; RECORD / GRAMMAR: the finish kernel's updates after the choice; POOL: the pool rounds' words
# zeroed, sampling_reject_pool; SEARCHED: the choice after a search or without one, sample_triton's `search`)
levers = {"RACE": (0, 16384), "ONCE": (False, True), "CHUNK_HIST": (False, True), "REJECT": (False, True),
          "TOP_K": (False, True), "FIRST": (False, True), "TEST_FIRST": (False, True), "ROUNDS": (1, 3),
          "FLOOR": (False, True), "RECORD": (False, True), "SEARCHED": (True, False),
          "GRAMMAR": (False, True), "POOL": (False, True)}
for kernel, constants, warps in list(kernels):
    names = inspect.signature(kernel.fn).parameters
    old, new = ({n: v[i] for n, v in levers.items() if n in names} for i in (0, 1))
    if new:
        constants.update(old, **({"RACE_BLOCK": 512} if "RACE_BLOCK" in names else {}))
        kernels.append((kernel, {**constants, **new}, warps))
        if "ONCE" in names:  # one lever without the other
            kernels += [(kernel, {**constants, "ONCE": True}, warps), (kernel, {**constants, "RACE": 16384}, warps)]
# the rejection's later rounds over the launch's pool (sampling_reject_pool): after the first round in one launch,
# and in a launch of their own
pool = dict(vocab_size=V, P=16, KEY_BYTES=12, RACE=16384, U=63, UNIT=2048, UNIT_BLOCK=1024)
kernels += [(sampling_reject._reject_round_kernel, dict(pool, P_PAD=16, CHUNK=8192, BLOCK=1024, FIRST=True,
                                                        TOP_K=False, SLACK=sampling_reject.BOUND_SLACK,
                                                        TEST_FIRST=False, ROUNDS=1, POOL_ROUNDS=3, IN_ORDER=True,
                                                        HELPERS=256), 4),
            (sampling_reject._reject_pool_kernel, dict(pool, ROUNDS=3, WAIT=True), 4)]
assert len(kernels) == 22, len(kernels)
for kernel, constants, warps in kernels:
    names = list(inspect.signature(kernel.fn).parameters)
    # a constexpr left out takes its default (else it would compile as a runtime pointer)
    constants = {**{p.name: p.default for p in kernel.params if p.is_constexpr and p.has_default}, **constants}
    # the sampler's seven kernels also build with PDL (BLINK_SAMPLER_PDL): that variant must wait (kernels/pdl.py)
    for pdl in (False, True) if "USE_PDL" in names else (None,):
        given = constants if pdl is None else {**constants, "USE_PDL": pdl}
        signature = {n: "constexpr" if n in given else ints.get(n, "*fp32") for n in names}
        constexprs = {(names.index(n),): v for n, v in given.items()}
        options = {"enable_fp_fusion": False, "num_warps": warps, **({} if pdl is None else {"launch_pdl": pdl})}
        if kernel is sampling_compact._compact_kernel and (given["RACE"] or given["ONCE"]):
            options["maxnreg"] = 64  # as sampling.py launches the compaction's new ways
        if given.get("ROUNDS", 1) > 1 or given.get("IN_ORDER"):
            options["maxnreg"] = 128  # as sampling_reject launches the rounds in one launch
        built = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                               target=GPUTarget("cuda", 90, 32), options=options)
        if pdl is not None:
            assert ("griddepcontrol.wait" in built.asm["ptx"]) == pdl, (kernel.fn.__name__, pdl)
print("pdl variants:", sum("USE_PDL" in inspect.signature(k.fn).parameters for k, _, _ in kernels))
"""


@pytest.mark.slow  # a subprocess compiles every kernel
def test_kernels_compile_for_hopper():
    """The interpreter forgives what the compiler refuses: build every kernel for sm_90 (no GPU needed)."""
    run_uninterpreted(["-c", HOPPER_COMPILE], timeout=600)
