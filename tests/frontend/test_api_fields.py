"""Every request field decided (issue 18 item 3), new endpoints, the access log and the banner, end to end
through `blink serve` with the fake engine (output token i = prompt token i) and the openai client."""
from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from blink.config import EngineArgs
from blink.text.tokenizer import load_tokenizer
from tests.frontend.server_process import ServerProcess, make_tokenizer_only_model

pytestmark = pytest.mark.slow
PROMPT = "one two three four"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tokenizer_only_model(tmp_path_factory.mktemp("fields-model"))


@pytest.fixture(scope="module")
def tok(model_dir):
    return load_tokenizer(str(model_dir))


@pytest.fixture(scope="module")
def server(model_dir):
    proc = ServerProcess(["--model", str(model_dir), "--served-model-name", "fake",
                          "--engine-module", "tests.frontend.fake_engine"], env={"FAKE_ENGINE_STEP_S": "0.002"})
    proc.wait_ready()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture()
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=30) as c:
        yield c


def three(tok) -> int:
    """The id of the token ' three' in PROMPT (the fake engine's output repeats the prompt)."""
    return next(t for t in tok.encode(PROMPT) if tok.token_text(t) == " three")


def test_include_stop_str_in_output_and_stop_reason(client):
    plain = client.completions.create(model="fake", prompt=PROMPT, max_tokens=10, stop=[" three"])
    assert plain.choices[0].text == "one two" and plain.choices[0].model_extra["stop_reason"] == " three"
    kept = client.completions.create(model="fake", prompt=PROMPT, max_tokens=10, stop=[" three"],
                                     extra_body={"include_stop_str_in_output": True})
    assert kept.choices[0].text == "one two three" and kept.choices[0].finish_reason == "stop"
    chunks = list(client.completions.create(model="fake", prompt=PROMPT, max_tokens=10, stop=["o th"],
                                            stream=True, extra_body={"include_stop_str_in_output": True}))
    assert "".join(c.choices[0].text for c in chunks) == "one two th"
    assert chunks[-1].choices[0].model_extra["stop_reason"] == "o th"
    sglang = client.completions.create(model="fake", prompt=PROMPT, max_tokens=10, stop=[" three"],
                                       extra_body={"no_stop_trim": True})  # SGLang's name for the same
    assert sglang.choices[0].text == "one two three"
    length = client.completions.create(model="fake", prompt=PROMPT, max_tokens=2)
    assert length.choices[0].model_extra["stop_reason"] is None


def test_stop_token_ids_stop_reason_and_include(client, tok):
    out = client.completions.create(model="fake", prompt=PROMPT, max_tokens=10,
                                    extra_body={"stop_token_ids": [three(tok)]})
    assert out.choices[0].text == "one two" and out.choices[0].model_extra["stop_reason"] == three(tok)
    kept = client.chat.completions.create(model="fake", messages=[{"role": "user", "content": PROMPT}],
                                          max_tokens=40, extra_body={"stop_token_ids": [three(tok)],
                                                                     "include_stop_str_in_output": True})
    assert kept.choices[0].message.content.endswith(" three")
    assert kept.choices[0].model_extra["stop_reason"] == three(tok)


