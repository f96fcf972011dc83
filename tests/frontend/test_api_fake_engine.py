"""End-to-end API tests against `blink serve` with the fake engine (predictable outputs, fast).

The fake engine's output token i is prompt token i (mod the prompt length), so every expected text is
known exactly; see fake_engine.py.
"""
from __future__ import annotations

import asyncio
import re
import time

import httpx
import openai
import pytest

from blink.text.tokenizer import load_tokenizer
from tests.frontend.server_process import ServerProcess, make_tokenizer_only_model

pytestmark = pytest.mark.slow  # spawns processes

API_KEY = "sk-test-key"
MAX_BODY = 100_000
PROMPT = "one two three four"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tokenizer_only_model(tmp_path_factory.mktemp("fake-model"))


@pytest.fixture(scope="module")
def tok(model_dir):
    return load_tokenizer(str(model_dir))


@pytest.fixture(scope="module")
def server(model_dir):
    proc = ServerProcess(["--model", str(model_dir), "--served-model-name", "fake", "--api-key", API_KEY,
                          "--engine-module", "tests.frontend.fake_engine",
                          "--max-request-body-bytes", str(MAX_BODY)],
                         env={"FAKE_ENGINE_STEP_S": "0.005"})
    proc.wait_ready()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture()
def http(server):
    with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {API_KEY}"},
                      timeout=30) as c:
        yield c


def expected_text(tok, prompt: str, n: int) -> str:
    ids = tok.encode(prompt)
    return tok.decode([ids[i % len(ids)] for i in range(n)])


def metric(http, name: str, labels: str = 'model_name="fake"') -> float:
    text = http.get("/metrics").text
    match = re.search(rf"^{re.escape(name)}{{{re.escape(labels)}}} (\S+)$", text, re.M)
    assert match, name
    return float(match.group(1))


def test_completion(client, tok):
    out = client.completions.create(model="fake", prompt=PROMPT, max_tokens=6, temperature=0)
    assert out.choices[0].text == expected_text(tok, PROMPT, 6)
    assert out.choices[0].finish_reason == "length"
    n_prompt = len(tok.encode(PROMPT))
    usage = out.usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (n_prompt, 6, n_prompt + 6)


def test_completion_prompt_forms(client, tok):
    ids = tok.encode(PROMPT)
    by_ids = client.completions.create(model="fake", prompt=ids, max_tokens=3)
    assert by_ids.choices[0].text == expected_text(tok, PROMPT, 3)
    many = client.completions.create(model="fake", prompt=[PROMPT, "Hello world"], max_tokens=2, n=2)
    texts = [c.text for c in sorted(many.choices, key=lambda c: c.index)]
    assert texts == [expected_text(tok, PROMPT, 2)] * 2 + [expected_text(tok, "Hello world", 2)] * 2
    assert many.usage.completion_tokens == 8
    assert many.usage.prompt_tokens == len(ids) + len(tok.encode("Hello world"))


def test_chat(client, tok, model_dir):
    from transformers import PreTrainedTokenizerFast

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello world"}]
    out = client.chat.completions.create(model="fake", messages=messages, max_tokens=40)
    reference = PreTrainedTokenizerFast.from_pretrained(str(model_dir))
    prompt_ids = reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                               return_dict=False)
    assert out.usage.prompt_tokens == len(prompt_ids)
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == tok.decode([prompt_ids[i % len(prompt_ids)] for i in range(40)])
    assert out.usage.completion_tokens == 40


