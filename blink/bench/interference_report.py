"""The interference report: every point's repeats summarised (median, min-max, bootstrap interval),
written as results.md and summary.json, and plotted with error bars (interference_plots.py).

A table cell reads `median [min-max]` over the point's repeats. "pooled P99" is the percentile over the
requests of all repeats together (from the raw latencies) with its 95% bootstrap interval.
Retention is the point's output throughput over the isolated point's (same layout, mode, variant, rate),
median over median, with the extremes of the two sets of repeats.

Throughput and energy per token come in two definitions. Points since 2026-12-03 count every token the client
received before the drain deadline, cancelled requests' included, over the fixed window (runner.LoadOutcome);
older points count finished requests' tokens only, over the time to the last one. A cell or ratio uses the
newer one only where every repeat it reads has it, so no ratio mixes the two.
"""
from __future__ import annotations

import json
import os

from blink.bench.result_folder import (
    ISOLATED,
    condition,
    group_repeats,
    load_points,
    load_runs,
    point_key,
    request_samples,
)
from blink.bench.server_report import pauses_section, steps_section
from blink.bench.stats import cell, pooled_percentile, ratio_spread, spread

# metric -> (the newer definition's field, where a repeat has it) (the module's docstring)
WINDOWED = {"output_throughput": lambda p: p["bench"].get("window_output_throughput"),
            "energy_per_output_token_mj": lambda p: p.get("energy_per_streamed_token_mj")}


def values(repeats: list[dict], name: str, *others: list[dict]) -> list:
    """The metric over these repeats, in the newer definition if these and `others` all have it."""
    newer = WINDOWED.get(name)
    if newer and all(newer(p) is not None for p in [*repeats, *(p for o in others for p in o)]):
        return [newer(p) for p in repeats]
    return [METRICS[name](p) for p in repeats]


def _sum(a: float | None, b: float | None) -> float | None:
    return a + b if a is not None and b is not None else None


# name -> how one repeat gives it
METRICS = {
    "p50_ttft_ms": lambda p: p["bench"]["median_ttft_ms"],
    "p99_ttft_ms": lambda p: p["bench"]["p99_ttft_ms"],
    "p50_tpot_ms": lambda p: p["bench"]["median_tpot_ms"],
    "p99_tpot_ms": lambda p: p["bench"]["p99_tpot_ms"],
    "p50_itl_ms": lambda p: p["bench"]["median_itl_ms"],
    "p99_itl_ms": lambda p: p["bench"]["p99_itl_ms"],
    "output_throughput": lambda p: p["bench"]["output_throughput"],
    "energy_per_output_token_mj": lambda p: p.get("energy_per_output_token_mj"),
    "cpu_energy_per_token_mj": lambda p: p.get("cpu_energy_per_streamed_token_mj"),
    "gpu_cpu_energy_per_token_mj": lambda p: _sum(p.get("energy_per_streamed_token_mj"),
                                                  p.get("cpu_energy_per_streamed_token_mj")),
    "engine_cpu_s_per_1k_tokens": lambda p: p.get("engine_cpu_s_per_1k_tokens"),
    "gpu_mean_power_w": lambda p: p.get("gpu_mean_power_w"),
    "server_idle_power_w": lambda p: p.get("server_idle_power_w"),
}
POOLED = ("ttft", "tpot")  # pooled P99 over the raw requests
# The Blink paper's headline ratios as issue 19 quotes them: host-style baseline over Blink for P99 TTFT and
# P99 TPOT, Blink over baseline for throughput, and Blink's energy per token relative to the baseline.
PAPER_RATIOS = {"p99_ttft": 8.47, "p99_tpot": 3.40, "throughput": 2.1, "energy": -0.486}


def summarize_point(repeats: list[dict]) -> dict:
    first = repeats[0]
    row = {k: first.get(k, "") for k in ("mode", "layout", "attack_kind", "attack_level", "variant",
                                         "request_rate")}
    row["repeats"] = len(repeats)
    row["runs"] = sorted({p["run_id"] for p in repeats})
    row["completed"] = spread([p["bench"]["completed"] for p in repeats])
    row["failed_total"] = sum(p["bench"]["failed"] for p in repeats)
    row["incomplete_total"] = sum(p["bench"].get("incomplete", 0) for p in repeats)
    # repeats merge across sessions and the code changes between them (code_version.py; older points lack it)
    shas = [(p.get("code") or {}).get("source_sha") for p in repeats]
    row["code_versions"] = sorted({sha for sha in shas if sha})
    row["code_unrecorded"] = shas.count(None)
    for name in METRICS:
        row[name] = spread(values(repeats, name))
    for metric in POOLED:
        groups = [[x * 1000.0 for x in request_samples(p, metric)] for p in repeats]
        row[f"pooled_p99_{metric}_ms"] = pooled_percentile(groups, 99, resamples=500)
    return row