def test_continuous_usage_stats(client, tok):
    chunks = list(client.completions.create(model="fake", prompt=PROMPT, max_tokens=5, stream=True,
                                            stream_options={"include_usage": True,
                                                            "continuous_usage_stats": True}))
    counts = [c.usage.completion_tokens for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 5 and len(chunks) >= 5
    assert all(c.usage.prompt_tokens == len(tok.encode(PROMPT)) for c in chunks)
    chat = list(client.chat.completions.create(model="fake", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=3, stream=True,
                                               stream_options={"include_usage": True,
                                                               "continuous_usage_stats": True}))
    assert all(c.usage is not None for c in chat) and chat[-1].usage.completion_tokens == 3
    no_usage = list(client.completions.create(model="fake", prompt=PROMPT, max_tokens=3, stream=True))
    assert all(c.usage is None for c in no_usage)


def test_return_tokens_as_token_ids(client, tok):
    ids = tok.encode(PROMPT)
    out = client.completions.create(model="fake", prompt=PROMPT, max_tokens=3, logprobs=1,
                                    extra_body={"return_tokens_as_token_ids": True})
    lp = out.choices[0].logprobs
    assert lp.tokens == [f"token_id:{t}" for t in ids[:3]]
    assert lp.top_logprobs[0] == {f"token_id:{ids[1]}": -1.0, f"token_id:{ids[0]}": -0.5}
    assert out.choices[0].text == tok.decode(ids[:3])  # the text itself stays text
    chat = client.chat.completions.create(model="fake", messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=2, logprobs=True, top_logprobs=1,
                                          extra_body={"return_tokens_as_token_ids": True})
    assert all(c.token.startswith("token_id:") for c in chat.choices[0].logprobs.content)


def test_request_id_header(client, http):
    raw = client.completions.with_raw_response.create(model="fake", prompt=PROMPT, max_tokens=2,
                                                      extra_headers={"X-Request-Id": "my-req.42"})
    assert raw.headers["x-request-id"] == "my-req.42" and raw.parse().id == "cmpl-my-req.42"
    chat = client.chat.completions.with_raw_response.create(
        model="fake", messages=[{"role": "user", "content": "hi"}], max_tokens=1,
        extra_headers={"X-Request-Id": "chat-7"})
    assert chat.parse().id == "chatcmpl-chat-7"
    fresh = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1})
    assert fresh.json()["id"] == "cmpl-" + fresh.headers["x-request-id"]
    bad = http.post("/v1/completions", json={"prompt": PROMPT}, headers={"X-Request-Id": "a b"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "X-Request-Id"


REFUSED = [
    ("best_of > n", {"prompt": PROMPT, "best_of": 3, "n": 1}, "best_of"),
    ("best_of < n", {"prompt": PROMPT, "best_of": 1, "n": 2}, "best_of"),
    ("prompt_logprobs (no prompt-logprob rows)", {"prompt": PROMPT, "prompt_logprobs": 1}, "prompt_logprobs"),
    ("echo with logprobs (no prompt-logprob rows)", {"prompt": PROMPT, "echo": True, "logprobs": 1}, "logprobs"),
    ("prompt_logprobs > 20", {"prompt": PROMPT, "prompt_logprobs": 21}, "prompt_logprobs"),
    ("prompt_logprobs with stream", {"prompt": PROMPT, "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ("stop_token_ids out of vocab", {"prompt": PROMPT, "stop_token_ids": [10**6]}, "stop_token_ids"),
    ("stream_options without stream", {"prompt": PROMPT, "stream_options": {"include_usage": True}},
     "stream_options"),
    ("continuous without include_usage",
     {"prompt": PROMPT, "stream": True, "stream_options": {"continuous_usage_stats": True}},
     "stream_options.continuous_usage_stats"),
    ("unknown stream option", {"prompt": PROMPT, "stream": True, "stream_options": {"foo": 1}},
     "stream_options.foo"),
    ("suffix", {"prompt": PROMPT, "suffix": "x"}, "suffix"),
    ("return_hidden_states", {"prompt": PROMPT, "return_hidden_states": True}, "return_hidden_states"),
    ("temperature named", {"prompt": PROMPT, "temperature": -1}, "temperature"),
]


@pytest.mark.parametrize("name,body,param", REFUSED, ids=[r[0] for r in REFUSED])
def test_refused_fields_name_themselves(client, name, body, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="fake", **{k: v for k, v in body.items() if k in ("prompt", "n")},
                                  extra_body={k: v for k, v in body.items() if k not in ("prompt", "n")})
    assert info.value.body["param"] == param and info.value.status_code == 400


def test_best_of_equal_to_n_is_served(client):
    out = client.completions.create(model="fake", prompt=PROMPT, max_tokens=2, n=2, best_of=2)
    assert len(out.choices) == 2


def test_version_model_card_openapi_docs(client, http):
    assert http.get("/version").json()["version"]
    card = client.models.retrieve("fake")
    assert card.id == "fake" and card.model_extra["max_model_len"] == 256
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-17")
    schema = http.get("/openapi.json").json()
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/messages", "/v1/models/{model_id}", "/version",
                 "/tokenize", "/detokenize"):
        assert path in schema["paths"], path
    assert "best_of" in schema["components"]["schemas"]["CompletionRequest"]["properties"]
    docs = http.get("/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()


def test_banner_and_access_log(server, http):
    http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1, "user": "alice"},
              headers={"X-Request-Id": "logged-1"})
    deadline = time.monotonic() + 10
    while not any("id=logged-1" in line for line in server.stderr):
        assert time.monotonic() < deadline, "no access-log line"
        time.sleep(0.05)
    line = next(line for line in server.stderr if "id=logged-1" in line)
    assert '"POST /v1/completions" 200' in line and "user='alice'" in line
    text = "".join(server.stderr)
    bs = EngineArgs().block_size  # the fake engine publishes the default
    assert "engine mode host" in text and f"KV cache 100 blocks x {bs} tokens = {100 * bs} tokens" in text
    assert "max_model_len 256" in text and "forward graphs: none (eager" in text


def test_disable_log_requests(model_dir):
    proc = ServerProcess(["--model", str(model_dir), "--engine-module", "tests.frontend.fake_engine",
                          "--disable-log-requests"])
    try:
        proc.wait_ready()
        httpx.post(proc.base_url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 1},
                   headers={"X-Request-Id": "quiet-1"}, timeout=30).raise_for_status()
        httpx.get(proc.base_url + "/health", timeout=30)
    finally:
        proc.stop()
    assert not any("quiet-1" in line or "blink.access" in line for line in proc.stderr)
    assert any("engine mode" in line for line in proc.stderr)  # the banner is not a request log


def test_continue_final_message_leaves_the_last_message_open(http, tok):
    """vLLM's continue_final_message: the prompt ends with the final message's text, not its end of turn
    (the demo template closes a message with <|eot|> and adds the assistant header for a new one)."""
    messages = [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "My answer is"}]
    body = {"messages": messages, "add_generation_prompt": False}
    opened = http.post("/tokenize", json={**body, "continue_final_message": True}).json()["tokens"]
    closed = http.post("/tokenize", json=body).json()["tokens"]
    assert tok.decode(opened, skip_special_tokens=False).endswith("<|end_header|>\n\nMy answer is")
    assert closed[:len(opened)] == opened and len(closed) > len(opened)  # only the end of turn is cut
    out = http.post("/v1/chat/completions", json={**body, "continue_final_message": True, "max_tokens": 64}).json()
    assert out["usage"]["prompt_tokens"] == len(opened)
    # vLLM's chat echo: the answer starts with the assistant message it continues
    echoed = http.post("/v1/chat/completions", json={**body, "continue_final_message": True, "max_tokens": 64,
                                                      "echo": True}).json()
    assert echoed["choices"][0]["message"]["content"] == "My answer is" + out["choices"][0]["message"]["content"]
    with http.stream("POST", "/v1/chat/completions", json={**body, "continue_final_message": True, "echo": True,
                                                          "max_tokens": 4, "stream": True}) as r:
        first = next(line for line in r.iter_lines() if line.startswith("data: {"))
    assert json.loads(first[6:])["choices"][0]["delta"] == {"role": "assistant", "content": "My answer is"}
    user_last = http.post("/v1/chat/completions", json={"messages": messages[:1], "echo": True, "max_tokens": 4})
    assert not user_last.json()["choices"][0]["message"]["content"].startswith("Name a fruit.")
    for extra, param in [({"add_generation_prompt": True}, "continue_final_message"),
                         ({"messages": [*messages[:1], {"role": "assistant", "content": " "}]}, "messages")]:
        r = http.post("/v1/chat/completions", json={**body, "continue_final_message": True, **extra})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
