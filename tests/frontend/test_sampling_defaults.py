"""--generation-config / --override-generation-config: a request's unset sampling fields take the model's
generation_config.json (vLLM's default behaviour); a request's own values win."""
from __future__ import annotations

import json

import httpx
import pytest

from blink.frontend.sampling_defaults import sampling_defaults
from blink.model.demo import ensure_default_model
from tests.frontend.server_process import ServerProcess

QWEN3_LIKE = {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "eos_token_id": [1, 2],
              "max_new_tokens": 64}


def test_sources_and_overrides(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps(QWEN3_LIKE))
    assert sampling_defaults(str(tmp_path)) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 64}
    assert sampling_defaults(str(tmp_path), "vllm") == {}
    assert sampling_defaults("llama3-8b") == {}  # a preset: no generation config
    other = tmp_path / "other"
    other.mkdir()
    (other / "generation_config.json").write_text(json.dumps({"repetition_penalty": 1.05}))
    assert sampling_defaults(str(tmp_path), str(other)) == {"repetition_penalty": 1.05}
    over = sampling_defaults(str(tmp_path), "auto", '{"temperature": 0.2, "min_p": 0.05, "top_k": null}')
    assert over == {"temperature": 0.2, "top_p": 0.95, "top_k": 20, "max_tokens": 64, "min_p": 0.05}
    for source, override, error in [
        (str(tmp_path / "missing"), None, "no generation_config.json there"),
        ("auto", "{not json", "is not JSON"),
        ("auto", '["temperature"]', "must be a JSON object"),
        ("auto", '{"seed": 1}', "'seed' is not a sampling default"),
        ("auto", '{"temperature": "hot"}', "temperature must be a number"),
    ]:
        with pytest.raises(ValueError, match=error):
            sampling_defaults(str(tmp_path), source, override)


@pytest.mark.slow
def test_the_model_default_applies_and_the_request_wins(tmp_path):
    demo = ensure_default_model()
    model = tmp_path / "greedy-demo"
    model.mkdir()
    for f in demo.iterdir():
        (model / f.name).symlink_to(f)
    (model / "generation_config.json").unlink()
    (model / "generation_config.json").write_text(json.dumps({"temperature": 0.0, "max_new_tokens": 7}))
    proc = ServerProcess(["--model", str(model), "--served-model-name", "demo", "--engine", "host",
                          "--device", "cpu", "--max-num-seqs", "4"])
    proc.wait_ready()
    try:
        with httpx.Client(base_url=proc.base_url + "/v1", timeout=60) as http:
            def chat(**body):
                r = http.post("/chat/completions", json={"messages": [{"role": "user", "content": "Tell me"}],
                                                         "ignore_eos": True, **body})
                assert r.status_code == 200, r.text
                return r.json()

            first, second = chat(), chat()
            assert first["usage"]["completion_tokens"] == 7  # max_new_tokens
            assert first["choices"][0]["message"] == second["choices"][0]["message"]  # temperature 0: greedy
            drawn = {chat(temperature=1.0, seed=s, max_tokens=16)["choices"][0]["message"]["content"] for s in (1, 2)}
            assert len(drawn) == 2  # the request's own temperature wins
    finally:
        proc.stop()
    assert "sampling defaults from the generation config" in "".join(proc.stderr)
