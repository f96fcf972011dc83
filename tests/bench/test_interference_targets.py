"""Core placement per layout, and the knob variant that becomes part of a point's identity."""
import argparse

import pytest

from blink.bench import interference
from blink.bench.interference_targets import placement, targets
from blink.bench.sched_knobs import AttackerKnobs

ALL = list(range(16))


def args(*extra):
    parser = argparse.ArgumentParser()
    interference.add_arguments(parser)
    return parser.parse_args(["--result-dir", "/nonexistent", "--frontend-cpus", "0-1", "--engine-cpus", "2-13",
                              *extra])


def test_split_gives_the_front_end_its_own_cores():
    p = placement("split", args(), ALL)
    assert p.frontend_cpus == [0, 1] and p.engine_cpus == list(range(2, 14))
    assert p.attack_cpus == list(range(2, 14)) and p.client_cpus == [14, 15]


def test_exposed_puts_the_front_end_on_the_attacked_cores():
    p = placement("exposed", args("--attack-cpus", "2-7"), ALL)
    assert p.frontend_cpus == list(range(2, 8)) and p.attack_cpus == list(range(2, 8))
    assert p.engine_cpus == list(range(2, 14)) and p.client_cpus == [0, 1, 14, 15]


def test_shared_pins_nothing_and_attacks_everything():
    p = placement("shared", args(), ALL)
    assert (p.frontend_cpus, p.engine_cpus, p.client_cpus) == (None, None, None) and p.attack_cpus == ALL


def test_a_reserved_core_is_the_front_end_s_and_no_attacker_s():
    p = placement("exposed", args("--frontend-reserved-cpus", "2"), ALL)
    assert p.frontend_cpus == [2] and 2 not in p.attack_cpus and p.attack_cpus == list(range(3, 14))
    with pytest.raises(SystemExit):
        placement("exposed", args("--attack-cpus", "2", "--frontend-reserved-cpus", "2"), ALL)


def test_layouts_that_pin_need_engine_cores():
    parser = argparse.ArgumentParser()
    interference.add_arguments(parser)
    with pytest.raises(SystemExit):
        placement("split", parser.parse_args(["--result-dir", "x"]), ALL)
    with pytest.raises(SystemExit):
        placement("sideways", args(), ALL)


def test_variant_names_only_the_knobs_set():
    assert interference.variant_of(AttackerKnobs(), None) == ""
    assert interference.variant_of(AttackerKnobs(nice=19, policy="batch", cpu_weight=10), [0, 1]) == \
        "nice19-batch-w10-fe0,1"


def test_front_end_niceness_and_serve_flags_are_conditions():
    """A point served with other flags (the front end's niceness among them) never merges with the plain one."""
    assert interference.variant_of(AttackerKnobs(), None, frontend_nice=-10) == "fenice-10"
    assert interference.variant_of(AttackerKnobs(), None, frontend_nice=0) == "fenice0"
    assert interference.variant_of(AttackerKnobs(), None, serve_args="--max-num-seqs 64 --x 'a b'") == \
        "serve_max-num-seqs_64_x_a_b"
    assert interference.variant_of(AttackerKnobs(), None, serve_args="--frontend-nice -10") == \
        "serve_frontend-nice_-10"  # a value's sign is kept: nice -10 is not nice 10
    spec = targets(args("--modes", "device", "--frontend-nice", "-10", "--serve-args", "--max-num-seqs 8"),
                   placement("shared", args(), ALL))[0].serve
    assert spec.extra_args == ("--max-num-seqs", "8", "--frontend-nice", "-10")


def test_priority1_matrix_sets_the_sweep_and_the_workload():
    a = args("--matrix", "priority1")
    interference.apply_matrix(a)
    assert (a.layouts, a.modes, a.attack_kinds, a.attack_levels) == ("split,exposed", "device,host",
                                                                      "spin,compile", "0,2")
    assert a.request_rates == "2,24,32" and a.repeats == 3
    assert (a.dataset_name, a.random_input_len, a.random_output_len, a.ignore_eos) == ("random", 512, 128, True)
    b = args("--matrix", "priority1", "--repeats", "1", "--saturation-rate", "40")
    interference.apply_matrix(b)
    assert b.repeats == 1 and b.request_rates == "2,24,40"


def test_a_mode_variant_is_a_mode_of_its_own_with_its_own_flags():
    a = args("--serve-args", "--max-num-seqs 8", "--mode-variant", "device-paced=device:--decode-pace-ms 12")
    found = {t.name: t.serve for t in targets(a, placement("split", a, ALL))}
    assert list(found) == ["device", "host", "device-paced"]
    assert found["device-paced"].engine == "device"
    assert found["device-paced"].extra_args == ("--max-num-seqs", "8", "--decode-pace-ms", "12")
    assert found["device"].extra_args == ("--max-num-seqs", "8")
    for bad in ("paced", "paced=gpu:--x 1", "host=host:--x 1", "a b=device:"):
        a = args("--mode-variant", bad)
        with pytest.raises(SystemExit, match="--mode-variant"):
            targets(a, placement("split", a, ALL))
