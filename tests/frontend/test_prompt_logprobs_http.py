"""Prompt logprobs over HTTP with the openai client: `blink serve` in host mode on a tiny random Llama (CPU),
against HF's log-softmax: echo + logprobs (also with max_tokens 0, as lm-eval sends it, and streamed) and
vLLM's prompt_logprobs on completions and chat, plus the 400s."""
from __future__ import annotations

import httpx
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

from blink.text.tokenizer import load_tokenizer
from tests.frontend.server_process import ServerProcess
from tests.hf_models import make_tiny_model

pytestmark = pytest.mark.slow  # spawns processes

PROMPT_IDS = [5, 40, 41, 200, 7, 9, 300, 12, 64, 65, 66, 100]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("plp"), "llama")


@pytest.fixture(scope="module")
def server(model_dir):
    # 5 rows per step: the 11 prompt rows take three prefill steps
    proc = ServerProcess(["--model", str(model_dir), "--served-model-name", "tiny", "--engine", "host",
                          "--device", "cpu", "--dtype", "float32", "--max-prompt-logprob-rows", "5"])
    proc.wait_ready()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def tok(model_dir):
    return load_tokenizer(str(model_dir))


@torch.no_grad()
def hf_log_softmax(model_dir, ids):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    x = torch.tensor([ids])
    logits = model(x, attention_mask=torch.ones_like(x)).logits[0].float()
    return logits, torch.log_softmax(logits, -1)


def test_echo_with_logprobs_equals_hf(client, model_dir, tok):
    _, lps = hf_log_softmax(model_dir, PROMPT_IDS)
    want = [None] + [lps[i - 1, PROMPT_IDS[i]].item() for i in range(1, len(PROMPT_IDS))]
    for max_tokens in (0, 3):
        out = client.completions.create(model="tiny", prompt=PROMPT_IDS, max_tokens=max_tokens, echo=True,
                                        logprobs=2, temperature=0)
        lp = out.choices[0].logprobs
        assert lp.tokens[:len(PROMPT_IDS)] == [tok.token_text(t) for t in PROMPT_IDS]
        got = lp.token_logprobs[:len(PROMPT_IDS)]
        assert got[0] is None and got[1:] == pytest.approx(want[1:], abs=1e-4)
        assert lp.top_logprobs[0] is None
        for i in range(1, len(PROMPT_IDS)):
            top = lp.top_logprobs[i]
            best = torch.topk(lps[i - 1], 2).indices.tolist()
            assert set(top) == {tok.token_text(t) for t in best} | {tok.token_text(PROMPT_IDS[i])}
            assert top[tok.token_text(best[0])] == pytest.approx(lps[i - 1, best[0]].item(), abs=1e-4)
        assert len(lp.tokens) == len(PROMPT_IDS) + max_tokens == len(lp.token_logprobs) == len(lp.text_offset)
        assert out.usage.completion_tokens == max_tokens
        if max_tokens == 0:
            assert out.choices[0].finish_reason == "length"
            assert out.choices[0].text == tok.decode(PROMPT_IDS)
    chunks = list(client.completions.create(model="tiny", prompt=PROMPT_IDS, max_tokens=3, echo=True, logprobs=2,
                                            temperature=0, stream=True))
    first = chunks[0].choices[0]
    assert first.text == tok.decode(PROMPT_IDS) and first.logprobs.token_logprobs[0] is None
    assert first.logprobs.token_logprobs[1:] == pytest.approx(want[1:], abs=1e-4)
    assert sum(len(c.choices[0].logprobs.tokens) for c in chunks) == len(PROMPT_IDS) + 3


def test_prompt_logprobs_equal_hf(client, model_dir, tok):
    logits, lps = hf_log_softmax(model_dir, PROMPT_IDS)
    out = client.completions.create(model="tiny", prompt=PROMPT_IDS, max_tokens=2, n=2, temperature=0,
                                    extra_body={"prompt_logprobs": 3})
    for choice in out.choices:
        plp = choice.model_extra["prompt_logprobs"]
        assert len(plp) == len(PROMPT_IDS) and plp[0] is None
        for i in range(1, len(PROMPT_IDS)):
            t, row = PROMPT_IDS[i], logits[i - 1]
            entry = plp[i]
            assert entry[str(t)]["logprob"] == pytest.approx(lps[i - 1, t].item(), abs=1e-4)
            assert entry[str(t)]["rank"] == int((row > row[t]).sum()) + 1
            assert entry[str(t)]["decoded_token"] == tok.token_text(t)
            top = torch.topk(row, 3).indices.tolist()
            assert set(entry) == {str(x) for x in top} | {str(t)}
            for r, x in enumerate(top):
                assert entry[str(x)]["logprob"] == pytest.approx(lps[i - 1, x].item(), abs=1e-4)
                assert x == t or entry[str(x)]["rank"] == r + 1


def test_chat_prompt_logprobs_cover_the_templated_prompt(client, server):
    messages = [{"role": "user", "content": "hello there"}]
    ids = httpx.post(server.base_url + "/tokenize", json={"messages": messages}).json()["tokens"]
    out = client.chat.completions.create(model="tiny", messages=messages, max_tokens=2, temperature=0,
                                         extra_body={"prompt_logprobs": 0})
    plp = out.model_extra["prompt_logprobs"]
    assert len(plp) == len(ids) == out.usage.prompt_tokens and plp[0] is None
    assert [int(next(iter(e))) for e in plp[1:]] == ids[1:]  # each holds its prompt token only
    assert all(len(e) == 1 and next(iter(e.values()))["logprob"] <= 0 for e in plp[1:])


REFUSED = [({"prompt_logprobs": 21}, "prompt_logprobs"), ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
           ({"max_tokens": 0}, "max_tokens")]  # max_tokens 0 only with echo


@pytest.mark.parametrize("extra,param", REFUSED)
def test_refusals_name_their_field(server, extra, param):
    r = httpx.post(server.base_url + "/v1/completions", json={"prompt": PROMPT_IDS, **extra})
    assert r.status_code == 400 and r.json()["error"]["param"] == param
