"""The serving processes' garbage-collector settings: the startup heap frozen once, every collection timed."""
import argparse
import gc

from blink.config import EngineArgs
from blink.util.gc_pauses import GcPauses, freeze_heap, unfreeze_heap


def test_freeze_moves_the_live_heap_out_and_unfreeze_gives_it_back():
    try:
        frozen = freeze_heap()
        # frozen objects can still die (a thread of an earlier test freeing some), so the count may shrink a little
        # between the two reads; it never grows without another freeze
        assert frozen > 1000 and frozen - 100 <= gc.get_freeze_count() <= frozen
    finally:
        unfreeze_heap()
    assert gc.get_freeze_count() == 0


def test_every_collection_is_reported_with_its_generation_and_length():
    seen = []
    pauses = GcPauses(lambda generation, seconds: seen.append((generation, seconds)))
    try:
        gc.collect(1)
        gc.collect()
    finally:
        pauses.close()
    gc.collect()  # closed: no longer reported
    assert [g for g, _ in seen][-2:] == [1, 2] and all(s >= 0 for _, s in seen)
    assert len([g for g, _ in seen if g == 2]) == 1


def test_gc_freeze_is_on_by_default_and_survives_the_engine_command_line():
    p = argparse.ArgumentParser()
    EngineArgs.add_cli_args(p)
    assert EngineArgs.from_cli(p.parse_args([])).gc_freeze
    off = EngineArgs(gc_freeze=False)
    assert "--no-gc-freeze" in off.to_cli()
    assert EngineArgs.from_cli(p.parse_args(off.to_cli())) == off
