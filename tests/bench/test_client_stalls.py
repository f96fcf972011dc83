"""The load generator's own stalls (blink/bench/client_stalls.py): a blocked client loop and its collections are
recorded with their times, put on the send-time clock, and marked on the whole-server pauses they overlap."""
from __future__ import annotations

import asyncio
import gc
import time

from blink.bench.client_stalls import ClientStallRecorder, collector_held, stalls_in
from blink.bench.result_folder import raw_requests
from blink.bench.server_report import pauses_section
from tests.bench.test_pauses import streams


def test_a_blocked_loop_and_a_full_collection_are_recorded_with_their_times():
    async def run():
        recorder = ClientStallRecorder()
        recorder.start()
        await asyncio.sleep(0.05)  # the timer's first ticks
        blocked_at = time.perf_counter()
        time.sleep(0.15)  # holds the loop, as a collection or a descheduled client would
        await asyncio.sleep(0.05)
        gc.collect()
        await recorder.stop()
        return recorder, blocked_at

    recorder, blocked_at = asyncio.run(run())
    (end, lag), = [(e, lag) for e, lag in recorder.loop_lags if lag > 0.1]
    assert 0.1 < lag < 0.3 and abs((end - lag) - blocked_at) < 0.05
    assert any(gen == 2 for _, gen, _ in recorder.gcs)
    n = len(recorder.gcs)
    gc.collect()
    assert len(recorder.gcs) == n  # stop() took the callback out again
    relative = recorder.relative_to(blocked_at - 1.0)
    start_s, seconds = next(x for x in relative["loop_lags"] if x[1] > 0.1)
    assert abs(start_s - 1.0) < 0.05 and seconds == round(lag, 6)


def test_no_collection_runs_while_the_collector_is_held():
    """Cyclic garbage far past every generation's threshold: no automatic collection inside the block (the recorder
    sees none), the heap frozen; after it the collector is on again, unfrozen, and collects that garbage."""
    class Node:
        pass

    def cycles(n):
        for _ in range(n):
            a, b = Node(), Node()
            a.other, b.other = b, a

    recorder = ClientStallRecorder(min_lag_s=1.0, collector_held=True)
    try:
        with collector_held():  # its own first collection comes before the recorder's callback
            gc.callbacks.append(recorder._on_gc)
            assert not gc.isenabled() and gc.get_freeze_count() > 0
            cycles(50 * max(gc.get_threshold()))
            assert recorder.gcs == []
        assert gc.isenabled() and gc.get_freeze_count() == 0
        cycles(50 * max(gc.get_threshold()))  # the same garbage with the collector on: collections run
        assert recorder.gcs
    finally:
        gc.callbacks.remove(recorder._on_gc)
    assert recorder.relative_to(0.0)["collector_held"]


def test_stalls_overlapping_a_pause_are_named():
    stalls = {"loop_lags": [[0.70, 0.16], [3.0, 0.03]], "gcs": [[0.75, 2, 0.012], [5.0, 1, 0.001]]}
    assert stalls_in(stalls, 0.72, 0.15) == ["lag 160 ms", "gc2 12 ms"]
    assert stalls_in(stalls, 1.0, 0.5) == []
    assert stalls_in(None, 0.72, 0.15) == []


def test_the_pauses_table_marks_what_the_client_did_during_each_pause():
    raw = raw_requests(streams(lambda i: 70 - 5 * i))  # one pause at 0.72 s, 150 ms
    row = {"layout": "split", "mode": "device", "attack_kind": "none", "attack_level": 0.0, "variant": "",
           "request_rate": 24.0, "_repeats": [
               {"run_id": "a", "repeat": 0, "requests": raw, "client_stalls": {"loop_lags": [[0.71, 0.15]], "gcs": []}},
               {"run_id": "b", "repeat": 0, "requests": raw, "client_stalls": {"loop_lags": [], "gcs": []}},
               {"run_id": "c", "repeat": 0, "requests": raw}]}  # before session 11: not recorded
    text = pauses_section([row])
    assert "| a-r0 | 0.72 s 150 ms 10/10 (client: lag 150 ms) |" in text
    assert "| b-r0 | 0.72 s 150 ms 10/10 (client: none) |" in text
    assert "| c-r0 | 0.72 s 150 ms 10/10 |" in text
