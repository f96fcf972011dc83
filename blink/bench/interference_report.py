"""The interference result folder: one JSON per point, a markdown table and PNG plots of them all.

Layout of a folder: points/<mode>__<layout>__<attack>-x<level>__rate-<rate>.json, results.md,
latency_<layout>.png, retention_<layout>.png, logs/.
"""
from __future__ import annotations

import glob
import json
import os
from collections import defaultdict

ISOLATED = "none"


def point_name(mode: str, layout: str, attack_kind: str, attack_level: float, rate: float) -> str:
    return f"{mode}__{layout}__{attack_kind}-x{attack_level:g}__rate-{rate:g}"


def save_point(result_dir: str, point: dict) -> str:
    """Write (or replace) a point's JSON; returns its path."""
    os.makedirs(os.path.join(result_dir, "points"), exist_ok=True)
    name = point_name(point["mode"], point["layout"], point["attack_kind"], point["attack_level"],
                      point["request_rate"])
    path = os.path.join(result_dir, "points", name + ".json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(point, f, indent=2)
    return path


def load_points(result_dir: str) -> list[dict]:
    points = []
    for path in sorted(glob.glob(os.path.join(result_dir, "points", "*.json"))):
        with open(path, encoding="utf-8") as f:
            points.append(json.load(f))
    return sorted(points, key=lambda p: (p["layout"], p["mode"], p["attack_kind"] != ISOLATED,
                                         p["attack_kind"], p["attack_level"], p["request_rate"]))


def condition(point: dict) -> str:
    """The attack condition of a point, as a legend label."""
    if point["attack_kind"] == ISOLATED:
        return "isolated"
    return f"{point['attack_kind']} x{point['attack_level']:g}"


def retention(point: dict, points: list[dict]) -> float | None:
    """Output throughput of this point over that of the isolated point with the same mode/layout/rate."""
    for other in points:
        same = all(other[k] == point[k] for k in ("mode", "layout", "request_rate"))
        if same and other["attack_kind"] == ISOLATED:
            base = other["bench"]["output_throughput"]
            return point["bench"]["output_throughput"] / base if base else None
    return None


def _fmt(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def markdown_table(points: list[dict]) -> str:
    header = ("| layout | mode | condition | rate (req/s) | done | failed | incomplete | out tok/s | "
              "retention | P99 TTFT (ms) | P99 TPOT (ms) | mean ITL (ms) | engine CPU s / 1k tok | "
              "mJ / out tok | GPU util % |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for p in points:
        b = p["bench"]
        lines.append("| " + " | ".join([
            p["layout"], p["mode"], condition(p), _fmt(p["request_rate"], 2), str(b["completed"]),
            str(b["failed"]), str(b.get("incomplete", 0)), _fmt(b["output_throughput"]),
            _fmt(retention(p, points), 3), _fmt(b["p99_ttft_ms"]), _fmt(b["p99_tpot_ms"], 2),
            _fmt(b["mean_itl_ms"], 2), _fmt(p.get("engine_cpu_s_per_1k_tokens"), 3),
            _fmt(p.get("energy_per_output_token_mj"), 1), _fmt(p.get("gpu_mean_utilization_pct"), 1),
        ]) + " |")
    return "\n".join(lines) + "\n"


def _series(points: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """(mode, condition) -> its points by rate."""
    series = defaultdict(list)
    for p in points:
        series[(p["mode"], condition(p))].append(p)
    return {k: sorted(v, key=lambda p: p["request_rate"]) for k, v in series.items()}


def plot_latency(points: list[dict], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    plain = FuncFormatter(lambda value, _: f"{value:g}")
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for (mode, cond), series in _series(points).items():
        rates = [p["request_rate"] for p in series]
        style = "-" if cond == "isolated" else "--"
        for ax, key in zip(axes, ("p99_ttft_ms", "p99_tpot_ms"), strict=True):
            ax.plot(rates, [p["bench"][key] for p in series], style, marker="o", label=f"{mode}, {cond}")
    for ax, label in zip(axes, ("P99 TTFT (ms)", "P99 TPOT (ms)"), strict=True):
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(label)
        ax.set_yscale("log")  # a tail that blows up spans orders of magnitude
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_retention(points: list[dict], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (mode, cond), series in _series(points).items():
        if cond == "isolated":
            continue
        pairs = [(p["request_rate"], retention(p, points)) for p in series]
        pairs = [(rate, value) for rate, value in pairs if value is not None]
        if pairs:
            ax.plot(*zip(*pairs, strict=True), marker="o", label=f"{mode}, {cond}")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    top = max([1.05] + [max(line.get_ydata()) + 0.05 for line in ax.lines[:-1]])
    ax.set_ylim(0.0, top)  # from zero, so that noise of a percent does not look like a collapse
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("output throughput, colocated / isolated")
    ax.grid(True, alpha=0.3)
    if len(ax.lines) > 1:  # the reference line plus at least one series
        ax.legend(fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(result_dir: str) -> list[str]:
    """Regenerate results.md and the plots from every point in the folder; returns the files written."""
    points = load_points(result_dir)
    written = [os.path.join(result_dir, "results.md")]
    with open(written[0], "w", encoding="utf-8") as f:
        f.write("# Interference results\n\nGenerated by `blink bench interference` from points/*.json.\n\n")
        f.write(markdown_table(points))
    for layout in sorted({p["layout"] for p in points}):
        subset = [p for p in points if p["layout"] == layout]
        latency_png = os.path.join(result_dir, f"latency_{layout}.png")
        plot_latency(subset, latency_png, f"tail latency vs load ({layout} cores)")
        retention_png = os.path.join(result_dir, f"retention_{layout}.png")
        plot_retention(subset, retention_png, f"throughput retention ({layout} cores)")
        written += [latency_png, retention_png]
    return written
