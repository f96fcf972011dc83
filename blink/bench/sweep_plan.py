"""The interference sweep's points, their order over repeats, named matrices and the time estimate.

A point is (layout, mode, attack kind, attack level, rate). Changing layout or mode means restarting
the server, so a repeat is a list of server groups (layout, mode), each with its points. Within every
repeat the groups and the points inside each group are shuffled with a seed drawn from (seed, repeat)
(`order="shuffle"`), or rotated by one place per repeat (`order="round-robin"`), so a slow drift of the
machine (clocks, temperature, a neighbour) lands on every mode and condition alike instead of on
whatever happens to run last. The server is restarted for every group of every repeat.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from blink.bench.result_folder import ISOLATED

ORDERS = ("shuffle", "round-robin")
# Seconds per point (window + drain + attack settle, GPU side) and per server start, for the estimate.
POINT_COST_S = 25.0
SERVER_START_S = 60.0

# Issue 19's matrices, in the order to fill them. Each fixes the sweep flags and the workload.
# priority1: split and exposed layouts, isolated plus spin and compile attackers at two processes per
#   attacked core, three rates, both modes, 3 repeats. Workload: the (random 512-token prompts,
#   128 output tokens, ignore EOS), so the points line up with the single points of 2026-12-01 and
#   docs/results.md; there 32 req/s is the knee (isolated P99 TTFT 505 ms device, 1,880 ms host), hence
#   "near saturation" = 32 by default.
# priority2: the ShareGPT-like workload (workload.py: log-normal lengths with ShareGPT's means, 161 in /
#   338 out, clipped to vLLM's filter), all three layouts, all four attackers. Its rates are estimates from
#   the offline ceiling (~7,100 output tok/s at batch 64, docs/perf.md) over ~320 output tokens a request:
#   saturation near 20 req/s; check with the isolated points before trusting the top rate.
MATRICES = {
    "priority1": {"layouts": "split,exposed", "modes": "device,host", "attack_kinds": "spin,compile",
                  "attack_levels": "0,2", "rates": ("light", 24.0, "saturation"), "saturation": 32.0,
                  "repeats": 3, "workload": {"dataset_name": "random", "random_input_len": 512,
                                             "random_output_len": 128, "random_range_ratio": 0.0,
                                             "ignore_eos": True}},
    "priority2": {"layouts": "split,exposed,shared", "modes": "device,host",
                  "attack_kinds": "spin,memory,compile,tokenize", "attack_levels": "0,2",
                  "rates": ("light", 8.0, 14.0, "saturation"), "saturation": 20.0, "repeats": 3,
                  "workload": {"dataset_name": "sharegpt", "dataset_path": None, "sharegpt_output_len": None,
                               "ignore_eos": True}},
}
LIGHT_RATE = 2.0


@dataclass(frozen=True)
class PointSpec:
    layout: str
    mode: str
    attack_kind: str  # ISOLATED for no attack
    attack_level: float  # attack processes per attacked core; 0 for ISOLATED
    rate: float


@dataclass(frozen=True)
class Group:
    """One server start: its layout and mode and the points measured on it, in order."""

    layout: str
    mode: str
    points: tuple[PointSpec, ...]


@dataclass(frozen=True)
class Repeat:
    index: int
    groups: tuple[Group, ...]


def conditions(attack_kinds: list[str], attack_levels: list[float]) -> list[tuple[str, float]]:
    """(kind, level) pairs: the isolated one if level 0 is asked for, then every kind at every level > 0."""
    found = [(ISOLATED, 0.0)] if 0.0 in attack_levels else []
    return found + [(kind, level) for kind in attack_kinds for level in attack_levels if level > 0]


def points(layouts: list[str], modes: list[str], attack_kinds: list[str], attack_levels: list[float],
           rates: list[float]) -> list[PointSpec]:
    return [PointSpec(layout, mode, kind, level, rate) for layout in layouts for mode in modes
            for kind, level in conditions(attack_kinds, attack_levels) for rate in rates]


def _group(specs: list[PointSpec]) -> list[Group]:
    keys = list(dict.fromkeys((p.layout, p.mode) for p in specs))
    return [Group(layout, mode, tuple(p for p in specs if (p.layout, p.mode) == (layout, mode)))
            for layout, mode in keys]


def _rotate(items: list, by: int) -> list:
    if not items:
        return items
    by %= len(items)
    return items[by:] + items[:by]


def plan(specs: list[PointSpec], repeats: int, order: str = "shuffle", seed: int = 0,
         first_repeat: int = 0) -> list[Repeat]:
    """The repeats of `specs` in measuring order. `first_repeat` numbers the repeats of a later run on
    from an earlier one's (the folder keeps both), and also moves the shuffle on."""
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}; one of {ORDERS}")
    if repeats < 1:
        raise ValueError("--repeats must be >= 1")
    base = _group(specs)
    result = []
    for index in range(first_repeat, first_repeat + repeats):
        if order == "shuffle":
            rng = np.random.default_rng([seed, index])
            groups = [base[i] for i in rng.permutation(len(base))]
            groups = [Group(g.layout, g.mode, tuple(g.points[i] for i in rng.permutation(len(g.points))))
                      for g in groups]
        else:
            groups = [Group(g.layout, g.mode, tuple(_rotate(list(g.points), index)))
                      for g in _rotate(base, index)]
        result.append(Repeat(index, tuple(groups)))
    return result


def estimate_seconds(repeats: list[Repeat], point_cost_s: float = POINT_COST_S,
                     server_start_s: float = SERVER_START_S) -> float:
    n_points = sum(len(g.points) for r in repeats for g in r.groups)
    n_starts = sum(len(r.groups) for r in repeats)
    return n_points * point_cost_s + n_starts * server_start_s


def matrix_rates(name: str, light_rate: float = LIGHT_RATE, saturation_rate: float | None = None
                 ) -> list[float]:
    """The matrix's rates, "light" and "saturation" resolved (saturation: the matrix's own unless given)."""
    m = MATRICES[name]
    named = {"light": light_rate, "saturation": m["saturation"] if saturation_rate is None else saturation_rate}
    return [float(named.get(r, r)) for r in m["rates"]]
