import re

from hypothesis import given, settings
from hypothesis import strategies as st

from blink.grammar.int_range import integer_range_regex

bound = st.one_of(st.none(), st.integers(-3000, 3000))


@settings(max_examples=150, deadline=None)
@given(bound, bound)
def test_matches_exactly_the_range(lo, hi):
    if lo is not None and hi is not None and lo > hi:
        lo, hi = hi, lo
    pattern = re.compile(integer_range_regex(lo, hi))
    for x in range(-3200, 3200, 7):
        inside = (lo is None or x >= lo) and (hi is None or x <= hi)
        assert bool(pattern.fullmatch(str(x))) == inside, (lo, hi, x)
    for bad in ("-0", "007", "01", "+1", ""):
        assert not pattern.fullmatch(bad)


def test_open_ranges_reach_far():
    assert re.fullmatch(integer_range_regex(1, None), "123456789012")
    assert not re.fullmatch(integer_range_regex(1, None), "0")
    assert re.fullmatch(integer_range_regex(None, -5), "-987654321")
