"""Model test helpers: a minimal paged-KV driver and the comparison of its logits with transformers'.

PagedDriver feeds chunks of several sequences through one forward step.
Blocks are handed out in a shuffled order so that no sequence's KV is contiguous, and each step can be
padded with extra tokens (slot -1) and empty sequences, as captured-graph buckets are.
"""
from __future__ import annotations

import copy
import random

import torch

from blink.model.attention_metadata import AttentionMetadata
from blink.model.weights import load_model
from tests.hf_models import load_hf_model


class PagedDriver:
    def __init__(self, model, num_blocks: int = 64, block_size: int = 4, seed: int = 0):
        cfg = model.config
        dtype, device = model.model.embed_tokens.weight.dtype, model.model.embed_tokens.weight.device
        shape = (num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
        self.kv_caches = [
            (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(cfg.num_hidden_layers)
        ]
        self.model, self.device, self.block_size = model, device, block_size
        self.free_blocks = list(range(num_blocks))
        random.Random(seed).shuffle(self.free_blocks)
        self.blocks: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}

    def _slot(self, seq: int, position: int) -> int:
        while len(self.blocks.setdefault(seq, [])) <= position // self.block_size:
            self.blocks[seq].append(self.free_blocks.pop())
        return self.blocks[seq][position // self.block_size] * self.block_size + position % self.block_size

    @torch.inference_mode()
    def step(self, chunks: dict[int, list[int]], pad_tokens: int = 0, pad_seqs: int = 0):
        """Run one forward over `chunks` (seq id -> new token ids); returns seq id -> logits [len, vocab]."""
        input_ids, positions, slots, query_start_loc, seq_lens = [], [], [], [0], []
        for seq, tokens in chunks.items():
            start = self.lengths.get(seq, 0)
            for i, token in enumerate(tokens):
                input_ids.append(token)
                positions.append(start + i)
                slots.append(self._slot(seq, start + i))
            self.lengths[seq] = start + len(tokens)
            query_start_loc.append(query_start_loc[-1] + len(tokens))
            seq_lens.append(self.lengths[seq])
        num_real = len(input_ids)
        input_ids += [0] * pad_tokens
        positions += [0] * pad_tokens
        slots += [-1] * pad_tokens
        query_start_loc += [query_start_loc[-1]] * pad_seqs
        seq_lens += [0] * pad_seqs
        max_blocks = max(len(b) for b in self.blocks.values()) + 1
        tables = [self.blocks[seq] + [0] * (max_blocks - len(self.blocks[seq])) for seq in chunks]
        tables += [[0] * max_blocks] * pad_seqs

        def tensor(values, dtype):
            return torch.tensor(values, dtype=dtype, device=self.device)

        attn = AttentionMetadata(
            slot_mapping=tensor(slots, torch.int64),
            query_start_loc=tensor(query_start_loc, torch.int32),
            seq_lens=tensor(seq_lens, torch.int32),
            block_tables=tensor(tables, torch.int32),
        )
        ids, pos = tensor(input_ids, torch.int64), tensor(positions, torch.int64)
        hidden = self.model(ids, pos, attn, self.kv_caches)
        logits = self.model.compute_logits(hidden[:num_real])
        assert logits.dtype == torch.float32 and logits.shape == (num_real, self.model.config.vocab_size)
        return dict(zip(chunks, logits.split([len(t) for t in chunks.values()]), strict=True))


def run_mixed_schedule(model, prompts: list[list[int]], vocab_size: int, seed: int = 0, block_size: int = 4):
    """Prefill all prompts in one padded step, then a mixed step (one sequence continues with a 3-token
    chunk, the others decode), then two plain decode steps. Returns each sequence's full token list and
    the logits blink produced for every position of it."""
    rng = random.Random(seed)
    blocks_needed = sum(len(p) + 5 for p in prompts) // block_size + len(prompts) + 1
    driver = PagedDriver(model, num_blocks=blocks_needed + 8, block_size=block_size, seed=seed)
    tokens = {s: list(p) for s, p in enumerate(prompts)}
    logits = {s: [out] for s, out in driver.step(tokens, pad_tokens=3, pad_seqs=1).items()}
    for step in range(3):
        chunks = {s: [rng.randrange(vocab_size) for _ in range(3 if step == 0 and s == 1 else 1)]
                  for s in tokens}
        for s, out in driver.step(chunks, pad_tokens=1 if step == 1 else 0).items():
            tokens[s] += chunks[s]
            logits[s].append(out)
    return tokens, {s: torch.cat(parts) for s, parts in logits.items()}


def assert_logits_match(ours: torch.Tensor, ref: torch.Tensor, rtol: float) -> None:
    torch.testing.assert_close(ours, ref, rtol=rtol, atol=rtol * ref.abs().max().item())


def _relative_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours - ref).norm() / ref.norm()).item()


def compare_with_hf(model, hf_model, rtol: float | None = 1e-4, max_prompt: int = 12,
                    block_size: int = 4) -> None:
    """Run the mixed schedule through blink's `model` and check every position's logits against HF's.

    fp32 (rtol given): within rtol of the largest logit. bf16 (rtol=None): bf16 rounds differently at
    every op, so both are compared with HF run in fp32 on the same (bf16-valued) weights, and blink's
    error must stay within twice HF's own bf16 error."""
    cfg = model.config
    device = model.model.embed_tokens.weight.device
    rng = random.Random(1)
    lengths = (max_prompt // 2 + 1, 1, max_prompt)
    prompts = [[rng.randrange(cfg.vocab_size) for _ in range(n)] for n in lengths]
    tokens, logits = run_mixed_schedule(model, prompts, cfg.vocab_size, block_size=block_size)
    hf_fp32 = _fp32_twin(hf_model, device) if rtol is None else None
    for seq, ids in tokens.items():
        with torch.no_grad():
            ref = hf_model(torch.tensor([ids], device=device)).logits[0].float()
            if hf_fp32 is not None:
                exact = hf_fp32(torch.tensor([ids], device=device)).logits[0]
        if rtol is not None:
            assert_logits_match(logits[seq], ref, rtol)
            continue
        ours_error, hf_error = _relative_error(logits[seq], exact), _relative_error(ref, exact)
        assert ours_error < 2 * hf_error + 1e-3, f"blink bf16 error {ours_error:.5f}, HF's {hf_error:.5f}"


def _fp32_twin(hf_model, device):
    """HF in fp32 on the same (bf16-valued) weights. Not `.float()` of the bf16 model: that keeps its RoPE
    inverse frequencies rounded to bf16 (a non-persistent buffer cast by `.to(bf16)`), which shifts the
    angles at large positions; a fresh model computes them in fp32, as blink does."""
    with torch.device(device):
        twin = type(hf_model)(copy.deepcopy(hf_model.config)).float().eval()
    twin.load_state_dict({k: v.float() for k, v in hf_model.state_dict().items()})
    return twin


def compare_dir_with_hf(model_dir, rtol: float | None = 1e-4, dtype: torch.dtype = torch.float32) -> None:
    """blink and transformers both load the checkpoint at `model_dir` (on the CPU); logits must match."""
    compare_with_hf(load_model(model_dir, "cpu", dtype)[0], load_hf_model(model_dir, dtype), rtol)
