"""The prefix workloads of `blink bench serve`: a shared prefix with unique suffixes, and multi-turn chat."""
import pytest

from blink.bench.prefix_workload import multi_turn_requests, prefix_requests
from blink.bench.token_codec import LocalTokenCodec


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_shared_prefix_requests_share_their_prefix_and_differ_after(bpe_tokenizer_dir):
    codec = LocalTokenCodec(bpe_tokenizer_dir)
    reqs = prefix_requests(codec, 12, prefix_len=64, input_len=20, output_len=5, range_ratio=0.0, seed=1)
    ids = [codec.encode(r.prompt) for r in reqs]
    assert all(len(i) == r.prompt_len for i, r in zip(ids, reqs, strict=True))
    assert all(60 <= common_prefix(ids[0], other) < len(other) for other in ids[1:]), \
        "the prefix is shared (a token may merge across the join); the suffixes are not"
    assert {r.expected_output_len for r in reqs} == {5}
    assert reqs == prefix_requests(codec, 12, 64, 20, 5, 0.0, seed=1)


def test_multi_turn_resends_each_conversation_so_far(bpe_tokenizer_dir):
    codec = LocalTokenCodec(bpe_tokenizer_dir)
    reqs = multi_turn_requests(codec, 9, turns=3, prefix_len=32, input_len=10, output_len=6, seed=2)
    assert len(reqs) == 9
    convs = 3
    for c in range(convs):
        turns = [reqs[t * convs + c].prompt for t in range(3)]
        assert turns[1].startswith(turns[0]) and turns[2].startswith(turns[1])
        assert reqs[2 * convs + c].prompt_len > reqs[convs + c].prompt_len > reqs[c].prompt_len
    firsts = [codec.encode(reqs[c].prompt) for c in range(convs)]
    assert common_prefix(firsts[0], firsts[1]) >= 28, "one system prompt for every conversation"
    with pytest.raises(ValueError):
        multi_turn_requests(codec, 4, 0, 8, 8, 8, 0)
