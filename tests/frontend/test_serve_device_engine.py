"""The real-engine front-end suite again, against `blink serve --engine device` on a GPU."""
from __future__ import annotations

import asyncio
import signal
import time

import httpx
import pytest

from tests.frontend.router_harness import complete
from tests.frontend.server_process import ServerProcess
from tests.frontend.test_serve_real_engine import (  # noqa: F401 - the tests and fixtures re-run here
    check_sigterm_cleans_up,
    client,
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


@pytest.mark.slow
def test_device_drain_serves_accepted_streams_then_exits(model_dir):  # noqa: F811
    """SIGTERM with streams in flight: /health 503, new requests 503, the GPU loop serves the streams to
    their end and exits by itself (ingress closed, nothing left), and the server exits 0."""
    proc = ServerProcess(["--model", str(model_dir), "--served-model-name", "demo", "--engine", "device",
                          "--device", "cuda", "--dtype", "float32", "--gpu-memory-utilization", "0.3",
                          "--shutdown-timeout", "120"])
    proc.wait_ready()
    try:
        asyncio.run(_drain_with_streams(proc))
        assert proc.wait_exit(60) == 0
        assert "drained in" in "".join(proc.stderr), proc.stderr[-5:]
    finally:
        proc.stop()


async def _drain_with_streams(proc: ServerProcess) -> None:
    async with httpx.AsyncClient(timeout=120) as http:
        started = [asyncio.Event() for _ in range(4)]
        streams = [asyncio.create_task(complete(http, proc.base_url, f"story {i}", 8000, True, event))
                   for i, event in enumerate(started)]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 60)
        proc.process.send_signal(signal.SIGTERM)
        try:
            deadline = time.monotonic() + 5
            while (await http.get(proc.base_url + "/health")).status_code != 503:
                assert time.monotonic() < deadline, "/health stayed 200 after SIGTERM"
                await asyncio.sleep(0.01)
            refused = await http.post(proc.base_url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
            assert refused.status_code == 503
        except httpx.ConnectError:  # the GPU already finished everything and the server is gone
            assert all(s.done() for s in streams)
        for finish, usage in await asyncio.gather(*streams):
            assert finish == "length" and usage["completion_tokens"] == 8000
