"""serving.sse / sse_stream: the bytes of each server-sent event (orjson since session 31) parse as strict JSON
and say what json.dumps said: text as UTF-8, integer keys as strings, the [DONE] frame, errors as events."""
import asyncio
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blink.frontend.errors import APIError
from blink.frontend.serving import sse, sse_stream


def _strict(raw: bytes):
    def no_constants(name):
        raise ValueError(f"non-JSON constant {name}")
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n")
    return json.loads(raw[6:-2].decode("utf-8"), parse_constant=no_constants)


def test_text_travels_as_utf8_and_integer_keys_as_strings():
    chunk = {"choices": [{"delta": {"content": "héllo \u4e16\u754c \n\"q\""}}], "prompt_logprobs": [None, {42: -0.5}]}
    raw = sse(chunk)
    assert "héllo".encode() in raw and b"\\u" not in raw  # not ASCII-escaped
    assert _strict(raw) == json.loads(json.dumps(chunk))  # {42: ...} -> {"42": ...} as json.dumps does


def test_control_characters_are_escaped_and_nan_is_not_json():
    raw = sse({"content": "a\x00b\x1fc", "logprob": float("nan")})
    assert _strict(raw) == {"content": "a\x00b\x1fc", "logprob": None}


@given(st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.text()
                    | st.floats(allow_nan=False, allow_infinity=False),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4)))
def test_any_json_value_round_trips(value):
    assert _strict(sse({"v": value})) == {"v": value}


def test_the_stream_ends_with_done_and_an_error_becomes_an_event():
    async def chunks(fail: Exception | None):
        yield {"n": 1}
        if fail:
            raise fail

    async def collect(fail):
        return [frame async for frame in sse_stream(chunks(fail))]

    assert asyncio.run(collect(None)) == [b'data: {"n":1}\n\n', b"data: [DONE]\n\n"]
    frames = asyncio.run(collect(APIError(400, "bad field", "top_p")))
    assert _strict(frames[1])["error"]["message"] == "bad field" and frames[-1] == b"data: [DONE]\n\n"
    frames = asyncio.run(collect(RuntimeError("boom")))
    assert "boom" in _strict(frames[1])["error"]["message"]


@pytest.mark.parametrize("payload", ["[DONE]", "x"])
def test_a_string_payload_is_sent_as_it_is(payload):
    assert sse(payload) == f"data: {payload}\n\n".encode()


def test_a_named_event_leads_with_its_name():
    """Anthropic's framing (messages.py): `event: NAME` before the data line."""
    raw = sse({"type": "message_stop"}, "message_stop")
    assert raw.startswith(b"event: message_stop\ndata: ")
    assert _strict(raw[len(b"event: message_stop\n"):]) == {"type": "message_stop"}
