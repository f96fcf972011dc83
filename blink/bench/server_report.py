"""What the server saw during each point, beside the client's numbers (interference_report.py writes both):
its engine steps (tokens per step, energy per step, preemptions) and its whole-server pauses with the stalls
the server recorded around them (server_stalls.py) and the client's own (client_stalls.py)."""
from __future__ import annotations

from blink.bench.client_stalls import stalls_in
from blink.bench.pauses import server_pauses
from blink.bench.result_folder import condition
from blink.bench.stats import cell, spread


def steps_section(rows: list[dict]) -> str:
    """Per point, the engine's steps over the load, tokens per step and GPU energy per step (median [min-max]
    over the repeats that recorded them): at a fixed request rate a faster engine runs more, smaller steps, and
    each decode step reads every weight, so its energy per token can rise while its latency falls."""
    lines = ["## Engine steps\n", "Steps the engine ran over each repeat's load (blink:engine_steps before and after), "
             "generated tokens per step, and the GPU's energy per step (the point's NVML energy over its steps); "
             "median [min-max] over the repeats that recorded them (since 2026-12-01 session 10).\n",
             "| layout | mode | condition | rate (req/s) | repeats | steps | tokens / step | mJ / step | preemptions |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        found = [(p["engine_steps"], p.get("gpu_energy_mj")) for p in row["_repeats"]
                 if p.get("engine_steps") and p["engine_steps"]["steps"]]
        if not found:
            continue
        per_step = [mj / e["steps"] if mj is not None else None for e, mj in found]
        preempted = [e.get("preemptions") for e, _ in found]
        lines.append(f"| {row['layout']} | {row['mode']} | {condition(row)} | {row['request_rate']:.2f} | "
                     f"{len(found)} | {cell(spread([e['steps'] for e, _ in found]), 0)} | "
                     f"{cell(spread([e['tokens_per_step'] for e, _ in found]), 2)} | {cell(spread(per_step))} | "
                     f"{cell(spread(preempted), 0)} |")
    if len(lines) == 4:
        lines = lines[:2] + ["No repeat recorded the engine's steps.\n"]
    return "\n".join(lines) + "\n"


def full_gcs_cell(gc: dict | None) -> str:
    """The point's full (generation 2) collections: "n / t ms", "0" when none, "-" when unknown. A front end
    that had made no full collection before the point reports no generation-2 series at all, one that had
    made some reports a difference of 0: both are none."""
    if gc is None:
        return "-"
    count = gc.get("gen2_count", 0)
    return f"{count:g} / {gc.get('gen2_seconds', 0.0) * 1000:.0f} ms" if count else "0"


def stall_cell(stalls: dict | None, series: str) -> str:
    """Over 50 / over 100 ms, and the longest's bucket bound: "2 / 1, <= 250 ms"; "-" when unknown."""
    found = (stalls or {}).get(series)
    if found is None:
        return "-"
    le = found["longest_le"]
    if le is None:
        return f"{found['over_50ms']} / {found['over_100ms']}"
    finite = [float(b) for b in found["buckets"] if b != "+Inf"]
    bound = f"<= {float(le) * 1000:g} ms" if le != "+Inf" else f"> {max(finite, default=0.0) * 1000:g} ms"
    return f"{found['over_50ms']} / {found['over_100ms']}, {bound}"


def client_mark(stalls: dict | None, start_s: float, length_s: float) -> str:
    """" (client: lag 230 ms)" for the client's stalls overlapping a pause; " (client: none)"; "" unrecorded."""
    if stalls is None:
        return ""
    return f" (client: {', '.join(stalls_in(stalls, start_s, length_s)) or 'none'})"


def pauses_section(rows: list[dict]) -> str:
    """Each repeat's whole-server pauses (pauses.server_pauses): when at least 80% of the decoding streams
    wait over 60 ms for a token at once; beside them what the front end saw over the point."""
    lines = ["## Whole-server pauses\n", "Moments when at least 80% of the streams decoding (and 5 or more) sat in "
             "an inter-token gap over 60 ms at once (blink/bench/pauses.py): start s from the first send, length "
             "ms, streams waiting / decoding. Beside them, over the whole point, from the front end's /metrics "
             "(blink/bench/server_stalls.py): its full (generation 2) garbage collections, count / total ms; its "
             "event loop's lags (a blocked loop) and the egress gaps while requests were in flight (the engine "
             "silent, or the front end's reader held up with the loop), and the engine's own busy step intervals "
             "(its clock: the GPU's in device mode; a stalled engine shows here, a front end that stopped reading "
             "does not), each as count over 50 ms / over 100 ms and the histogram bound of the longest; - where "
             "the server does not report it. In brackets after a pause, the client's own stalls that overlap it "
             "(blink/bench/client_stalls.py: its event loop's lags over 20 ms and its collections of generation 1 "
             "and 2, recorded since 2026-12-02 session 11; a pause the load generator made is not the server's): "
             "\"client: none\" when it recorded none.\n",
             "| layout | mode | condition | rate (req/s) | repeat | pauses | front-end full GCs | "
             "loop lags > 50 / > 100 ms | egress gaps > 50 / > 100 ms | engine step intervals > 50 / > 100 ms |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    untimed = 0
    for row in rows:
        for point in row["_repeats"]:
            found = server_pauses(point.get("requests") or {})
            if found is None:
                untimed += 1
                continue
            cells = "; ".join(f"{p.start_s:.2f} s {p.length_s * 1000:.0f} ms {p.streams}/{p.decoding}"
                              + client_mark(point.get("client_stalls"), p.start_s, p.length_s)
                              for p in found) or "none"
            stalls = point.get("frontend_stalls")  # None or absent: not measured
            front = [full_gcs_cell(point.get("frontend_gc")),
                     *(stall_cell(stalls, series) for series in ("loop_lag", "egress_gap", "engine_interval"))]
            lines.append(f"| {row['layout']} | {row['mode']} | {condition(row)} | {row['request_rate']:.2f} | "
                         f"{point['run_id']}-r{point['repeat']} | {cells} | {' | '.join(front)} |")
    if len(lines) == 4:
        lines = lines[:2]  # no timed repeat: no table
    if untimed:
        lines.append(f"\n{untimed} repeats were saved before send times were recorded: no pauses read from them.")
    return "\n".join(lines) + "\n"