def add_retention(rows: list[dict], groups: dict[tuple, list[dict]]) -> None:
    """Each row's throughput over its isolated twin's, with the spread of both sets of repeats."""
    for row in rows:
        twin = (row["mode"], row["layout"], ISOLATED, 0.0, row["variant"], row["request_rate"])
        base = groups.get(twin)
        own = groups[point_key(row)]
        row["retention"] = (ratio_spread(values(own, "output_throughput", base), values(base, "output_throughput", own))
                            if base else spread([]))


def summarize(points: list[dict]) -> list[dict]:
    groups = group_repeats(points)
    rows = [summarize_point(repeats) for repeats in groups.values()]
    add_retention(rows, groups)
    return rows


def with_repeats(points: list[dict]) -> list[dict]:
    """summarize(), each row also holding its repeats under "_repeats" (not written to summary.json)."""
    groups = group_repeats(points)
    rows = summarize(points)
    for row in rows:
        row["_repeats"] = groups[point_key(row)]
    return rows


def pooled_cell(s: dict) -> str:
    if s["value"] is None:
        return "-"
    return f"{s['value']:.1f} ({s['ci_low']:.1f}-{s['ci_high']:.1f})"


def code_cell(r: dict) -> str:
    """How many different sources measured a point's repeats, and how many repeats did not record theirs."""
    known = len(r["code_versions"])
    return f"{known} (+{r['code_unrecorded']} unrecorded)" if r["code_unrecorded"] else str(known)


