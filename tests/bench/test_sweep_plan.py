"""The repeat scheduler: every point once per repeat, grouped by server, interleaved, seeded."""
import pytest

from blink.bench.sweep_plan import MATRICES, estimate_seconds, matrix_rates, plan, points


def specs():
    return points(["split", "exposed"], ["device", "host"], ["spin", "compile"], [0, 2], [2.0, 24.0, 48.0])


def flat(repeat):
    return [(g.layout, g.mode, p) for g in repeat.groups for p in g.points]


@pytest.mark.parametrize("order", ["shuffle", "round-robin"])
def test_every_repeat_measures_every_point_once_grouped_by_server(order):
    all_points = specs()
    assert len(all_points) == 2 * 2 * 3 * 3  # layouts x modes x (isolated, spin, compile) x rates
    repeats = plan(all_points, 3, order, seed=5)
    assert [r.index for r in repeats] == [0, 1, 2]
    for r in repeats:
        assert sorted(map(repr, (p for _, _, p in flat(r)))) == sorted(map(repr, all_points))
        assert len(r.groups) == 4  # one server start per (layout, mode)
        assert all((p.layout, p.mode) == (g.layout, g.mode) for g in r.groups for p in g.points)


def test_shuffle_differs_between_repeats_and_is_seeded():
    repeats = plan(specs(), 3, "shuffle", seed=1)
    orders = [flat(r) for r in repeats]
    assert orders[0] != orders[1] != orders[2]
    assert [flat(r) for r in plan(specs(), 3, "shuffle", seed=1)] == orders
    assert [flat(r) for r in plan(specs(), 3, "shuffle", seed=2)] != orders
    # a later run's repeats (first_repeat) are the same as the continuation of a longer run
    assert flat(plan(specs(), 1, "shuffle", seed=1, first_repeat=2)[0]) == orders[2]


def test_round_robin_rotates_servers_and_points():
    repeats = plan(specs(), 2, "round-robin")
    first = [(g.layout, g.mode) for g in repeats[0].groups]
    second = [(g.layout, g.mode) for g in repeats[1].groups]
    assert second == first[1:] + first[:1]
    assert repeats[1].groups[-1].points == repeats[0].groups[0].points[1:] + repeats[0].groups[0].points[:1]


def test_priority1_matrix_size_and_estimate():
    m = MATRICES["priority1"]
    rates = matrix_rates("priority1", light_rate=2.0, saturation_rate=40.0)
    assert rates == [2.0, 24.0, 40.0]
    assert matrix_rates("priority1") == [2.0, 24.0, 32.0]
    one = points(m["layouts"].split(","), m["modes"].split(","), m["attack_kinds"].split(","),
                 [float(x) for x in m["attack_levels"].split(",")], rates)
    repeats = plan(one, m["repeats"])
    assert len(one) == 36 and len(repeats) == 3
    assert estimate_seconds(repeats, point_cost_s=25.0, server_start_s=60.0) == 108 * 25.0 + 12 * 60.0


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        plan(specs(), 0)
    with pytest.raises(ValueError):
        plan(specs(), 1, "random")
