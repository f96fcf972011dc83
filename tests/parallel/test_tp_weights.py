"""Sharded weight loading: each rank reads only its slice of every split tensor, and its shard equals
the matching slice of the one-rank model's weights."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from blink.model.config import ModelConfig
from blink.model.llama import LlamaForCausalLM
from blink.model.weights import checkpoint_files, load_hf_tensors, load_model, read_safetensors_slices
from tests.hf_models import make_tiny_model


@dataclass
class RankOnly:
    """Enough of a TPGroup to build and load a shard (loading runs no collective)."""

    rank: int
    size: int


class RecordingSlice:
    """A safetensors slice that counts the elements read through it (and offers nothing else)."""

    def __init__(self, inner, reads: dict, name: str):
        self.inner, self.reads, self.name = inner, reads, name

    def get_shape(self):
        return self.inner.get_shape()

    def __getitem__(self, index):
        out = self.inner[index]
        self.reads[self.name] = self.reads.get(self.name, 0) + out.numel()
        return out


@pytest.mark.parametrize("rank", [0, 1])
def test_rank_reads_only_its_slices(tmp_path, rank):
    path = make_tiny_model(tmp_path, "qwen2", num_key_value_heads=1)
    cfg = ModelConfig.from_dir(path)
    full, _ = load_model(path, "cpu", torch.float32)
    shard = LlamaForCausalLM(cfg, "cpu", torch.float32, RankOnly(rank, 2))
    reads, sizes = {}, {}

    def recorded():
        for name, sl in read_safetensors_slices(checkpoint_files(path)):
            sizes[name] = torch.Size(sl.get_shape()).numel()
            yield name, RecordingSlice(sl, reads, name)

    load_hf_tensors(shard, recorded())
    split = [n for n in reads if any(k in n for k in ("q_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                                                       "embed_tokens", "lm_head"))]
    assert len(split) == 2 + 6 * cfg.num_hidden_layers  # embed, lm_head; q (+ bias), o, gate, up, down
    assert all(reads[name] == sizes[name] // 2 for name in split)
    # One KV head, two ranks: both read the whole (single-head) k and v.
    assert all(reads[n] == sizes[n] for n in reads if "k_proj" in n or "v_proj" in n)

    layer, ref = shard.model.layers[0], full.model.layers[0]
    h = cfg.q_size // 2
    q_rows = slice(rank * h, (rank + 1) * h)
    torch.testing.assert_close(layer.self_attn.qkv_proj.weight[:h], ref.self_attn.qkv_proj.weight[q_rows])
    torch.testing.assert_close(layer.self_attn.qkv_proj.bias[:h], ref.self_attn.qkv_proj.bias[q_rows])
    cols = slice(rank * h, (rank + 1) * h)
    torch.testing.assert_close(layer.self_attn.o_proj.weight, ref.self_attn.o_proj.weight[:, cols])
    v = cfg.vocab_size // 2
    torch.testing.assert_close(shard.lm_head.weight, full.lm_head.weight[rank * v:(rank + 1) * v])


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2"])
def test_preset_shards_are_slices_of_the_one_rank_random_model(preset):
    full, cfg = load_model(preset, "cpu", seed=7)
    for rank in (0, 1):
        shard, _ = load_model(preset, "cpu", seed=7, tp=RankOnly(rank, 2))
        attn, ref = shard.model.layers[1].self_attn, full.model.layers[1].self_attn
        q, kv = cfg.q_size // 2, cfg.kv_size // 2
        torch.testing.assert_close(attn.qkv_proj.weight[:q], ref.qkv_proj.weight[rank * q:(rank + 1) * q])
        k_start = cfg.q_size + rank * kv
        torch.testing.assert_close(attn.qkv_proj.weight[q:q + kv], ref.qkv_proj.weight[k_start:k_start + kv])
        torch.testing.assert_close(shard.model.layers[1].mlp.down_proj.weight,
                                   full.model.layers[1].mlp.down_proj.weight[:, rank * 64:(rank + 1) * 64])
        v = cfg.vocab_size // 2
        torch.testing.assert_close(shard.lm_head.weight, full.lm_head.weight[rank * v:(rank + 1) * v])
        torch.testing.assert_close(shard.model.norm.weight, full.model.norm.weight)
