"""The host tests' fake model (tests/device/harness.py): a deterministic next token from the whole history read back
through the block table, and the fake prompt-logprob kernel, so a wrong block table, slot mapping or row shows up in
the tokens."""
from __future__ import annotations

import numpy as np

from blink.core.stops import check_stop
from blink.kernels.sampling_state import FLAG_GRAMMAR
from blink.request import MAX_TOP_LOGPROBS, FinishReason, SamplingParams
from tests.device.fake_grammar import constrained_choice, grammar_sample


def next_token(history: np.ndarray, vocab: int) -> int:
    """The fake model: a deterministic function of the whole token history."""
    weights = np.arange(1, len(history) + 1, dtype=np.int64)
    return int((np.sum((history.astype(np.int64) + 3) * weights) * 7 + len(history)) % vocab)


def reference(prompt: list[int], params: SamplingParams, vocab: int, eos: tuple[int, ...],
              max_model_len: int, tables=None) -> tuple[list[int], FinishReason]:
    """tables: the constraint's GrammarTables (the fake sampler then picks allowed tokens only)."""
    out: list[int] = []
    state = 0
    while True:
        token = next_token(np.array(prompt + out), vocab)
        if tables is not None:
            allowed = tables.allowed(state) if state >= 0 else np.isin(np.arange(vocab), eos)
            token = constrained_choice(token, allowed)
            state = tables.walk([token], state)
        out.append(token)
        reason = check_stop(params, out, len(prompt) + len(out), eos, max_model_len)
        if reason != FinishReason.NONE:
            return out, reason


def fake_prompt_entry(token: int, position: int, target: int, vocab: int) -> tuple[float, int, np.ndarray]:
    """The harness's prompt logprob of `target` after `token` at `position`: (logprob, rank, top ids)."""
    tops = (target + np.arange(MAX_TOP_LOGPROBS)) % vocab
    return -0.5 - 0.01 * token - 0.001 * position, 1 + (token + target) % 7, tops


def fake_forward(h, b: dict[str, np.ndarray], bucket: tuple[int, int], rows: int) -> None:
    t_pad, s_pad = bucket
    c, bs = h.cfg, h.cfg.block_size
    qsl = b["query_start_loc"]
    n = int(qsl[rows])
    assert (b["slot_mapping"][n:t_pad] == -1).all() and (qsl[rows:s_pad + 1] == n).all()
    assert (b["seq_lens"][rows:s_pad] == 0).all() and (b["sample_slots"][rows:s_pad] == c.max_num_seqs).all()
    slots = b["slot_mapping"][:n]
    assert (slots >= 0).all()
    h.kv_tok[slots] = b["input_ids"][:n]
    h.kv_pos[slots] = b["positions"][:n]
    for s in range(rows):
        q, seq_len = int(qsl[s + 1] - qsl[s]), int(b["seq_lens"][s])
        assert q > 0 and list(b["positions"][qsl[s]:qsl[s + 1]]) == list(range(seq_len - q, seq_len))
        assert b["logits_indices"][s] == qsl[s + 1] - 1
        pos = np.arange(seq_len)
        kv_slots = b["block_tables"][s][pos // bs].astype(np.int64) * bs + pos % bs
        assert (h.kv_pos[kv_slots] == pos).all(), "KV history corrupted (block table or slot mapping)"
        token = next_token(h.kv_tok[kv_slots], c.vocab_size)
        slot = int(b["sample_slots"][s])
        if slot != c.max_num_seqs and h.sampling["flags"][slot] & FLAG_GRAMMAR:
            token = grammar_sample(h.sampling, slot, token)
        b["sampled_ids"][s] = token
        b["logprobs"][s] = -0.25 * (s + 1)
        if h.sampling["num_logprobs"][slot] > 0:  # as the sampler: tops only for slots asking
            b["top_ids"][s] = (token + np.arange(MAX_TOP_LOGPROBS)) % c.vocab_size
            b["top_logprobs"][s] = -np.arange(MAX_TOP_LOGPROBS, dtype=np.float32)
        else:
            b["top_ids"][s], b["top_logprobs"][s] = -1, -np.inf
        if slot != c.max_num_seqs:
            assert b["sample_positions"][s] == seq_len
            if h.sampling["flags"][slot] & 1:  # what SamplingState.record_tokens does in the graph
                h.sampling["output_counts"][slot, token] += 1
    fake_prompt_logprobs(h, b, min(c.prompt_logprob_rows, t_pad), n)

def fake_prompt_logprobs(h, b: dict[str, np.ndarray], p: int, n: int) -> None:
    """The prompt-logprob kernel's outputs as a function of the row's token, position and target
    (fake_prompt_entry), so the records show whether the rows and targets were right."""
    for k in range(p):
        target = int(b["prompt_targets"][k])
        if target < 0:
            assert (b["prompt_targets"][k:p] == -1).all(), "padding rows come last"
            return
        q = int(b["prompt_rows"][k])
        assert 0 <= q < n
        lp, rank, tops = fake_prompt_entry(int(b["input_ids"][q]), int(b["positions"][q]), target,
                                           h.cfg.vocab_size)
        b["prompt_logprob"][k], b["prompt_rank"][k] = lp, rank
        b["prompt_top_ids"][k], b["prompt_top_logprobs"][k] = tops, -np.arange(MAX_TOP_LOGPROBS) - 0.5
