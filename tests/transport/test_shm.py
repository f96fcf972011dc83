"""Segment: create/attach, validation of what is attached, ownership of the name in /dev/shm."""
import os
import subprocess
import sys

import numpy as np
import pytest

from blink.transport.layout import MAGIC, VERSION, SegmentLayout
from blink.transport.shm import SHM_DIR, Segment


def test_create_writes_header_and_attach_reads_it(make_segment):
    seg = make_segment(ingress_capacity=5, arena_capacity=1000, egress_capacity=7)
    assert (seg.control.magic, seg.control.version) == (MAGIC, VERSION)
    assert seg.size == SegmentLayout(5, 1000, 7).size == os.path.getsize(os.path.join(SHM_DIR, seg.name))
    assert seg.address != 0 and seg.address % 4096 == 0
    with Segment.attach(seg.name) as engine:
        assert engine.layout == seg.layout and not engine.owner
        engine.control.ready = 1  # both mappings are the same memory
        seg.control.stop_flag = 1
        assert seg.control.ready == 1 and engine.control.stop_flag == 1
    assert os.path.exists(os.path.join(SHM_DIR, seg.name))  # the attacher never unlinks


def test_counters_report_engine_fields_and_ring_fill(make_segment):
    seg = make_segment()
    seg.control.steps, seg.control.heartbeat = 12, 34
    words = seg.ring_header(seg.layout.egress_header)
    words[0] = 5  # tail
    counters = seg.counters()
    assert counters["steps"] == 12 and counters["heartbeat"] == 34
    assert counters["egress_used"] == 5 and counters["ingress_used"] == 0


def test_attach_rejects_bad_magic(make_segment):
    seg = make_segment()
    seg.control.magic = 0x1234
    with pytest.raises(ValueError, match="bad magic"):
        Segment.attach(seg.name)


def test_attach_rejects_other_version(make_segment):
    seg = make_segment()
    seg.control.version = VERSION + 1
    with pytest.raises(ValueError, match="version"):
        Segment.attach(seg.name)


def test_attach_rejects_capacities_larger_than_the_segment(make_segment):
    seg = make_segment()
    seg.control.egress_capacity = 1 << 20
    with pytest.raises(ValueError, match="need"):
        Segment.attach(seg.name)


def test_attach_rejects_tiny_or_missing_files():
    name = f"blink-test-{os.getpid()}-tiny"
    path = os.path.join(SHM_DIR, name)
    with open(path, "wb") as f:
        f.write(b"\0" * 10)
    try:
        with pytest.raises(ValueError, match="too small"):
            Segment.attach(name)
    finally:
        os.unlink(path)
    with pytest.raises(FileNotFoundError):
        Segment.attach(name)


def test_create_refuses_existing_name_and_bad_names(make_segment):
    seg = make_segment()
    with pytest.raises(FileExistsError):
        Segment.create(seg.name, seg.layout)
    for bad in ("", "a/b", "../x"):
        with pytest.raises(ValueError):
            Segment.create(bad, seg.layout)


def test_unlink_leaves_nothing_in_dev_shm():
    name = f"blink-test-{os.getpid()}-unlink"
    with Segment.create(name, SegmentLayout(2, 16, 2)):
        assert os.path.exists(os.path.join(SHM_DIR, name))
    assert not os.path.exists(os.path.join(SHM_DIR, name))


def test_close_with_live_views_keeps_them_valid(make_segment):
    seg = make_segment()
    view = seg.array(np.uint64, 1, seg.layout.arena_header)
    seg.close()
    seg.close()  # idempotent
    view[0] = 7  # still mapped: released with the last view, never under it
    assert int(view[0]) == 7


@pytest.mark.slow  # spawns a process
def test_attaching_process_neither_unlinks_nor_warns(make_segment):
    seg = make_segment()
    code = ("import sys; from blink.transport.shm import Segment\n"
            "s = Segment.attach(sys.argv[1]); s.control.ready = 1; s.close()\n")
    done = subprocess.run([sys.executable, "-c", code, seg.name], capture_output=True, text=True, timeout=60,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # no resource_tracker complaints
    assert os.path.exists(os.path.join(SHM_DIR, seg.name))
    assert seg.control.ready == 1