def markdown_table(rows: list[dict]) -> str:
    header = ("| layout | mode | condition | rate (req/s) | repeats | done | failed | incomplete | out tok/s | "
              "retention | P50 TTFT (ms) | P99 TTFT (ms) | pooled P99 TTFT (ms) | P50 TPOT (ms) | "
              "P99 TPOT (ms) | P99 ITL (ms) | engine CPU s / 1k tok | mJ / out tok | CPU mJ / out tok | idle W | "
              "code versions |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for r in rows:
        lines.append("| " + " | ".join([
            r["layout"], r["mode"], condition(r), f"{r['request_rate']:.2f}", str(r["repeats"]),
            cell(r["completed"], 0), str(r["failed_total"]), str(r["incomplete_total"]),
            cell(r["output_throughput"]), cell(r["retention"], 3), cell(r["p50_ttft_ms"]),
            cell(r["p99_ttft_ms"]), pooled_cell(r["pooled_p99_ttft_ms"]), cell(r["p50_tpot_ms"], 2),
            cell(r["p99_tpot_ms"], 2), cell(r["p99_itl_ms"], 2), cell(r["engine_cpu_s_per_1k_tokens"], 3),
            cell(r["energy_per_output_token_mj"]), cell(r["cpu_energy_per_token_mj"]), cell(r["server_idle_power_w"]),
            code_cell(r),
        ]) + " |")
    return "\n".join(lines) + "\n"


def mode_ratios(rows: list[dict], base: str = "host", ours: str = "device") -> list[dict]:
    """Per (layout, condition, rate) with both modes: base/ours P99 TTFT and TPOT, ours/base throughput
    and ours/base - 1 energy per token, each from the two modes' repeats (stats.ratio_spread)."""
    groups: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        groups.setdefault((r["layout"], r["attack_kind"], r["attack_level"], r["variant"], r["request_rate"]),
                          {})[r["mode"]] = r
    found = []
    for by_mode in groups.values():
        if base not in by_mode or ours not in by_mode:
            continue
        b, o = by_mode[base]["_repeats"], by_mode[ours]["_repeats"]
        get = lambda reps, name, o=o, b=b: values(reps, name, o, b)
        energy = less_one(ratio_spread(get(o, "energy_per_output_token_mj"), get(b, "energy_per_output_token_mj")))
        both = less_one(ratio_spread(get(o, "gpu_cpu_energy_per_token_mj"), get(b, "gpu_cpu_energy_per_token_mj")))
        found.append({"row": by_mode[ours], "p99_ttft": ratio_spread(get(b, "p99_ttft_ms"), get(o, "p99_ttft_ms")),
                      "p99_tpot": ratio_spread(get(b, "p99_tpot_ms"), get(o, "p99_tpot_ms")),
                      "throughput": ratio_spread(get(o, "output_throughput"), get(b, "output_throughput")),
                      "energy": energy, "energy_with_cpu": both})
    return found


def less_one(s: dict) -> dict:
    """A ratio's spread as a relative difference (ratio - 1)."""
    return {k: v - 1.0 if k != "n" and v is not None else v for k, v in s.items()}


def ratio_cell(s: dict, digits: int = 2) -> str:
    if s.get("median") is None:
        return "-"
    return f"{s['median']:.{digits}f} [{s['ci_low']:.{digits}f}, {s['ci_high']:.{digits}f}]"


def ratios_section(rows: list[dict]) -> str:
    """Our device-vs-host ratios (median [95% bootstrap interval over both modes' repeats]) beside the paper's."""
    lines = ["## Device mode against host mode, beside the Blink paper's headline ratios\n",
             "Mode: device, then every other mode measured (a `--mode-variant`, an `--extra-base-url` server), each "
             "set against plain host mode.\n",
             "| layout | mode | condition | rate (req/s) | P99 TTFT host/mode | P99 TPOT host/mode | "
             "throughput mode/host | energy per token mode/host - 1 | GPU + CPU energy per token mode/host - 1 |",
             "|---|---|---|---|---|---|---|---|---|",
             f"| Blink paper | device | headline | - | {PAPER_RATIOS['p99_ttft']:.2f} | "
             f"{PAPER_RATIOS['p99_tpot']:.2f} | {PAPER_RATIOS['throughput']:.2f} | {PAPER_RATIOS['energy']:+.3f} | - |"]
    ours = ["device"] + sorted({r["mode"] for r in rows} - {"device", "host"})
    for r in [r for mode in ours for r in mode_ratios(rows, ours=mode)]:
        row = r["row"]
        lines.append(f"| {row['layout']} | {row['mode']} | {condition(row)} | {row['request_rate']:g} | "
                     f"{ratio_cell(r['p99_ttft'])} | {ratio_cell(r['p99_tpot'])} | {ratio_cell(r['throughput'])} | "
                     f"{ratio_cell(r['energy'], 3)} | {ratio_cell(r['energy_with_cpu'], 3)} |")
    return "\n".join(lines) + "\n"


def runs_section(runs: list[dict]) -> str:
    lines = ["## Runs\n", "| run | repeats | knobs | cgroup | GPU idle W before the sweep |", "|---|---|---|---|---|"]
    for run in runs:
        plan = run.get("plan", [])
        idle = (run.get("gpu_idle_power_before_sweep") or {}).get("mean_w")
        knobs = dict(run.get("knobs") or {})
        given = run.get("args") or {}
        knobs.update(frontend_nice=given.get("frontend_nice"), serve_args=given.get("serve_args") or None)
        knobs = ", ".join(f"{k}={v}" for k, v in knobs.items() if v is not None) or "-"
        lines.append(f"| {run['run_id']} | {','.join(str(r['repeat']) for r in plan)} | {knobs} | "
                     f"{run.get('cgroup_support', '-')} | {'-' if idle is None else f'{idle:.1f}'} |")
    return "\n".join(lines) + "\n"


def write_report(result_dir: str, plots: bool = True) -> list[str]:
    """Regenerate results.md, summary.json and (plots=True) the plots from every repeat in the folder. The sweep
    writes the tables after every point and the plots once at its end: at 93 points drawing them took 3.3 s
    (the CPU machine, 2026-12-04), and a point ~32 s of the GPU machine's time."""

    rows = with_repeats(load_points(result_dir))
    written = [os.path.join(result_dir, "results.md"), os.path.join(result_dir, "summary.json")]
    with open(written[0], "w", encoding="utf-8") as f:
        f.write("# Interference results\n\nGenerated by `blink bench interference` from points/*/*.json: "
                "each cell is the median [min-max] over the point's repeats; pooled P99 is over all "
                "repeats' requests with a 95% bootstrap interval.\n\n")
        f.write(markdown_table(rows))
        f.write("\n" + ratios_section(rows))
        f.write("\n" + steps_section(rows))
        f.write("\n" + pauses_section(rows))
        f.write("\n" + runs_section(load_runs(result_dir)))
    with open(written[1], "w", encoding="utf-8") as f:
        json.dump([{k: v for k, v in r.items() if k != "_repeats"} for r in rows], f, indent=1)
    if plots:
        from blink.bench.interference_plots import plot_layout

        for layout in sorted({r["layout"] for r in rows}):
            written += plot_layout([r for r in rows if r["layout"] == layout], result_dir, layout)
    return written
