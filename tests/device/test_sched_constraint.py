"""The GPU scheduler's C++ (run here with g++) refuses a structured-output descriptor: device mode
has no grammar tables, so it must end the request with ERROR rather than sample unconstrained."""
from __future__ import annotations

from blink.device import structs
from blink.request import Constraint, FinishReason, SamplingParams


def test_constrained_descriptors_are_refused_and_the_rest_served(make):
    h = make(max_model_len=32, vocab_size=50, num_blocks=8, block_size=4)
    h.submit(1, [2, 3, 4], SamplingParams(temperature=0.0, max_tokens=4, constraint=Constraint("regex", "[a-z]+")))
    h.submit(2, [2, 3], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    h.run()
    assert [(e.token_id, e.finish_reason) for e in h.events[1]] == [(-1, FinishReason.ERROR)]
    assert h.info()["error_code"] == structs.ERR_INVALID_DESCRIPTOR
    tokens, reason = h.outputs(2)
    assert len(tokens) == 3 and reason == FinishReason.LENGTH
