import json
import math

import numpy as np
import pytest

from blink.bench.token_codec import LocalTokenCodec
from blink.bench.workload import (
    SHAREGPT_MAX_PROMPT,
    SHAREGPT_MAX_TOTAL,
    SHAREGPT_MEAN_INPUT,
    SHAREGPT_MEAN_OUTPUT,
    arrival_offsets,
    length_bounds,
    random_requests,
    sample_lengths,
    sharegpt_requests,
    stream_rng,
    synthetic_sharegpt_lengths,
    synthetic_sharegpt_requests,
)


def test_length_bounds():
    assert length_bounds(128, 0.0) == (128, 128)
    assert length_bounds(100, 0.5) == (50, 150)
    assert length_bounds(1, 0.9) == (1, 2)
    with pytest.raises(ValueError):
        length_bounds(100, 1.0)


def test_sample_lengths_cover_the_range_and_are_seeded():
    lengths = sample_lengths(stream_rng(0, 2), 100, 0.25, 5000)
    assert lengths.min() == 75 and lengths.max() == 125
    assert abs(lengths.mean() - 100) < 1.5
    assert np.array_equal(lengths, sample_lengths(stream_rng(0, 2), 100, 0.25, 5000))
    assert set(sample_lengths(stream_rng(0, 2), 64, 0.0, 100)) == {64}


def test_poisson_arrivals_have_the_rate_and_start_at_zero():
    offsets = arrival_offsets(20000, request_rate=8.0, burstiness=1.0, seed=1)
    gaps = np.diff(offsets)
    assert offsets[0] == 0.0 and np.all(gaps >= 0)
    assert gaps.mean() == pytest.approx(1 / 8.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # exponential gaps: CV 1
    assert np.array_equal(offsets, arrival_offsets(20000, 8.0, 1.0, seed=1))
    assert not np.array_equal(offsets, arrival_offsets(20000, 8.0, 1.0, seed=2))


def test_burstiness_sets_the_gamma_shape():
    regular = np.diff(arrival_offsets(20000, request_rate=4.0, burstiness=4.0, seed=0))
    assert regular.mean() == pytest.approx(0.25, rel=0.05)
    assert regular.std() / regular.mean() == pytest.approx(0.5, rel=0.05)  # CV = 1/sqrt(shape)


def test_infinite_rate_sends_everything_at_once_and_bad_values_are_refused():
    assert np.array_equal(arrival_offsets(5, math.inf, 1.0, 0), np.zeros(5))
    with pytest.raises(ValueError):
        arrival_offsets(5, 0.0, 1.0, 0)
    with pytest.raises(ValueError):
        arrival_offsets(5, 1.0, 0.0, 0)


def test_random_prompts_have_exact_lengths(bpe_tokenizer_dir):
    codec = LocalTokenCodec(bpe_tokenizer_dir)
    requests = random_requests(codec, 30, input_len=48, output_len=7, range_ratio=0.0, seed=0)
    assert {r.expected_output_len for r in requests} == {7}
    assert all(len(codec.encode(r.prompt)) == r.prompt_len for r in requests)
    assert sum(r.prompt_len == 48 for r in requests) >= 28  # the round trip is exact nearly always
    assert len({r.prompt for r in requests}) == 30


def test_random_prompts_are_seeded_and_follow_the_range_ratio(bpe_tokenizer_dir):
    codec = LocalTokenCodec(bpe_tokenizer_dir)
    a = random_requests(codec, 40, input_len=40, output_len=20, range_ratio=0.5, seed=3)
    assert a == random_requests(codec, 40, input_len=40, output_len=20, range_ratio=0.5, seed=3)
    assert a != random_requests(codec, 40, input_len=40, output_len=20, range_ratio=0.5, seed=4)
    assert all(10 <= r.expected_output_len <= 30 for r in a)
    assert len({r.expected_output_len for r in a}) > 5
    assert all(15 <= r.prompt_len <= 65 for r in a)


def test_candidate_ids_skip_special_tokens(bpe_tokenizer_dir):
    codec = LocalTokenCodec(bpe_tokenizer_dir)
    assert 0 not in codec.candidate_ids() and 1 not in codec.candidate_ids()  # [UNK], <s>


def test_synthetic_sharegpt_lengths_match_the_published_means():
    inputs, outputs = synthetic_sharegpt_lengths(stream_rng(0, 2), 50000)
    assert inputs.min() >= 4 and outputs.min() >= 4
    assert inputs.max() <= SHAREGPT_MAX_PROMPT and (inputs + outputs).max() <= SHAREGPT_MAX_TOTAL
    assert inputs.mean() == pytest.approx(SHAREGPT_MEAN_INPUT, rel=0.08)
    assert outputs.mean() == pytest.approx(SHAREGPT_MEAN_OUTPUT, rel=0.08)


def test_synthetic_sharegpt_requests(bpe_tokenizer_dir):
    codec = LocalTokenCodec(bpe_tokenizer_dir)
    requests = synthetic_sharegpt_requests(codec, 10, seed=0)
    assert len(requests) == 10
    assert all(len(codec.encode(r.prompt)) == r.prompt_len for r in requests)
    assert all(r.expected_output_len == 5 for r in synthetic_sharegpt_requests(codec, 3, 0, output_len=5))


def test_sharegpt_file_is_filtered_like_vllm(bpe_tokenizer_dir, tmp_path):
    codec = LocalTokenCodec(bpe_tokenizer_dir)
    long_text = " ".join(["word"] * 50)
    data = [{"conversations": [{"from": "human", "value": long_text + str(i)},
                               {"from": "gpt", "value": long_text}]} for i in range(6)]
    data.append({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": long_text}]})
    data.append({"conversations": [{"from": "human", "value": long_text}]})  # no reply: skipped
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    requests = sharegpt_requests(codec, str(path), 6, seed=0)
    assert sorted(r.prompt for r in requests) == sorted(long_text + str(i) for i in range(6))
    assert all(r.expected_output_len == len(codec.encode(long_text)) for r in requests)
    with pytest.raises(ValueError):
        sharegpt_requests(codec, str(path), 7, seed=0)  # "hi" is too short to count
