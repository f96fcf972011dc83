"""Which linears of a model take the decode GEMV (blink/kernels/gemv.py), decided once, at load time.

The choice is per projection and shape, never per step: each dense layer's qkv_proj, o_proj, gate_up_proj,
down_proj and the LM head either hold a GemvPlan (calls with at most max_m rows run the GEMV, with the
norm in its prologue and the SiLU-mul in down's prologue at one row, in gate|up's epilogue above) or None
(cuBLAS, as before). Calls with more rows (prefill, large decode batches) always go to cuBLAS, so a bucket's
graph is the same at every capture.

BLINK_GEMV names the projections ("qkv,o,gate_up,down,lm_head", "all", or "": none); BLINK_GEMV_MAX_M caps
the rows, for all of them ("8") or with exceptions ("1,o:16,lm_head:16"). Unset, a one-rank model takes "all"
up to 16 rows (DEFAULT_MAX_M). On the H200 with llama3-8b: at one row it cut the batch-1 step 4.4% with PDL
(perf.md, 2026-12-02); at 2-16 rows the tensor-core kernel with the one-pass norm and the SiLU-mul epilogue
(gemv_rows.py) cut the step at batch 8 / 16 by 2.3% / 4.9% (4.979 -> 4.866, 5.500 -> 5.229 ms; perf.md, session
17); at 32 rows it lost 5.6%. A sharded model (tensor parallel) defaults to none: the TP suite has not run with
the GEMV on two GPUs. MoE blocks keep their own kernels. RoPE and the KV write run in qkv's GEMV (one row: gemv.py's
loop; more: gemv_rows'; models without a per-head q/k norm) unless BLINK_QKV_ROPE=0: on the H200 (perf.md, session 28)
llama3-8b's step went 4.148 -> 4.082 ms at batch 1 and 4.736 -> 4.697 at batch 8 (medians of 3 interleaved rounds).
A MoE block's experts run as two weight streams (kernels/moe_gemv.py) instead of the sort and the grouped GEMMs in
steps of one row (its top_k pairs; BLINK_MOE_GEMV unset or "row"; a sharded model defaults to 0, as for the GEMV), in
steps of up to N (token, expert) pairs with BLINK_MOE_GEMV=N (N <= 64), or never (0). At one row it folds the
post-attention norm into the block too (kernels/moe.py's normed_block_triton) unless BLINK_MOE_NORMED=0. On an
H100 (perf.md, session 33) qwen3-30b-a3b's step went 4.610 -> 3.854 ms at batch 1 with both; at 8 rows (64 pairs)
it lost (12.101 -> 12.501), and the block alone tied at 2 rows (1.03x) and lost at 8 (0.97x), so the default stops
at one row.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from torch import nn

from blink.kernels.gemv import MAX_M, GemvPlan
from blink.kernels.moe_gemv import MAX_PAIRS
from blink.model.moe import SparseMoeBlock

PROJECTIONS = ("qkv", "o", "gate_up", "down", "lm_head")
DEFAULT_MAX_M = "16"


@dataclass(frozen=True)
class FusionPolicy:
    gemv: frozenset[str] = frozenset()  # projections that take the GEMV
    max_m: int = MAX_M  # rows a call may have to take it
    role_max_m: tuple[tuple[str, int], ...] = ()  # (projection, rows) exceptions to max_m
    rope_in_qkv: bool = False  # qkv's GEMV runs RoPE and the KV write in its epilogue (gemv_rope.py)
    moe_gemv_pairs: int | None = 0  # MoE experts as weight streams in steps of up to this many pairs
    # (moe_gemv.py); None: steps of one row (the block's top_k, policy_from_env's default); 0: never
    moe_normed: bool = True  # with them, at one row, the post-attention norm folded into the block (moe.py)

    def rows_for(self, role: str) -> int:
        return dict(self.role_max_m).get(role, self.max_m)

    @staticmethod
    def parse(names: str, max_m: int | str = MAX_M) -> FusionPolicy:
        """names: 'all', '' or a comma list of PROJECTIONS; max_m: rows, or 'rows,role:rows,...'. ValueError names
        what is wrong."""
        chosen = set(PROJECTIONS) if names.strip() == "all" else {n.strip() for n in names.split(",") if n.strip()}
        unknown = chosen - set(PROJECTIONS)
        if unknown:
            raise ValueError(f"BLINK_GEMV: unknown projection(s) {sorted(unknown)}; choose from {PROJECTIONS}")
        default, *exceptions = str(max_m).split(",")
        try:
            rows = int(default)
            role_rows = tuple((role.strip(), int(r)) for role, r in (e.split(":") for e in exceptions))
        except ValueError:
            raise ValueError(f"BLINK_GEMV_MAX_M must be ROWS or ROWS,projection:ROWS,..., got {max_m!r}") from None
        for role, r in (("", rows), *role_rows):
            if role and role not in PROJECTIONS:
                raise ValueError(f"BLINK_GEMV_MAX_M: unknown projection {role!r}; choose from {PROJECTIONS}")
            if not 1 <= r <= MAX_M:
                raise ValueError(f"BLINK_GEMV_MAX_M must be in [1, {MAX_M}], got {r}")
        return FusionPolicy(frozenset(chosen), rows, role_rows)


def policy_from_env(tp_size: int = 1) -> FusionPolicy:
    """BLINK_GEMV, BLINK_GEMV_MAX_M, BLINK_QKV_ROPE (on unless 0), BLINK_MOE_GEMV ("row" unless N) and
    BLINK_MOE_NORMED (on unless 0)."""
    default = ("all", DEFAULT_MAX_M) if tp_size == 1 else ("", MAX_M)
    policy = FusionPolicy.parse(os.environ.get("BLINK_GEMV", default[0]),
                                os.environ.get("BLINK_GEMV_MAX_M", default[1]))
    rope = os.environ.get("BLINK_QKV_ROPE", "1")
    if rope not in ("0", "1"):
        raise ValueError(f"BLINK_QKV_ROPE must be 0 or 1, got {rope!r}")
    pairs = os.environ.get("BLINK_MOE_GEMV", "row" if tp_size == 1 else "0")  # sharded: as the GEMV, untried
    if pairs != "row" and (not pairs.isdigit() or int(pairs) > MAX_PAIRS):
        raise ValueError(f"BLINK_MOE_GEMV must be 'row' or a pair count in [0, {MAX_PAIRS}], got {pairs!r}")
    normed = os.environ.get("BLINK_MOE_NORMED", "1")
    if normed not in ("0", "1"):
        raise ValueError(f"BLINK_MOE_NORMED must be 0 or 1, got {normed!r}")
    return dataclasses.replace(policy, rope_in_qkv=rope == "1", moe_gemv_pairs=None if pairs == "row" else int(pairs),
                               moe_normed=normed == "1")


def apply_fusion_policy(model: nn.Module, policy: FusionPolicy) -> dict[str, int]:
    """Set every projection's GemvPlan from the policy (shapes only); returns how many took it, per role.
    The model names its projections (LlamaForCausalLM.gemv_projections)."""
    taken = dict.fromkeys(PROJECTIONS, 0)
    for role, module in model.gemv_projections():
        weight = module.weight
        ok = role in policy.gemv and weight.dim() == 2 and weight.shape[1] % 8 == 0
        rope = policy.rope_in_qkv and role == "qkv"
        module.gemv = GemvPlan(None, policy.rows_for(role), rope) if ok else None  # tiles: default_config per call
        taken[role] += ok
    for module in model.modules():
        if isinstance(module, SparseMoeBlock):
            pairs = module.top_k if policy.moe_gemv_pairs is None else policy.moe_gemv_pairs
            module.experts.gemv_pairs, module.experts.normed_block = pairs, policy.moe_normed
    return taken
