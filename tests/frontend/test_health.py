"""/health follows the engine loop: ready, heartbeat advancing, not exited (in-process app, no engine)."""
from __future__ import annotations

import os
import time

import pytest
from fastapi.testclient import TestClient

from blink.frontend.app import AppConfig, build_app
from blink.transport.layout import SegmentLayout
from blink.transport.shm import Segment
from tests.frontend.server_process import make_tokenizer_only_model


@pytest.fixture()
def segment():
    seg = Segment.create(f"blink-health-{os.getpid()}", SegmentLayout(8, 1024, 8))
    yield seg
    seg.close()
    seg.unlink()


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
