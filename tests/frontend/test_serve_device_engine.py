"""The real-engine front-end suite again, against `blink serve --engine device` on a GPU."""
from __future__ import annotations

import pytest

from tests.frontend.server_process import ServerProcess
from tests.frontend.test_serve_real_engine import (  # noqa: F401 - the tests and fixtures re-run here
    check_sigterm_cleans_up,
    client,
    test_banner_metrics_and_messages,
    test_chat_stream_equals_non_stream,
    test_concurrent_streams_match_non_streamed,
    test_disconnect_frees_the_request,
    test_greedy_stream_equals_non_stream,
    test_stop_string_aborts_engine_request,
)
from tests.hf_models import make_tiny_model

pytestmark = [pytest.mark.slow, pytest.mark.gpu]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # A long context, so a request the GPU engine would finish in milliseconds can still be aborted.
    return make_tiny_model(tmp_path_factory.mktemp("serve"), "llama", max_position_embeddings=8192)


@pytest.fixture(scope="module")
def disconnect_max_tokens():
    return 8000


@pytest.fixture(scope="module")
def server(model_dir):  # noqa: F811 - this module's server is the device engine
    proc = ServerProcess(["--model", str(model_dir), "--served-model-name", "tiny", "--engine", "device",
                          "--device", "cuda", "--dtype", "float32", "--max-num-seqs", "16",
                          "--gpu-memory-utilization", "0.3"])
    proc.wait_ready()
    yield proc
    proc.stop()


def test_sigterm_to_process_group_cleans_up_device(model_dir):  # noqa: F811
    check_sigterm_cleans_up(["--model", str(model_dir), "--engine", "device", "--device", "cuda",
                             "--gpu-memory-utilization", "0.6"])
