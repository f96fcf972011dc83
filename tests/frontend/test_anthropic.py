"""The Anthropic Messages API (/v1/messages) through the `anthropic` client.

Against the fake engine (output token i = prompt token i) with a chat template that renders tools and tool
results and opens with a Hermes tool call: the output then spells the whole rendered prompt, so the tool
definitions, the tool_use / tool_result round trip and the tool_use parsing are all checked exactly.
The text path also runs on the demo model with the real host engine.
"""
from __future__ import annotations

from unittest.mock import ANY

import httpx
import pytest

from tests.frontend.server_process import ServerProcess, make_tokenizer_only_model

anthropic = pytest.importorskip("anthropic")  # the test extra has it; the GPU image does not

pytestmark = pytest.mark.slow
TEMPLATE = (
    '{% if tools %}<tool_call>{"name": "{{ tools[0].function.name }}", "arguments": {"city": "Paris"}}'
    "</tool_call>{% for t in tools %}TOOL {{ t.function.name }}: {{ t.function.description }} "
    "{{ t.function.parameters | tojson }}\n{% endfor %}{% endif %}"
    "{% for m in messages %}[{{ m.role }}]{% if m.tool_call_id %}(result of {{ m.tool_call_id }}){% endif %}"
    "{{ m.content }}{% for c in m.tool_calls or [] %}CALL {{ c.id }} {{ c.function.name }} "
    "{{ c.function.arguments | tojson }}{% endfor %}\n{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
)
WEATHER = {"name": "get_weather", "description": "Weather of a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = make_tokenizer_only_model(tmp_path_factory.mktemp("anthropic-model"), max_position_embeddings=1024)
    (model / "chat_template.jinja").write_text(TEMPLATE)
    proc = ServerProcess(["--model", str(model), "--served-model-name", "fake", "--api-key", "sk-ant",
                          "--engine-module", "tests.frontend.fake_engine"])
    proc.wait_ready()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key="sk-ant", max_retries=0)


def whole_prompt(client, **kwargs) -> anthropic.types.Message:
    """A reply as long as the prompt: with the fake engine its text is the rendered prompt."""
    n = client.messages.create(model="fake", max_tokens=1, **kwargs).usage.input_tokens
    return client.messages.create(model="fake", max_tokens=n, **kwargs)


def test_text_message(client):
    out = whole_prompt(client, system="Be brief.", messages=[{"role": "user", "content": "Hello world"}])
    assert [b.type for b in out.content] == ["text"]
    assert out.content[0].text == "[system]Be brief.[user]Hello world[assistant]"
    assert out.stop_reason == "max_tokens" and out.usage.output_tokens == out.usage.input_tokens
    assert out.role == "assistant" and out.model == "fake" and out.id.startswith("msg_")
    stopped = client.messages.create(model="fake", max_tokens=50, stop_sequences=["Hello"],
                                     messages=[{"role": "user", "content": [{"type": "text", "text": "Hello"}]}])
    assert stopped.content[0].text == "[user]"
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == "Hello"


def test_streamed_text_equals_non_streamed(client):
    kwargs = {"model": "fake", "max_tokens": 12, "messages": [{"role": "user", "content": "Hello world"}]}
    full = client.messages.create(**kwargs)
    with client.messages.stream(**kwargs) as stream:
        deltas = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(deltas) == full.content[0].text == final.content[0].text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 12


def test_tool_definitions_calls_and_results_round_trip(client):
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"},
                                     {"type": "text", "text": "Thanks", "cache_control": {"type": "ephemeral"}}]},
    ]
    out = whole_prompt(client, tools=[WEATHER], messages=messages)
    assert out.stop_reason == "max_tokens"  # the echo ends at max_tokens, the call parsed all the same
    text, call = out.content  # Anthropic's order: the text, then the calls
    assert call.type == "tool_use" and call.name == "get_weather" and call.input == {"city": "Paris"}
    assert call.id.startswith("toolu_")
    assert text.text.startswith('TOOL get_weather: Weather of a city {"type": "object"')
    assert '[assistant]Let me look.CALL toolu_1 get_weather {"city": "Paris"}' in text.text
    assert "[tool](result of toolu_1)Sunny[user]Thanks[assistant]" in text.text
    with client.messages.stream(model="fake", max_tokens=out.usage.output_tokens, tools=[WEATHER],
                                messages=messages) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["text", "tool_use"]
    assert final.content[1].input == {"city": "Paris"} and final.content[0].text == text.text
    assert final.stop_reason == "max_tokens"


def test_prefill_continues_the_final_assistant_message(client):
    """Anthropic's prefill: a final assistant message is the start of the answer, left open in the prompt."""
    messages = [{"role": "user", "content": "Hello world"}, {"role": "assistant", "content": "Sure:"}]
    out = whole_prompt(client, messages=messages)
    assert out.content[0].text == "[user]Hello world[assistant]Sure:"  # no end of turn, no new header
    empty = whole_prompt(client, messages=[messages[0], {"role": "assistant", "content": ""}])
    assert empty.content[0].text == "[user]Hello world[assistant]"  # an empty prefill asks for nothing
    with pytest.raises(anthropic.BadRequestError, match="trailing whitespace"):
        client.messages.create(model="fake", max_tokens=4,
                               messages=[messages[0], {"role": "assistant", "content": "Sure: "}])


