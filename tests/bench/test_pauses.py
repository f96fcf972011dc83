"""Whole-server pauses: one gap in every decoding stream at once is found; slow tokens spread over time are not."""
from blink.bench.metrics import RequestResult
from blink.bench.pauses import server_pauses
from blink.bench.result_folder import raw_requests


def streams(gap_at_token, n=10, step=0.01, tokens=100, sent_every=0.05, slow=0.15):
    """n requests sent `sent_every` apart, first token 20 ms after the send, then `tokens` gaps of `step`;
    gap_at_token(i) gives the index of stream i's one slow gap (`slow` s), or None."""
    results = []
    for i in range(n):
        itl = [step] * tokens
        k = gap_at_token(i)
        if k is not None:
            itl[k] = slow
        results.append(RequestResult(success=True, prompt_len=4, output_tokens=tokens + 1, ttft=0.02,
                                     itl=itl, latency=0.02 + sum(itl), start_time=100.0 + i * sent_every))
    return results


def test_one_gap_in_every_stream_at_once_is_a_pause():
    # Stream i is sent at 0.05 i and reaches token k at 0.05 i + 0.02 + 0.01 k: the slow gap in every stream
    # opens at 0.72 s when k = 70 - 5 i.
    raw = raw_requests(streams(lambda i: 70 - 5 * i))
    assert raw["sent_s"][0] == 0.0 and raw["sent_s"][-1] == 0.45
    (pause,) = server_pauses(raw)
    assert abs(pause.start_s - 0.72) < 0.003 and abs(pause.length_s - 0.15) < 0.003
    assert pause.streams == 10 and pause.decoding == 10


def test_slow_tokens_spread_over_time_are_no_pause():
    assert server_pauses(raw_requests(streams(lambda i: 10 + 8 * i))) == []
    assert server_pauses(raw_requests(streams(lambda i: None))) == []


def test_a_pause_most_streams_decode_through_is_none():
    # 6 of 10 streams stall together: more than min_streams, under the 80% share.
    assert server_pauses(raw_requests(streams(lambda i: 70 - 5 * i if i < 6 else None))) == []


def test_repeats_saved_without_send_times_give_none():
    raw = raw_requests(streams(lambda i: 70 - 5 * i))
    del raw["sent_s"]
    assert server_pauses(raw) is None


def test_the_report_lists_each_timed_repeat_and_counts_the_untimed(tmp_path):
    from blink.bench.server_report import pauses_section
    timed = {"run_id": "a", "repeat": 0, "requests": raw_requests(streams(lambda i: 70 - 5 * i)),
             "frontend_gc": {"gen0_count": 40.0, "gen0_seconds": 0.004, "gen2_count": 1.0, "gen2_seconds": 0.142}}
    untimed = {"run_id": "b", "repeat": 1, "requests": {}}
    row = {"layout": "split", "mode": "device", "attack_kind": "none", "attack_level": 0.0, "variant": "",
           "request_rate": 24.0, "_repeats": [timed, untimed]}
    text = pauses_section([row])
    assert "| split | device | isolated | 24.00 | a-r0 | 0.72 s 150 ms 10/10 | 1 / 142 ms |" in text
    assert "1 repeats were saved before send times" in text


def test_front_end_collections_are_read_from_metrics_as_a_difference(monkeypatch):
    from blink.bench import server_stalls

    texts = iter([
        '# TYPE blink:frontend_gc_pause_seconds histogram\n'
        'blink:frontend_gc_pause_seconds_count{generation="2",model_name="m"} 1.0\n'
        'blink:frontend_gc_pause_seconds_sum{generation="2",model_name="m"} 0.1\n',
        '# TYPE blink:frontend_gc_pause_seconds histogram\n'
        'blink:frontend_gc_pause_seconds_count{generation="2",model_name="m"} 3.0\n'
        'blink:frontend_gc_pause_seconds_sum{generation="2",model_name="m"} 0.4\n',
    ])

    class Response:
        status_code = 200

        def __init__(self):
            self.text = next(texts)

    monkeypatch.setattr(server_stalls.httpx, "get", lambda url, timeout: Response())
    before = server_stalls.read_server("http://x").gc
    after = server_stalls.read_server("http://x").gc
    assert server_stalls.gc_delta(before, after) == {"gen2_count": 2.0, "gen2_seconds": 0.3}
    assert server_stalls.gc_delta(None, after) is None
