"""Seeds are drawn in one place (blink.request.request_seed): offline runs are reproducible from --seed in
both modes, and host mode and device mode give an unseeded request the same seed."""
import numpy as np
import pytest

from blink.entrypoints.llm import LLM
from blink.request import SamplingParams, request_seed
from blink.transport.layout import SegmentLayout
from blink.transport.rings import IngressConsumer, IngressProducer
from blink.transport.shm import Segment


def test_request_seed_is_the_requests_own_or_derived_from_the_base():
    assert request_seed(SamplingParams(seed=123), 5, base_seed=9) == 123
    derived = {request_seed(SamplingParams(), rid, base_seed=9) for rid in range(200)}
    assert len(derived) == 200 and all(0 <= s < 2**63 for s in derived)
    assert request_seed(SamplingParams(), 7, 9) == request_seed(SamplingParams(), 7, 9)
    assert request_seed(SamplingParams(), 7, 9) != request_seed(SamplingParams(), 7, 10)


def test_device_modes_ingress_carries_the_seed_host_mode_would_draw():
    """DeviceEngine submits with base_seed=--seed: the descriptor's seed is HostEngine's for that request."""
    seg = Segment.create(f"blink-test-seed-{np.random.randint(1 << 30)}", SegmentLayout(8, 1024, 8))
    try:
        producer, consumer = IngressProducer(seg, base_seed=42), IngressConsumer(seg)
        assert producer.submit(3, [1, 2, 3], SamplingParams(), timeout=1)
        (item,) = consumer.poll(8)
        assert item.params.seed == request_seed(SamplingParams(), 3, 42)
    finally:
        seg.close()
        seg.unlink()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.hf_models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("seeds"), "llama")


def sample(model_dir, seed):
    llm = LLM(model=str(model_dir), device="cpu", dtype="float32", num_kv_blocks=32, seed=seed)
    params = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
    return [o.token_ids for o in llm.generate([[5, 6, 7], [8, 9]], params)]


def test_offline_host_mode_is_reproducible_from_seed(model_dir):
    first, again, other = sample(model_dir, 1), sample(model_dir, 1), sample(model_dir, 2)
    assert first == again
    assert first != other  # random weights, temperature 1: another --seed draws other tokens