def test_count_tokens_is_the_prompt_messages_runs(client):
    conversations = [
        {"system": "Be brief.", "messages": [{"role": "user", "content": "Hello world"}]},
        {"tools": [WEATHER], "tool_choice": {"type": "auto"}, "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                               "input": {"city": "Oslo"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Rain"}]}]},
    ]
    counts = []
    for kwargs in conversations:
        counts.append(client.messages.count_tokens(model="fake", **kwargs).input_tokens)
        # the fake engine spells the prompt back: the count is its length, and the reply's own usage says it too
        assert counts[-1] == client.messages.create(model="fake", max_tokens=1, **kwargs).usage.input_tokens
    assert counts[0] > 0
    no_tools = client.messages.count_tokens(model="fake", messages=conversations[1]["messages"]).input_tokens
    assert counts[1] > no_tools  # the template renders the tools: they are part of the count
    with pytest.raises(anthropic.NotFoundError) as info:
        client.messages.count_tokens(model="claude-x", messages=[{"role": "user", "content": "hi"}])
    assert info.value.body == {"type": "error", "error": {"type": "not_found_error", "message": ANY}}
    with pytest.raises(anthropic.BadRequestError, match="tool_choice"):
        client.messages.count_tokens(model="fake", messages=[{"role": "user", "content": "hi"}],
                                     tool_choice={"type": "any"})
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        client.messages.count_tokens(model="fake", messages=[{"role": "user", "content": "hi"}],
                                     extra_body={"max_tokens": 5})


def test_errors_in_anthropic_shape(client, server):
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-x", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="fake", max_tokens=4, messages=[{"role": "user", "content": [image]}])
    assert info.value.body["type"] == "error" and info.value.body["error"]["type"] == "invalid_request_error"
    for choice in ({"type": "tool", "name": "missing"}, {"type": "any", "name": "get_weather"},
                   {"type": "none", "disable_parallel_tool_use": True}):
        with pytest.raises(anthropic.BadRequestError, match="tool_choice") as info:
            client.messages.create(model="fake", max_tokens=4, tools=[WEATHER], tool_choice=choice,
                                   messages=[{"role": "user", "content": "hi"}])
        assert info.value.body["error"]["type"] == "invalid_request_error"  # Anthropic's shape, not OpenAI's
    with pytest.raises(anthropic.BadRequestError, match="thinking"):
        client.messages.create(model="fake", max_tokens=4, messages=[{"role": "user", "content": "hi"}],
                               thinking={"type": "enabled", "budget_tokens": 1024})
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=server.base_url, api_key="wrong", max_retries=0).messages.create(
            model="fake", max_tokens=4, messages=[{"role": "user", "content": "hi"}])


def test_demo_model_text_with_the_anthropic_client():
    server = ServerProcess(["--max-num-seqs", "4"])  # no --model: the demo model, host engine on the CPU
    try:
        server.wait_ready(300)
        client = anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)
        out = client.messages.create(model="demo", max_tokens=8, messages=[{"role": "user", "content": "Hello"}])
        with client.messages.stream(model="demo", max_tokens=8, extra_body={"temperature": 0},
                                    messages=[{"role": "user", "content": "Hello"}]) as stream:
            streamed = "".join(stream.text_stream)
        greedy = client.messages.create(model="demo", max_tokens=8, extra_body={"temperature": 0},
                                        messages=[{"role": "user", "content": "Hello"}])
        assert httpx.get(server.base_url + "/health").status_code == 200
    finally:
        server.stop()
    assert out.content[0].type == "text" and out.usage.output_tokens <= 8
    assert out.stop_reason in ("max_tokens", "end_turn")
    assert streamed == greedy.content[0].text  # greedy: the streamed text is the same reply
    assert any("DEMO model" in line for line in server.stderr)


def test_chat_tool_call_arguments_reach_the_template_as_objects(server):
    """OpenAI's clients send arguments as a JSON string; this template writes `arguments | tojson`, which
    would quote a string again (Llama 3's templates do the same)."""
    headers = {"Authorization": "Bearer sk-ant"}
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"}]
    with httpx.Client(base_url=server.base_url, headers=headers, timeout=30) as http:
        ids = http.post("/tokenize", json={"messages": messages}).json()["tokens"]
        assert 'CALL call_1 get_weather {"city": "Paris"}' in http.post("/detokenize", json={"tokens": ids}).json()[
            "prompt"]
        call["function"]["arguments"] = "{not json"
        r = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
        assert r.status_code == 400 and "function.arguments is not JSON" in r.json()["error"]["message"]
