"""The repeat statistics: spread, bootstrap intervals, pooled percentiles, ratios."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from blink.bench.stats import bootstrap_interval, pooled_percentile, ratio_spread, spread

samples = st.lists(st.floats(min_value=0.0, max_value=1e6, allow_nan=False), min_size=1, max_size=12)


@settings(max_examples=40, deadline=None)
@given(samples)
def test_spread_brackets_the_median_with_the_bootstrap_inside_the_range(values):
    s = spread(values)
    assert s["n"] == len(values)
    assert s["min"] == min(values) and s["max"] == max(values)
    assert s["median"] == float(np.median(values))
    # a bootstrap of the median can only pick medians of the values themselves
    assert s["min"] <= s["ci_low"] <= s["ci_high"] <= s["max"]


def test_spread_leaves_out_missing_values_and_handles_none_at_all():
    assert spread([3.0, None, float("nan"), 1.0])["n"] == 2
    empty = spread([None])
    assert empty["n"] == 0 and empty["median"] is None and empty["ci_low"] is None


def test_bootstrap_is_seeded_and_narrows_with_more_data():
    rng = np.random.default_rng(0)
    small, large = rng.normal(100, 10, 10), rng.normal(100, 10, 1000)
    assert bootstrap_interval(small, seed=3) == bootstrap_interval(small, seed=3)
    lo_s, hi_s = bootstrap_interval(small)
    lo_l, hi_l = bootstrap_interval(large)
    assert hi_l - lo_l < hi_s - lo_s
    assert lo_l <= float(np.median(large)) <= hi_l
    assert bootstrap_interval([]) is None
    assert bootstrap_interval([7.0]) == (7.0, 7.0)


def test_pooled_percentile_is_over_all_groups_and_its_interval_covers_it():
    a, b = list(range(100)), list(range(100, 200))
    s = pooled_percentile([a, b], 50, resamples=300)
    assert s["n"] == 200 and s["value"] == float(np.percentile(a + b, 50))
    assert s["ci_low"] <= s["value"] <= s["ci_high"]
    assert pooled_percentile([[], []], 99)["value"] is None


def test_ratio_spread_of_medians_with_extremes():
    r = ratio_spread([10.0, 20.0, 30.0], [5.0, 10.0])
    assert r["median"] == 20.0 / 7.5
    assert r["min"] == 10.0 / 10.0 and r["max"] == 30.0 / 5.0
    assert r["min"] <= r["ci_low"] <= r["ci_high"] <= r["max"]
    assert ratio_spread([1.0], [0.0])["median"] is None
