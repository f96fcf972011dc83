"""vLLM's --chat-template and --tool-call-parser through `blink serve` (fake engine: the output echoes the
prompt, so with an echo template a message is exactly what the "model" answers)."""
from __future__ import annotations

import json

import httpx
import pytest

from blink.text.chat_template import chat_template_source
from blink.text.tokenizer import load_tokenizer
from tests.frontend.server_process import ServerProcess, make_tokenizer_only_model

ECHO = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}'  # Llama 3's JSON form


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tokenizer_only_model(tmp_path_factory.mktemp("flags-model"))  # the demo model's own template


def test_chat_template_source(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages[0]['content'] }}!")
    assert chat_template_source(str(path)) == "{{ messages[0]['content'] }}!"
    assert chat_template_source(ECHO) == ECHO
    with pytest.raises(ValueError, match="neither a file nor a template"):
        chat_template_source(str(tmp_path / "missing.jinja"))


def test_override_and_parser(model_dir, tmp_path):
    assert "<|start_header|>" in load_tokenizer(str(model_dir)).chat_template.source
    template = tmp_path / "echo.jinja"
    template.write_text(ECHO)
    tokens = len(load_tokenizer(str(model_dir)).encode(CALL, add_special_tokens=False))
    body = {"messages": [{"role": "user", "content": CALL}], "max_tokens": tokens, "tools": TOOLS}
    vllm_habits = ["--trust-remote-code", "--enable-chunked-prefill", "--disable-log-stats"]  # accepted as they are
    for args, parsed in (([], False), (["--tool-call-parser", "llama3_json", "--trust-request-chat-template",
                                        "--default-chat-template-kwargs", '{"mark": "!", "x": 1}',
                                        *vllm_habits], True)):
        proc = ServerProcess(["--model", str(model_dir), "--served-model-name", "fake",
                              "--chat-template", str(template), "--enable-auto-tool-choice",
                              "--engine-module", "tests.frontend.fake_engine", *args])
        proc.wait_ready()
        try:
            with httpx.Client(base_url=proc.base_url, timeout=30) as http:
                ids = http.post("/tokenize", json={"messages": body["messages"]}).json()["tokens"]
                assert http.post("/detokenize", json={"tokens": ids}).json()["prompt"] == CALL  # the echo template
                message = http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
                own = {"messages": body["messages"], "chat_template": "<<{{ messages[0]['content'] }}>>"}
                r = http.post("/tokenize", json=own)
                bad = http.post("/v1/chat/completions", json={**body, "chat_template": "{% if %}"})
                if parsed:  # trusted: the request's own template renders its prompt
                    assert http.post("/detokenize", json={"tokens": r.json()["tokens"]}).json()["prompt"] == \
                        f"<<{CALL}>>"
                    assert bad.status_code == 400 and bad.json()["error"]["param"] == "chat_template"
                    assert "syntax error" in bad.json()["error"]["message"]
                    # --default-chat-template-kwargs under the request's own, key by key
                    marked = {**own, "chat_template": "{{ messages[0]['content'] }}{{ mark }}{{ x }}"}
                    for kwargs, text in (({}, f"{CALL}!1"), ({"chat_template_kwargs": {"mark": "?"}}, f"{CALL}?1")):
                        ids = http.post("/tokenize", json={**marked, **kwargs}).json()["tokens"]
                        assert http.post("/detokenize", json={"tokens": ids}).json()["prompt"] == text
                else:  # vLLM's default: refused, naming the field
                    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template"
                    assert "--trust-request-chat-template" in r.json()["error"]["message"]
        finally:
            proc.stop()
        if parsed:  # llama3_json: the bare JSON object is a call
            assert message["content"] is None
            assert [json.loads(c["function"]["arguments"]) for c in message["tool_calls"]] == [{"city": "Paris"}]
        else:  # the echo template shows no format: Hermes, which needs <tool_call> blocks
            assert message["content"] == CALL and "tool_calls" not in message


@pytest.mark.parametrize("args, error", [
    (["--chat-template", "/no/such/template.jinja"], "neither a file nor a template"),
    (["--chat-template", "{% if %}"], "chat template syntax error on line 1"),
    (["--tool-call-parser", "mistral"], "invalid choice: 'mistral'"),
    (["--default-chat-template-kwargs", "[1]"], "must be a JSON object"),
    (["--override-generation-config", '{"seed": 3}'], "'seed' is not a sampling default"),
])
def test_bad_flags_are_one_line(args, error):
    proc = ServerProcess([*args, "--engine-module", "tests.frontend.fake_engine"])
    assert proc.wait_exit(60) == 2
    assert error in "".join(proc.stderr)
