"""A structured-output constraint survives the ingress ring byte for byte (any UTF-8, any length)."""
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blink.request import Constraint, SamplingParams
from blink.transport.layout import FLAG_CONSTRAINT
from blink.transport.rings import IngressConsumer, IngressProducer


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["json_schema", "regex", "choice", "json_object"]), st.text(max_size=300))
def test_constraint_round_trip(make_segment, kind, text):
    seg = make_segment(arena_capacity=1024)
    spec = json.dumps([text or "x"]) if kind == "choice" else ("" if kind == "json_object" else text)
    params = SamplingParams(max_tokens=9, logit_bias={4: 1.5}, constraint=Constraint(kind, spec))
    assert IngressProducer(seg).submit(7, [1, 2, 3], params)
    [item] = IngressConsumer(seg).poll()
    assert item.prompt_ids == [1, 2, 3] and item.params.logit_bias == {4: 1.5}
    assert item.params.constraint == Constraint(kind, spec)


def test_unconstrained_descriptors_do_not_carry_the_flag(make_segment):
    seg = make_segment()
    assert IngressProducer(seg).submit(1, [1], SamplingParams(max_tokens=2))
    record = IngressConsumer(seg).descriptors.read(0, 1)
    assert record["flags"][0] & FLAG_CONSTRAINT == 0
