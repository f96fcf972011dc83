"""Shared-memory segments for the transport tests, each unlinked afterwards whatever happens."""
import os
import uuid

import pytest

from blink.transport.layout import SegmentLayout
from blink.transport.shm import SHM_DIR, Segment


@pytest.fixture
def make_segment():
    """make_segment(ingress, arena, egress[, grammar staging slots, words]) -> a created Segment, fresh name."""
    created = []

    def make(ingress_capacity=8, arena_capacity=256, egress_capacity=16, grammar_slots=0,
             grammar_slot_words=0) -> Segment:
        name = f"blink-test-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        seg = Segment.create(name, SegmentLayout(ingress_capacity, arena_capacity, egress_capacity, grammar_slots,
                                                 grammar_slot_words))
        created.append(seg)
        return seg

    yield make
    for seg in created:
        seg.close()
        seg.unlink()
        assert not os.path.exists(os.path.join(SHM_DIR, seg.name))
