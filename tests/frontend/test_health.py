"""/health follows the engine loop: ready, heartbeat advancing, not exited (in-process app, no engine)."""
from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from blink.frontend.app import AppConfig, build_app
from tests.frontend.server_process import make_tokenizer_only_model


def test_health_tracks_the_engine(segment, tmp_path):
    model = make_tokenizer_only_model(tmp_path / "model")
    config = AppConfig(shm_name=segment.name, model=str(model), served_model_name="m", engine_pid=4321,
                       heartbeat_timeout_s=0.3)
    control = segment.control
    with TestClient(build_app(config)) as client:
        assert client.get("/health").status_code == 503  # not ready yet
        assert client.post("/v1/completions", json={"prompt": "hi"}).status_code == 503
        control.ready = 1
        control.heartbeat += 1
        assert client.get("/health").status_code == 200
        time.sleep(0.5)  # no heartbeat for longer than the timeout: a stuck loop
        assert client.get("/health").status_code == 503
        control.heartbeat += 1
        assert client.get("/health").status_code == 200
        control.exited = 1
        response = client.get("/health")
        assert response.status_code == 503 and response.json()["error"]["code"] == 503
        assert 'blink:engine_pid{model_name="m"} 4321.0' in client.get("/metrics").text


@pytest.mark.parametrize("freeze", [True, False])
def test_the_front_end_freezes_its_startup_heap_and_times_each_collection(segment, tmp_path, freeze):
    """--gc-freeze (on by default): the objects alive once serving leave Python's collector until shutdown;
    every collection's length is in /metrics either way (a full one pauses every stream)."""
    import gc

    model = make_tokenizer_only_model(tmp_path / "model")
    config = AppConfig(shm_name=segment.name, model=str(model), served_model_name="m", gc_freeze=freeze)
    with TestClient(build_app(config)) as client:
        frozen = gc.get_freeze_count()
        gc.collect()
        text = client.get("/metrics").text
    assert (frozen > 1000) == freeze
    assert gc.get_freeze_count() == 0  # given back at shutdown
    gauge = next(line for line in text.splitlines() if line.startswith("blink:frontend_gc_frozen_objects"))
    assert (float(gauge.split()[-1]) > 1000) == freeze  # the count at the freeze (objects die since)
    assert 'blink:frontend_gc_pause_seconds_count{generation="2",model_name="m"} ' in text
