"""The worker endpoints routers read, and the front end's side of a drain (in-process app; the fake
engine for /health_generate)."""
from __future__ import annotations

import os
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from blink.core.limits import EngineLimits, publish_limits
from blink.frontend.app import AppConfig, build_app
from blink.transport.layout import SegmentLayout
from blink.transport.rings import IngressConsumer
from blink.transport.shm import Segment
from tests.frontend.server_process import ServerProcess, make_tokenizer_only_model


@pytest.fixture()
def segment():
    seg = Segment.create(f"blink-routes-{os.getpid()}", SegmentLayout(8, 1024, 8))
    # As an engine does before `ready`: its limits (the API checks prompts against them).
    publish_limits(EngineLimits(max_model_len=256, max_num_seqs=4, max_num_batched_tokens=64, block_size=16,
                                num_kv_blocks=100, vocab_size=256), seg.control)
    seg.control.ready = 1
    yield seg
    seg.close()
    seg.unlink()


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_tokenizer_only_model(tmp_path_factory.mktemp("routes"))


def app_for(segment, model) -> TestClient:
    config = AppConfig(shm_name=segment.name, model=str(model), served_model_name="m",
                       tensor_parallel_size=2)
    return TestClient(build_app(config))


def test_load_and_info_come_from_the_control_block(segment, model):
    ctl = segment.control
    ctl.running, ctl.waiting, ctl.total_kv_blocks, ctl.free_kv_blocks = 3, 2, 100, 75
    ctl.engine_mode, ctl.tokens, ctl.steps = 2, 1234, 99
    with app_for(segment, model) as client:
        load = client.get("/get_load").json()
        assert load == {"load": 5, "num_running_reqs": 3, "num_waiting_reqs": 2, "kv_usage": 0.25,
                        "num_free_kv_blocks": 75, "num_total_kv_blocks": 100, "draining": False}
        ctl.waiting = 0  # read live, not cached
        assert client.get("/get_load").json()["load"] == 3
        info = client.get("/get_server_info").json()
        assert info["model_path"] == str(model) and info["kv_block_size"] == 16 and info["tp_size"] == 2
        assert (info["engine_mode"], info["generated_tokens"], info["engine_steps"]) == ("device", 1234, 99)
        model_info = client.get("/get_model_info").json()
        assert model_info["model_path"] == str(model) and model_info["is_generation"] is True
        assert model_info["served_model_name"] == "m"


def test_drain_refuses_at_once_and_closes_ingress_after_the_queue(segment, model):
    ctl = segment.control
    ingress = IngressConsumer(segment)
    with app_for(segment, model) as client:
        ctl.heartbeat += 1
        assert client.get("/health").status_code == 200
        ctl.drain_flag = 1
        health = client.get("/health")
        assert health.status_code == 503 and health.json()["error"]["message"] == "server shutting down"
        for stream in (False, True):  # refused before any response starts: a router can retry elsewhere
            r = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "stream": stream})
            assert r.status_code == 503 and "shutting down" in r.json()["error"]["message"]
        assert client.get("/health_generate").status_code == 503
        assert client.get("/get_load").json()["draining"] is True
        deadline = time.monotonic() + 5
        while not ctl.ingress_closed:
            assert time.monotonic() < deadline, "the front end never closed ingress"
            time.sleep(0.02)
        assert ingress.poll() == []  # nothing was submitted during the drain


@pytest.mark.slow
def test_health_generate_runs_a_token_through_the_engine(model):
    proc = ServerProcess(["--model", str(model), "--engine-module", "tests.frontend.fake_engine"])
    proc.wait_ready()
    try:
        assert httpx.get(proc.base_url + "/health_generate", timeout=30).status_code == 200
        info = httpx.get(proc.base_url + "/get_server_info").json()
        assert info["generated_tokens"] == 1 and info["engine_mode"] == "host"
    finally:
        proc.stop()
