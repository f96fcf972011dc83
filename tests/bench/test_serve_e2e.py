"""The load generator end to end against the fake streaming server."""
import argparse
import asyncio
import gc
import json

import httpx
import pytest

from blink.bench import serve
from blink.bench.runner import LoadConfig, run_load
from blink.bench.token_codec import ServerTokenCodec
from blink.bench.workload import SampleRequest
from tests.bench.fake_openai_server import FAIL_MAX_TOKENS, MODEL, decode, encode


def bench_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    return parser.parse_args(["--disable-tqdm", *argv])


def test_bench_serve_writes_the_result_json(fake_server, tmp_path):
    result_path = tmp_path / "result.json"
    args = bench_args("--base-url", fake_server.base_url, "--num-prompts", "12", "--request-rate", "inf",
                      "--random-input-len", "20", "--random-output-len", "6", "--ignore-eos",
                      "--result-json", str(result_path), "--save-detailed")
    assert serve.run(args) == 0
    result = json.loads(result_path.read_text())
    assert result["model"] == MODEL  # asked from /v1/models
    assert (result["completed"], result["failed"], result["incomplete"]) == (12, 0, 0)
    assert result["total_output_tokens"] == 12 * 6  # from usage
    assert result["total_input_tokens"] == 12 * (20 + 1)  # usage counts the server's BOS
    assert result["request_throughput"] == result["completed"] / result["duration"]
    assert result["output_throughput"] == result["total_output_tokens"] / result["duration"]
    for name in ("ttft", "tpot", "itl", "e2el"):
        assert 0 < result[f"median_{name}_ms"] <= result[f"p90_{name}_ms"] <= result[f"p99_{name}_ms"]
    assert result["p99_e2el_ms"] >= result["p99_ttft_ms"]
    assert [len(itl) for itl in result["itls"]] == [5] * 12  # one gap per chunk after the first
    payloads = fake_server.state.payloads
    assert len(payloads) == 12
    assert all(p["stream"] and p["stream_options"] == {"include_usage": True} for p in payloads)
    assert all(p["ignore_eos"] and p["max_tokens"] == 6 and p["temperature"] == 0.0 for p in payloads)
    # Prompts came from the server's /detokenize and re-tokenize to the asked length.
    assert all(len(encode(p["prompt"])) == 20 for p in payloads)
    assert len({p["prompt"] for p in payloads}) == 12


def test_a_json_schema_constrains_every_request(fake_server, tmp_path):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    result_path = tmp_path / "result.json"
    args = bench_args("--base-url", fake_server.base_url, "--num-prompts", "3", "--random-input-len", "8",
                      "--random-output-len", "4", "--json-schema", str(path), "--result-json", str(result_path))
    assert serve.run(args) == 0
    assert [p["structured_outputs"] for p in fake_server.state.payloads] == [{"json": schema}] * 3
    assert json.loads(result_path.read_text())["json_schema"] == str(path)


def test_output_counts_come_from_usage_and_concurrency_is_capped(fake_server):
    args = bench_args("--base-url", fake_server.base_url, "--model", MODEL, "--num-prompts", "8",
                      "--request-rate", "200", "--max-concurrency", "2", "--random-input-len", "8",
                      "--random-output-len", "10")
    result = asyncio.run(serve.bench_serve(args))
    assert result["completed"] == 8
    assert result["total_output_tokens"] == 8 * 3  # no --ignore-eos: the fake stops early
    assert fake_server.state.max_in_flight <= 2
    assert result["max_concurrency"] == 2


def test_server_errors_count_as_failed(fake_server):
    requests = [SampleRequest(decode([5, 6]), 2, n) for n in (4, FAIL_MAX_TOKENS, 4, FAIL_MAX_TOKENS)]
    config = LoadConfig(base_url=fake_server.base_url, model=MODEL, ignore_eos=True, show_progress=False)
    outcome = asyncio.run(run_load(config, requests))
    summary = outcome.summary()
    assert (summary["completed"], summary["failed"]) == (2, 2)
    assert summary["total_output_tokens"] == 8
    assert sorted(r.error[:8] for r in outcome.results if not r.success) == ["HTTP 500"] * 2
    stalls = outcome.client_stalls()  # the client's own loop lags and collections, on the send-time clock
    assert set(stalls) == {"loop_lags", "gcs", "collector_held"} and all(lag >= 0.02 for _, lag in stalls["loop_lags"])
    assert stalls["collector_held"] and stalls["gcs"] == []  # LoadConfig's default: no collection while it measures
    assert gc.isenabled() and gc.get_freeze_count() == 0  # and the collector back as it was


def test_a_time_box_stops_sending_and_cancels_stragglers(fake_server):
    fake_server.state.token_delay_s = 0.01  # 500 tokens take >= 5 s, far beyond the 0.3 s box
    requests = [SampleRequest(decode([7]), 1, 500) for _ in range(200)]
    config = LoadConfig(base_url=fake_server.base_url, model=MODEL, request_rate=20.0, ignore_eos=True,
                        max_duration_s=0.3, drain_s=0.2, show_progress=False)
    outcome = asyncio.run(run_load(config, requests))
    assert 1 <= outcome.sent < 200
    assert outcome.results == [] and outcome.incomplete == outcome.sent
    assert outcome.summary()["completed"] == 0


def test_server_codec_strips_a_bos_the_server_adds(fake_server):
    codec = ServerTokenCodec(fake_server.base_url, MODEL)
    assert codec.encode(decode([3, 4, 5])) == [3, 4, 5]
    assert codec.decode([104, 105]) == "hi"
    assert len(codec.candidate_ids()) > 50  # the characters of the synthetic text
    codec.close()


class _WordLevelServerCodec(ServerTokenCodec):
    """ServerTokenCodec whose /tokenize and /detokenize are a preset's word-level tokenizer ("w{i}")."""

    def __init__(self, vocab_size: int):
        from blink.text.tokenizer import synthetic_tokenizer

        self._words = synthetic_tokenizer(vocab_size)
        self._vocab_size = vocab_size
        super().__init__("http://127.0.0.1:9", MODEL)

    def _tokenize(self, text: str) -> list[int]:
        return self._words.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        if max(ids, default=0) >= self._vocab_size:
            raise httpx.HTTPStatusError("400", request=None, response=None)
        return self._words.decode([int(i) for i in ids])


def test_server_codec_draws_varied_ids_from_a_word_level_preset_tokenizer():
    # The synthetic text alone maps to the unknown word: every random prompt would be one repeated token,
    # and a prefix cache would then serve the "random" prompts from each other's blocks.
    codec = _WordLevelServerCodec(vocab_size=1000)
    assert len(codec.candidate_ids()) == 512  # the ids 0..511 (4096 is past the vocabulary)
    codec.close()


def test_server_codec_refuses_a_degenerate_pool():
    with pytest.raises(RuntimeError, match="distinct tokens"):
        _WordLevelServerCodec(vocab_size=10)
