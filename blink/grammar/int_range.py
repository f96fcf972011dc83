"""A regex for the canonical JSON integers in [lo, hi] (either bound may be open).

outlines-core ignores minimum/maximum, so blink writes bounded integers itself (schema.py splices this
regex into outlines' output). Canonical means no leading zeros and no "-0", as JSON writers emit them.
"""
from __future__ import annotations


def _digits_range(lo: str, hi: str) -> str:
    """Regex for the decimal strings of equal length between lo and hi inclusive (may have leading 0s)."""
    if lo == hi:
        return lo
    if len(lo) == 1:
        return f"[{lo}-{hi}]"
    # Split on the first digit: lo's own prefix, the full middle digits, hi's own prefix.
    a, b = int(lo[0]), int(hi[0])
    rest = len(lo) - 1
    if a == b:
        return lo[0] + "(" + _digits_range(lo[1:], hi[1:]) + ")"
    parts = []
    low_full, high_full = lo[1:] == "0" * rest, hi[1:] == "9" * rest
    first, last = a + (0 if low_full else 1), b - (0 if high_full else 1)
    if not low_full:
        parts.append(lo[0] + "(" + _digits_range(lo[1:], "9" * rest) + ")")
    if first <= last:
        digit = str(first) if first == last else f"[{first}-{last}]"
        parts.append(digit + f"[0-9]{{{rest}}}")
    if not high_full:
        parts.append(hi[0] + "(" + _digits_range("0" * rest, hi[1:]) + ")")
    return "|".join(parts)


def _nonneg(lo: int, hi: int | None) -> str:
    """Canonical integers in [lo, hi] with 0 <= lo (hi None: unbounded)."""
    parts = []
    if lo == 0:
        parts.append("0")
        lo = 1
    length = len(str(lo))
    while hi is None or lo <= hi:
        top = 10**length - 1
        end = top if hi is None else min(top, hi)
        if lo <= end:
            parts.append(_digits_range(str(lo), str(end)))
        if hi is None and lo == 10 ** (length - 1):  # from here on: every longer length too
            parts[-1] = f"[1-9][0-9]{{{length - 1},}}" if length > 1 else "[1-9][0-9]*"
            break
        if hi is None:
            parts.append(f"[1-9][0-9]{{{length},}}")
            break
        lo, length = top + 1, length + 1
    return "|".join(f"({p})" for p in parts) if parts else ""


def integer_range_regex(lo: int | None, hi: int | None) -> str:
    """Raises ValueError for an empty range; lo/hi None = open."""
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"empty integer range [{lo}, {hi}]")
    parts = []
    if hi is None or hi >= 0:
        parts.append(_nonneg(max(lo, 0) if lo is not None else 0, hi))
    if lo is None or lo < 0:  # negatives: -(1..|lo|), or every negative
        neg_hi = None if lo is None else -lo
        neg_lo = 1 if hi is None or hi >= 0 else -hi
        parts.append("-(" + _nonneg(neg_lo, neg_hi) + ")")
    return "|".join(f"({p})" for p in parts if p)
