"""Host mode's ring loop drains: once the front end closes ingress it serves everything already sent
(queued beyond max_num_seqs included) and only then returns, marking the segment exited; its busy steps are
counted in the control block's step intervals."""
from __future__ import annotations

import os
import threading

import pytest

from blink.config import EngineArgs
from blink.host.engine import HostEngine
from blink.host.ring_loop import serve_rings
from blink.model.demo import ensure_default_model
from blink.request import FinishReason, SamplingParams
from blink.transport.layout import SegmentLayout
from blink.transport.rings import EgressConsumer, IngressProducer
from blink.transport.shm import Segment

pytestmark = pytest.mark.timeout(120)


def test_serve_rings_returns_only_after_serving_what_was_sent():
    engine = HostEngine(EngineArgs(model=str(ensure_default_model()), device="cpu", max_num_seqs=2,
                                   num_kv_blocks=64))
    seg = Segment.create(f"blink-drain-{os.getpid()}", SegmentLayout(16, 4096, 256))
    try:
        producer, consumer = IngressProducer(seg), EgressConsumer(seg)
        params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
        for req_id in range(1, 6):  # five requests for two sequence slots: three wait
            assert producer.submit(req_id, [3, 4, 5], params, timeout=0)
        seg.control.ingress_closed = 1  # closed right away: the five are already in the ring
        loop = threading.Thread(target=serve_rings, args=(engine, seg), daemon=True)
        loop.start()
        loop.join(60)
        assert not loop.is_alive(), "the loop did not end after the drain"
        assert seg.control.exited == 1 and seg.control.stop_flag == 0
        # every step after the first ran with work waiting: each one a busy step interval (as the GPU loop)
        ctl = seg.control
        assert ctl.steps >= 5 and sum(ctl.step_intervals) == ctl.steps - 1 and ctl.step_intervals_sum_ns > 0
        events = consumer.poll()
        for req_id in range(1, 6):
            mine = [e for e in events if e.req_id == req_id]
            assert [e.position for e in mine] == list(range(5)) and mine[-1].finish_reason == FinishReason.LENGTH
    finally:
        engine.shutdown()
        seg.close()
        seg.unlink()