def test_streaming_with_usage_equals_non_streaming(client):
    kwargs = {"model": "fake", "prompt": PROMPT, "max_tokens": 9, "temperature": 0}
    full = client.completions.create(**kwargs)
    chunks = list(client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 9
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_chat_streaming(client):
    messages = [{"role": "user", "content": "Hello world"}]
    full = client.chat.completions.create(model="fake", messages=messages, max_tokens=12)
    chunks = list(client.chat.completions.create(model="fake", messages=messages, max_tokens=12, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 12


def test_concurrent_streams(server, tok):
    async def one(client, i):
        prompt = f"{PROMPT} {i}"
        max_tokens = 5 + i
        kwargs = {"temperature": 0.5 * (i % 3), "top_p": 1.0 - 0.01 * i, "seed": i, "stream": True,
                  "stream_options": {"include_usage": True}}
        stream = await client.completions.create(model="fake", prompt=prompt, max_tokens=max_tokens, **kwargs)
        texts, finishes, usage = [], [], None
        async for chunk in stream:
            if chunk.choices:
                texts.append(chunk.choices[0].text)
                finishes.append(chunk.choices[0].finish_reason)
            else:
                usage = chunk.usage
        assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
        assert "".join(texts) == expected_text(tok, prompt, max_tokens)
        assert usage.completion_tokens == max_tokens and usage.prompt_tokens == len(tok.encode(prompt))

    async def main():
        async with openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0) as c:
            await asyncio.gather(*(one(c, i) for i in range(32)))

    asyncio.run(main())


def three_index(tok) -> int:
    """Where the token ' three' sits in PROMPT's ids (the output repeats the prompt)."""
    return [tok.token_text(t) for t in tok.encode(PROMPT)].index(" three")


def test_stop_strings(client, tok):
    out = client.completions.create(model="fake", prompt=PROMPT, max_tokens=10, stop=[" three", "zzz"])
    assert out.choices[0].text == "one two" and out.choices[0].finish_reason == "stop"
    assert out.usage.completion_tokens == three_index(tok) + 1
    chunks = list(client.completions.create(model="fake", prompt=PROMPT, max_tokens=10, stop="o thr",
                                            stream=True))
    assert "".join(c.choices[0].text for c in chunks) == "one tw"
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_echo_n_and_max_completion_tokens(client, tok):
    echoed = client.completions.create(model="fake", prompt=PROMPT, max_tokens=2, echo=True)
    assert echoed.choices[0].text == PROMPT + expected_text(tok, PROMPT, 2)
    streamed = list(client.completions.create(model="fake", prompt=PROMPT, max_tokens=2, echo=True,
                                              stream=True))
    assert "".join(c.choices[0].text for c in streamed) == echoed.choices[0].text
    messages = [{"role": "user", "content": "Hello world"}]
    chat = client.chat.completions.create(model="fake", messages=messages, n=3, max_completion_tokens=5,
                                          max_tokens=50)
    assert sorted(c.index for c in chat.choices) == [0, 1, 2]
    assert len({c.message.content for c in chat.choices}) == 1 and chat.usage.completion_tokens == 15
    four = client.chat.completions.create(model="fake", messages=messages, max_tokens=4).choices[0]
    chunks = list(client.chat.completions.create(model="fake", messages=messages, n=2, max_tokens=4,
                                                 stream=True))
    for index in (0, 1):
        mine = [c.choices[0] for c in chunks if c.choices[0].index == index]
        assert mine[0].delta.role == "assistant" and mine[-1].finish_reason == "length"
        assert "".join(c.delta.content or "" for c in mine) == four.message.content


def test_stop_strings_wait_for_min_tokens(client, tok):
    out = client.completions.create(model="fake", prompt=PROMPT, max_tokens=10, stop=["two"],
                                    extra_body={"min_tokens": 4})
    full = expected_text(tok, PROMPT, 10)  # "one two three fourone two..."
    second_two = full.index("two", full.index("two") + 1)  # the first one comes before min_tokens
    assert out.choices[0].finish_reason == "stop" and out.choices[0].text == full[:second_two]


def test_stop_token_ids(client, tok):
    three = tok.encode(PROMPT)[three_index(tok)]
    out = client.completions.create(model="fake", prompt=PROMPT, max_tokens=10,
                                    extra_body={"stop_token_ids": [three]})
    assert out.choices[0].text == "one two" and out.choices[0].finish_reason == "stop"
    assert out.usage.completion_tokens == three_index(tok) + 1


def test_logprobs(client, tok):
    ids = tok.encode(PROMPT)
    out = client.completions.create(model="fake", prompt=PROMPT, max_tokens=3, logprobs=2)
    lp = out.choices[0].logprobs
    assert lp.tokens == [tok.token_text(t) for t in ids[:3]]
    assert lp.token_logprobs == [-0.5] * 3
    # the sampled token is among the top_logprobs too, as OpenAI and vLLM do
    assert lp.top_logprobs[0] == {tok.token_text(ids[1]): -1.0, tok.token_text(ids[2]): -2.0,
                                  tok.token_text(ids[0]): -0.5}
    assert lp.text_offset == [0, len(lp.tokens[0]), len(lp.tokens[0]) + len(lp.tokens[1])]
    chat = client.chat.completions.create(model="fake", messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=2, logprobs=True, top_logprobs=3)
    content = chat.choices[0].logprobs.content
    assert len(content) == 2 and all(len(c.top_logprobs) == 3 and c.logprob == -0.5 for c in content)


def test_models_tokenize_detokenize(http, tok):
    models = http.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["fake"]
    body = http.post("/tokenize", json={"model": "fake", "prompt": PROMPT}).json()
    assert body == {"tokens": tok.encode(PROMPT), "count": len(tok.encode(PROMPT)), "max_model_len": 256}
    chat = http.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["count"] == len(chat["tokens"]) > 3
    detokenized = http.post("/detokenize", json={"model": "fake", "tokens": body["tokens"]}).json()
    assert detokenized == {"prompt": PROMPT}


def test_health_and_metrics(http, server):
    assert http.get("/health").status_code == 200
    http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 3})
    text = http.get("/metrics").text
    for name in ("blink:request_success_total", "blink:generation_tokens_total", "blink:prompt_tokens_total",
                 "blink:time_to_first_token_seconds_bucket", "blink:inter_token_latency_seconds_bucket",
                 "blink:e2e_request_latency_seconds_bucket", "blink:request_decode_time_seconds_bucket",
                 "blink:request_prompt_tokens_bucket", "blink:request_generation_tokens_bucket",
                 "blink:request_params_n_bucket", "blink:request_params_max_tokens_bucket",
                 "blink:num_requests_running", "blink:num_requests_waiting", "blink:kv_cache_usage_perc",
                 "blink:num_preemptions_total", "blink:engine_steps_total", "blink:iteration_tokens_total_bucket",
                 "blink:request_queue_time_seconds_bucket", "blink:request_prefill_time_seconds_bucket",
                 "blink:frontend_loop_lag_seconds_bucket", "blink:frontend_egress_gap_seconds_bucket"):
        assert re.search(rf"^{re.escape(name)}{{[^}}]*model_name=\"fake\"", text, re.M), name
    assert re.search(r"^# TYPE blink:num_preemptions(_total)? counter$", text, re.M)
    assert metric(http, "blink:request_generation_tokens_count") >= 1
    count = metric(http, "blink:request_queue_time_seconds_count")
    assert count >= 1 and metric(http, "blink:request_queue_time_seconds_sum") == pytest.approx(0.0015 * count)
    assert metric(http, "blink:request_prefill_time_seconds_count") == count
    # the loop's timer ticks: every 0.25 s while idle, so a server started just now may not have ticked yet
    deadline = time.monotonic() + 2
    while metric(http, "blink:frontend_loop_lag_seconds_count") < 1:
        assert time.monotonic() < deadline, "the loop-lag timer never ticked"
        time.sleep(0.05)
    assert metric(http, "blink:frontend_egress_gap_seconds_count") >= 1  # 3 tokens, one engine step apart
    assert metric(http, "blink:engine_pid") in [float(p) for p in server.children()]
    # held before the engine: none now (the gauges read the pool's and the arena's own counts at scrape time)
    assert metric(http, "blink:frontend_tokenization_jobs") == 0 and metric(http, "blink:grammar_arena_waiting") == 0


