"""Whole-server pauses in one repeat's raw requests: moments when (nearly) every stream that is decoding waits
at once for its next token, longer than any step should take.

A slow step or a full prefill chunk delays the streams one at a time or by a step's length; a pause of the
whole server (the front end descheduled, a stalled loop) opens one gap in every stream at the same moment.
The streams are put on one clock by each request's send time (`sent_s`, recorded since 2026-12-01 session 9;
repeats saved before it have none and give None).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from blink.bench.result_folder import unpack_gaps

RESOLUTION_S = 0.001


@dataclass(frozen=True)
class Pause:
    start_s: float  # from the first send
    length_s: float
    streams: int  # streams waiting through all of it
    decoding: int  # streams between their first and last token at its start


def server_pauses(raw: dict, min_gap_s: float = 0.06, share: float = 0.8, min_streams: int = 5) -> list[Pause] | None:
    """Intervals where at least `share` of the decoding streams (and `min_streams`) sit in an inter-token gap
    longer than `min_gap_s`. None when the repeat has no send times."""
    sent = raw.get("sent_s")
    if not sent:
        return None
    gaps = unpack_gaps(raw["itls"])
    streams = [(s, f, g) for s, f, g, ok in zip(sent, raw["ttfts"], gaps, raw["success"], strict=True)
               if ok and s is not None and len(g) > 0]
    if not streams:
        return []
    end = max(s + f + sum(g) for s, f, g in streams)
    n = int(np.ceil(end / RESOLUTION_S)) + 2
    waiting, decoding = np.zeros(n, np.int32), np.zeros(n, np.int32)

    def mark(counter, a, b):  # +1 on the grid cells [a, b)
        i, j = int(a / RESOLUTION_S), int(b / RESOLUTION_S)
        if j > i:
            counter[i] += 1
            counter[j] -= 1

    for s, f, g in streams:
        times = s + f + np.concatenate([[0.0], np.cumsum(g)])
        mark(decoding, times[0], times[-1])
        for k in np.flatnonzero(np.asarray(g) > min_gap_s):
            mark(waiting, times[k], times[k + 1])
    waiting, decoding = np.cumsum(waiting), np.cumsum(decoding)
    stalled = (waiting >= min_streams) & (waiting >= share * decoding)
    pauses = []
    edges = np.flatnonzero(np.diff(np.concatenate([[0], stalled.astype(np.int8), [0]])))
    for i, j in zip(edges[::2], edges[1::2], strict=True):
        pauses.append(Pause(round(i * RESOLUTION_S, 3), round((j - i) * RESOLUTION_S, 3), int(waiting[i:j].min()),
                            int(decoding[i])))
    return pauses
