"""PNG plots of the interference summary rows: a marker at the median over repeats, an error bar from
the min to the max, per (mode, condition) series against the request rate."""
from __future__ import annotations

import os
from collections import defaultdict


def _series(rows: list[dict]) -> dict[tuple[str, str], list[dict]]:
    from blink.bench.result_folder import condition

    series = defaultdict(list)
    for r in rows:
        series[(r["mode"], condition(r))].append(r)
    return {k: sorted(v, key=lambda r: r["request_rate"]) for k, v in series.items()}


def _errorbar(ax, rows: list[dict], metric: str, label: str, style: str) -> bool:
    """Plot one series; False when it has no value for `metric`."""
    pts = [(r["request_rate"], r[metric]) for r in rows if r[metric].get("median") is not None]
    if not pts:
        return False
    rates = [rate for rate, _ in pts]
    med = [s["median"] for _, s in pts]
    err = [[s["median"] - s["min"] for _, s in pts], [s["max"] - s["median"] for _, s in pts]]
    ax.errorbar(rates, med, yerr=err, fmt=style, marker="o", capsize=3, label=label)
    return True


def _figure(rows: list[dict], panels: list[tuple[str, str, bool]], path: str, title: str,
            skip_isolated: bool = False) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    plain = FuncFormatter(lambda value, _: f"{value:g}")
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    for ax, (metric, label, log) in zip(axes[0], panels, strict=True):
        drawn = False
        for (mode, cond), series in _series(rows).items():
            if skip_isolated and cond.startswith("isolated"):
                continue
            drawn |= _errorbar(ax, series, metric, f"{mode}, {cond}", "-" if cond == "isolated" else "--")
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(label)
        if log and drawn:
            ax.set_yscale("log")  # a tail that blows up spans orders of magnitude
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(plain)
        if metric == "retention":
            ax.axhline(1.0, color="grey", linewidth=0.8)
            ax.set_ylim(bottom=0.0)  # from zero, so that noise of a percent does not look like a collapse
        ax.grid(True, alpha=0.3)
        if drawn:
            ax.legend(fontsize=7)
    fig.suptitle(title + " (median over repeats, bars: min-max)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_layout(rows: list[dict], result_dir: str, layout: str) -> list[str]:
    """latency_, retention_ and energy_<layout>.png; returns their paths."""
    return [
        _figure(rows, [("p99_ttft_ms", "P99 TTFT (ms)", True), ("p99_tpot_ms", "P99 TPOT (ms)", True)],
                os.path.join(result_dir, f"latency_{layout}.png"), f"tail latency vs load ({layout} cores)"),
        _figure(rows, [("retention", "output throughput, colocated / isolated", False)],
                os.path.join(result_dir, f"retention_{layout}.png"), f"throughput retention ({layout} cores)",
                skip_isolated=True),
        _figure(rows, [("energy_per_output_token_mj", "GPU energy per output token (mJ)", False)],
                os.path.join(result_dir, f"energy_{layout}.png"), f"energy per token ({layout} cores)"),
    ]
