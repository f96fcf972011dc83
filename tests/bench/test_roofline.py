"""The roofline floor: dense models count every weight; a mixture of experts only the experts a step's
tokens are expected to touch (plus attention, routers and dense weights)."""
from __future__ import annotations

import pytest

from blink.bench.roofline import COPY_BW, GEMM_RATE, ModelShape
from blink.model import presets
from blink.model.llama import LlamaForCausalLM


def _matmul_params_of(name: str) -> tuple[int, int]:
    """(every parameter a token multiplies through if all experts counted, one expert's parameters)."""
    cfg = presets.get(name)
    model = LlamaForCausalLM(cfg, "meta", cfg.dtype, max_positions=16)
    total = sum(p.numel() for n, p in model.named_parameters() if "norm" not in n and "embed_tokens" not in n)
    return total, 3 * cfg.hidden_size * cfg.moe_intermediate_size


@pytest.mark.parametrize("name", ["llama3-8b", "phi-4"])
def test_dense_floor_reads_every_weight(name):
    shape = ModelShape.of(presets.get(name))
    total, _ = _matmul_params_of(name)
    assert shape.matmul_params == total and shape.touched_experts(64) == 0
    assert shape.decode_floor_s(1, 0) == pytest.approx(total * 2 / COPY_BW)


def test_moe_floor_reads_the_touched_experts():
    cfg = presets.get("qwen3-30b-a3b")
    shape = ModelShape.of(cfg)
    total, per_expert = _matmul_params_of("qwen3-30b-a3b")
    assert shape.moe_layers == 48 and shape.matmul_params + 48 * 128 * per_expert == total
    assert shape.touched_experts(1) == pytest.approx(8)  # one token reads its 8 experts per layer
    assert 8 < shape.touched_experts(8) < 64 < shape.touched_experts(128) < 128
    one = shape.decode_floor_s(1, 0) * COPY_BW / 2
    assert one == pytest.approx(shape.matmul_params + 48 * 8 * per_expert)  # ~3.3B active parameters
    assert 3.0e9 < one < 3.6e9
    floors = [shape.decode_floor_s(b, 1024) for b in (1, 8, 32, 128)]
    assert floors == sorted(floors)
    assert shape.decode_floor_s(128, 0) < total * 2 / COPY_BW  # nearly, not quite, every expert


def test_prefill_floor_counts_gemms_on_every_token_and_causal_attention():
    shape = ModelShape.of(presets.get("llama3-8b"))
    gemm, attention = shape.prefill_flops(30_000)
    lm_head = shape.hidden * shape.vocab
    assert gemm == 2.0 * (shape.matmul_params - lm_head) * 30_000 + 2.0 * lm_head  # the LM head: last token only
    assert attention == 4.0 * (30_000 * 30_001 // 2) * 32 * 128 * 32
    # The figures for a 30k-token prompt: ~0.6 s of GEMMs and ~0.3 s of attention at 790 TFLOP/s.
    assert 0.5 < gemm / GEMM_RATE < 0.6 and 0.28 < attention / GEMM_RATE < 0.32
    assert shape.prefill_floor_s(30_000) == pytest.approx((gemm + attention) / GEMM_RATE)
    assert shape.prefill_floor_s(1) == pytest.approx(shape.matmul_params * 2 / COPY_BW)  # one token: the weights


def test_a_chunk_after_a_cached_context_adds_its_queries_against_the_context():
    shape = ModelShape.of(presets.get("llama3-8b"))
    gemm0, attention0 = shape.prefill_flops(100)
    gemm, attention = shape.prefill_flops(100, context=2000)
    assert gemm == gemm0  # the cached tokens cost no GEMM
    per_pair = 4.0 * shape.heads * shape.head_dim * shape.layers
    assert attention - attention0 == pytest.approx(100 * 2000 * per_pair)
    assert shape.prefill_floor_s(100, 2000) >= shape.prefill_floor_s(100)


def test_prefill_specs_parse_whole_prompts_and_chunks_after_a_context():
    from blink.bench.step import parse_prefill

    assert parse_prefill("2048,100@2000") == [(2048, 0), (100, 2000)]
    assert parse_prefill("") == []
    with pytest.raises(ValueError, match="--prefill-tokens"):
        parse_prefill("0@5")
