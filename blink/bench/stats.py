"""Statistics over repeated trials: the median, the min-max spread and a seeded bootstrap interval.

One point of the interference lab is measured several times (repeats). A repeat's P99 TTFT is one
number; over repeats we report the median with its min and max, and a percentile-bootstrap interval of
the median. With the raw per-request latencies kept, a percentile can also be taken over the requests of
all repeats pooled, with a bootstrap interval that resamples requests within each repeat (so that every
resample keeps each repeat's share of the requests).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

DEFAULT_RESAMPLES = 2000
DEFAULT_LEVEL = 0.95


def _clean(values: Sequence[float | None]) -> np.ndarray:
    return np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=np.float64)


def bootstrap_interval(values: Sequence[float], statistic: Callable[[np.ndarray], float] = np.median,
                       resamples: int = DEFAULT_RESAMPLES, level: float = DEFAULT_LEVEL,
                       seed: int = 0) -> tuple[float, float] | None:
    """Percentile bootstrap interval of `statistic` over `values`; None for an empty sample.

    With one value the interval is that value; with few values it cannot be wider than their range.
    """
    x = _clean(values)
    if x.size == 0:
        return None
    rng = np.random.default_rng(seed)
    samples = x[rng.integers(0, x.size, size=(resamples, x.size))]
    try:  # numpy's reductions take an axis: one call over every resample (apply_along_axis took 10 s a report)
        stats = np.asarray(statistic(samples, axis=1))
    except TypeError:
        stats = np.apply_along_axis(statistic, 1, samples)
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.percentile(stats, [tail, 100.0 - tail])
    return float(low), float(high)


def spread(values: Sequence[float | None], seed: int = 0) -> dict:
    """median, min, max, the bootstrap interval of the median (ci_low, ci_high) and n over repeats.

    None and non-finite values (a repeat without the metric) are left out; with none left, every field
    but n is None.
    """
    x = _clean(values)
    if x.size == 0:
        return {"n": 0, "median": None, "min": None, "max": None, "ci_low": None, "ci_high": None}
    low, high = bootstrap_interval(x, seed=seed)
    return {"n": int(x.size), "median": float(np.median(x)), "min": float(x.min()), "max": float(x.max()),
            "ci_low": low, "ci_high": high}


def cell(s: dict, digits: int = 1) -> str:
    """A spread as a report cell: "median [min-max]", the median alone when the repeats agree, "-" when none."""
    if not s or s.get("median") is None:
        return "-"
    if s["n"] == 1 or s["min"] == s["max"]:
        return f"{s['median']:.{digits}f}"
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"


def pooled_percentile(groups: Sequence[Sequence[float]], q: float, resamples: int = DEFAULT_RESAMPLES,
                      level: float = DEFAULT_LEVEL, seed: int = 0) -> dict:
    """The q-th percentile over all groups' samples pooled, with a bootstrap interval that resamples
    each group (one repeat's requests) separately; n is the pooled sample size."""
    arrays = [_clean(g) for g in groups]
    arrays = [a for a in arrays if a.size]
    if not arrays:
        return {"n": 0, "value": None, "ci_low": None, "ci_high": None}
    pooled = np.concatenate(arrays)
    rng = np.random.default_rng(seed)
    # Resample every group at once ([resamples, group size] each), then one percentile per pooled row.
    draws = np.concatenate([a[rng.integers(0, a.size, size=(resamples, a.size))] for a in arrays], axis=1)
    stats = np.percentile(draws, q, axis=1)
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.percentile(stats, [tail, 100.0 - tail])
    return {"n": int(pooled.size), "value": float(np.percentile(pooled, q)), "ci_low": float(low),
            "ci_high": float(high)}


def ratio_spread(numerators: Sequence[float | None], denominators: Sequence[float | None],
                 seed: int = 0) -> dict:
    """The spread of a ratio of two metrics measured in separate repeats (e.g. host P99 over device
    P99): the ratio of the medians, its extremes from the min/max pairs, and a bootstrap interval that
    resamples numerator and denominator repeats independently."""
    a, b = _clean(numerators), _clean(denominators)
    b = b[b != 0]
    if a.size == 0 or b.size == 0:
        return {"n": 0, "median": None, "min": None, "max": None, "ci_low": None, "ci_high": None}
    rng = np.random.default_rng(seed)
    draws = (np.median(a[rng.integers(0, a.size, (DEFAULT_RESAMPLES, a.size))], axis=1)
             / np.median(b[rng.integers(0, b.size, (DEFAULT_RESAMPLES, b.size))], axis=1))
    tail = (1.0 - DEFAULT_LEVEL) / 2.0 * 100.0
    low, high = np.percentile(draws, [tail, 100.0 - tail])
    return {"n": int(min(a.size, b.size)), "median": float(np.median(a) / np.median(b)),
            "min": float(a.min() / b.max()), "max": float(a.max() / b.min()),
            "ci_low": float(low), "ci_high": float(high)}
