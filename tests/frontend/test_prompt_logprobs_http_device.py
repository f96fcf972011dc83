"""The prompt-logprob HTTP tests again, against `blink serve --engine device` on a GPU (the GPU scheduler
plans the rows and writes the prompt records)."""
from __future__ import annotations

import pytest

from tests.frontend.server_process import ServerProcess
from tests.frontend.test_prompt_logprobs_http import (  # noqa: F401 - the tests and fixtures re-run here
    PROMPT_IDS,
    client,
    model_dir,
    test_chat_prompt_logprobs_cover_the_templated_prompt,
    test_echo_with_logprobs_equals_hf,
    test_prompt_logprobs_equal_hf,
    test_refusals_name_their_field,
    tok,
)

pytestmark = [pytest.mark.slow, pytest.mark.gpu]


@pytest.fixture(scope="module")
def server(model_dir):  # noqa: F811 - this module's server is the device engine
    proc = ServerProcess(["--model", str(model_dir), "--served-model-name", "tiny", "--engine", "device",
                          "--device", "cuda", "--dtype", "float32", "--max-prompt-logprob-rows", "5",
                          "--num-kv-blocks", "256"])
    proc.wait_ready()
    yield proc
    proc.stop()
