"""A bare shared-memory segment for the front-end tests that play the engine's side by hand."""
import os
import uuid

import pytest

from blink.transport.layout import SegmentLayout
from blink.transport.shm import Segment


@pytest.fixture()
def segment():
    seg = Segment.create(f"blink-frontend-{os.getpid()}-{uuid.uuid4().hex[:8]}", SegmentLayout(8, 1024, 8))
    yield seg
    seg.close()
    seg.unlink()
