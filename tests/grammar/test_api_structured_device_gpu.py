"""The structured-outputs API suite again, against `blink serve --engine device` on a GPU: the front end
stages the tables in the segment and the GPU scheduler loads them; outputs validate, refusals are the
same 400s, and a stop-string abort of a constrained stream frees its partition once the engine confirms."""
from __future__ import annotations

import pytest

from tests.frontend.server_process import ServerProcess
from tests.grammar.test_api_structured import (  # noqa: F401 - the tests and fixtures re-run here
    http,
    post,
    test_bad_constraints_get_a_400_naming_the_field,
    test_chat_json_schema_outputs_validate,
    test_json_object,
    test_server_keeps_serving_after_refusals,
    test_tool_calls_stream_in_openai_shape,
    test_tool_choice_auto_and_conflicts,
    test_tool_choice_required_and_named,
    test_vllm_fields_and_streaming,
)

pytestmark = [pytest.mark.slow, pytest.mark.gpu, pytest.mark.timeout(900)]


DEVICE_ARGS = ["--served-model-name", "demo", "--engine", "device", "--device", "cuda", "--dtype", "float32",
               "--max-num-seqs", "8", "--grammar-arena-mb", "8", "--gpu-memory-utilization", "0.3"]


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess(DEVICE_ARGS)
    proc.wait_ready()
    yield proc
    proc.stop()


def test_more_distinct_constraints_than_partitions_over_time(http):  # noqa: F811
    """Twenty distinct constraints one after another: slots are freed by the last records and reused."""
    for i in range(20):
        choices = [f"opt{i}a", f"opt{i}b"]
        r = post(http, "/completions", prompt="Pick:", max_tokens=10, guided_choice=choices, seed=i)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] in choices


def test_stop_string_on_a_constrained_stream(http):  # noqa: F811
    r = post(http, "/completions", prompt="x", max_tokens=50, guided_regex="a{40}", stop=["aaaa"])
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == ""
    r = post(http, "/completions", prompt="x", max_tokens=50, guided_regex="a{40}")
    assert r.json()["choices"][0]["text"] == "a" * 40