def test_client_disconnect_aborts(server, client, http):
    stream = client.completions.create(model="fake", prompt=PROMPT, max_tokens=240, stream=True)
    seen = [next(iter(stream)) for _ in range(3)]
    assert len(seen) == 3
    assert metric(http, "blink:num_requests_running") == 1
    stream.close()
    deadline = time.monotonic() + 10
    while metric(http, "blink:num_requests_running") != 0:
        assert time.monotonic() < deadline, "the engine still runs the abandoned request"
        time.sleep(0.05)


def test_non_streaming_disconnect_aborts(server, http):
    with pytest.raises(httpx.ReadTimeout):
        http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 240}, timeout=0.3)
    deadline = time.monotonic() + 10
    while metric(http, "blink:num_requests_running") != 0:
        assert time.monotonic() < deadline, "the engine still runs the abandoned request"
        time.sleep(0.05)


BAD_REQUESTS = [
    ("malformed json", "/v1/completions", b'{"prompt": "hi", ', 400),
    ("missing prompt", "/v1/completions", {"max_tokens": 3}, 400),
    ("wrong type", "/v1/completions", {"prompt": "hi", "max_tokens": "many"}, 400),
    ("max_tokens 0", "/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400),
    ("max_tokens too large", "/v1/completions", {"prompt": "hi", "max_tokens": 10_000}, 400),
    ("temperature < 0", "/v1/completions", {"prompt": "hi", "temperature": -0.5}, 400),
    ("top_p 0", "/v1/completions", {"prompt": "hi", "top_p": 0}, 400),
    ("top_p > 1", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_p": 2}, 400),
    ("token id too large", "/v1/completions", {"prompt": [5, 10**6], "max_tokens": 2}, 400),
    ("negative token id", "/v1/completions", {"prompt": [-1], "max_tokens": 2}, 400),
    ("bad detokenize id", "/detokenize", {"tokens": [10**7]}, 400),
    ("prompt too long", "/v1/completions", {"prompt": [5] * 300, "max_tokens": 2}, 400),
    ("empty messages", "/v1/chat/completions", {"messages": []}, 400),
    ("bad logit_bias key", "/v1/completions", {"prompt": "hi", "logit_bias": {"abc": 1}}, 400),
    ("logit_bias id out of vocab", "/v1/completions", {"prompt": "hi", "logit_bias": {"99999": 1}}, 400),
    ("top_logprobs > 20", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21}, 400),
    ("n = 0", "/v1/completions", {"prompt": "hi", "n": 0}, 400),
    ("unknown model", "/v1/completions", {"model": "gpt-17", "prompt": "hi"}, 404),
    ("unknown chat model", "/v1/chat/completions",
     {"model": "nope", "messages": [{"role": "user", "content": "x"}]}, 404),
    ("body too large", "/v1/completions", {"prompt": "x " * MAX_BODY}, 413),
]


@pytest.mark.parametrize("name,path,body,status", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_input(http, name, path, body, status):
    if isinstance(body, bytes):
        response = http.post(path, content=body, headers={"content-type": "application/json"})
    else:
        response = http.post(path, json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"] and error["code"] == status
    assert http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1}).status_code == 200


def test_unknown_fields_are_refused_by_name(http):
    response = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "best_of_the_best": 3,
                                                  "user": "me", "echo": False})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "best_of_the_best"
    assert "unsupported field" in response.json()["error"]["message"]
    chat = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                   "store": True})
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "store"
    kept_nothing = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                           "store": False, "max_tokens": 1})
    assert kept_nothing.status_code == 200


def test_api_key(server):
    with httpx.Client(base_url=server.base_url) as c:
        body = {"prompt": "hi", "max_tokens": 1}
        assert c.post("/v1/completions", json=body).status_code == 401
        wrong = c.post("/v1/completions", json=body, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == 401
        assert c.get("/v1/models").status_code == 401
        assert c.get("/health").status_code == 200
        ok = c.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"})
        assert ok.status_code == 200


def test_a_constraint_compiles_on_a_model_dir_without_an_architecture(http):
    # the front end reads only the EOS ids from config.json; this tokenizer-only dir names no architecture,
    # which the full model config refuses (schemathesis found the 500 on 2026-12-05)
    response = http.post("/v1/completions", json={"model": "fake", "prompt": PROMPT, "max_tokens": 3,
                                                   "guided_regex": "[a-c]{2,4}"})
    assert response.status_code == 200, response.text
