"""Prompt logprobs on a GPU, device mode and host mode (CUDA graphs), on a tiny fp32 Llama against HF's
log-softmax: rows capped per step (several prefill steps), batched with plain requests, the prefix cache
skipped, and the generated tokens the same in both modes."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from blink.config import EngineArgs
from blink.core.loaded_model import LoadedModel
from blink.device.engine import DeviceEngine
from blink.host.engine import HostEngine
from blink.request import SamplingParams
from tests.hf_models import make_tiny_model

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600), pytest.mark.usefixtures("no_tf32")]
PROMPTS = {1: list(range(20, 61)), 2: [7, 8, 9, 10, 11], 3: list(range(20, 61)), 4: [5, 300, 6, 400, 7, 8]}
ASK = {1: 4, 2: None, 3: 0, 4: 20}  # request 3 resends request 1's prompt: it must not come from the cache


@torch.no_grad()
def hf_reference(path, ids):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda()
    x = torch.tensor([ids], device="cuda")
    logits = model(x, attention_mask=torch.ones_like(x)).logits[0].float().cpu()
    return logits, torch.log_softmax(logits, -1)


def run(engine, requests):
    for rid, prompt in PROMPTS.items():
        engine.add_request(rid, prompt, requests[rid])
    prompt_events, tokens = {r: {} for r in PROMPTS}, {r: [] for r in PROMPTS}
    for _ in range(100_000):
        if not engine.has_unfinished():
            break
        for ev in engine.step():
            if ev.is_prompt:
                assert not tokens[ev.req_id]
                prompt_events[ev.req_id][-ev.position] = ev
            elif ev.token_id >= 0:
                tokens[ev.req_id].append(ev.token_id)
    return prompt_events, tokens


@pytest.mark.parametrize("mode", ["device", "host"])
def test_prompt_logprobs_equal_hf_on_the_gpu(tmp_path, mode):
    path = make_tiny_model(tmp_path, "llama")
    args = EngineArgs(model=str(path), device="cuda", dtype="float32", max_num_seqs=4, max_num_batched_tokens=32,
                      block_size=16, num_kv_blocks=32, max_model_len=256, engine=mode, max_prompt_logprob_rows=8)
    loaded = LoadedModel.load(args)
    assert loaded.limits.prompt_logprob_rows == 8
    requests = {rid: SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, prompt_logprobs=ASK[rid])
                for rid in PROMPTS}
    engine = DeviceEngine(args, loaded) if mode == "device" else HostEngine(args, loaded)
    try:
        got, tokens = run(engine, requests)
        plain, plain_tokens = run(engine, {rid: SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
                                           for rid in PROMPTS})
    finally:
        engine.shutdown()
    assert plain == {r: {} for r in PROMPTS} and tokens == plain_tokens
    for rid, prompt in PROMPTS.items():
        if ASK[rid] is None:
            assert got[rid] == {}
            continue
        logits, lps = hf_reference(path, prompt)
        assert sorted(got[rid]) == list(range(1, len(prompt)))
        for i, ev in got[rid].items():
            t, row = prompt[i], logits[i - 1]
            assert ev.token_id == t and ev.logprob == pytest.approx(lps[i - 1, t].item(), abs=2e-4)
            assert abs(ev.rank - (int((row > row[t]).sum()) + 1)) <= 1  # fp32 near-ties may swap
            top = torch.topk(lps[i - 1], ASK[rid])
            assert ev.top_logprobs == pytest.approx(top.values.tolist(), abs=2e-4)
