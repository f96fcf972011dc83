"""The reasoning-then-schema suite again, against `blink serve --engine device` on a GPU: the wrapped
automaton is staged by the front end and masked by the GPU scheduler like any constraint."""
from __future__ import annotations

import pytest

from tests.frontend.server_process import ServerProcess
from tests.grammar.test_api_reasoning import (  # noqa: F401 - the tests and fixtures re-run here
    http,
    test_a_prompt_that_skips_the_thought_gets_the_schema_alone,
    test_the_model_thinks_before_the_schema_applies,
)
from tests.grammar.test_api_structured_device_gpu import DEVICE_ARGS

pytestmark = [pytest.mark.slow, pytest.mark.gpu, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess([*DEVICE_ARGS, "--reasoning-parser", "qwen3"])
    proc.wait_ready()
    yield proc
    proc.stop()
