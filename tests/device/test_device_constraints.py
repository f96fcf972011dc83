"""DeviceEngine's constraint path without a GPU (blink/device/constraints.py): compile per request with the
demo model's vocabulary, refuse what cannot compile, and wait for a staging slot while all are held."""
import os
from types import SimpleNamespace

import pytest

from blink.config import EngineArgs
from blink.device.constraints import DeviceConstraints
from blink.grammar.schema import GrammarError
from blink.request import Constraint
from blink.transport.grammar_staging import StagingFull
from blink.transport.layout import GRAMMAR_SLOTS, SegmentLayout, grammar_staging
from blink.transport.shm import Segment


@pytest.fixture
def setup():
    from blink.model.config import ModelConfig
    from blink.model.demo import ensure_default_model

    cfg = ModelConfig.from_dir(ensure_default_model())
    args = EngineArgs(grammar_arena_mb=8)
    seg = Segment.create(f"blink-dc-{os.getpid()}", SegmentLayout(8, 1024, 8, *grammar_staging(8 << 20)))
    seg.control.vocab_size = cfg.vocab_size
    dc = DeviceConstraints(args, SimpleNamespace(vocab_size=cfg.vocab_size, eos_token_ids=tuple(cfg.eos_token_ids)),
                           seg)
    yield dc, cfg
    dc.shutdown()
    seg.close()
    seg.unlink()


def test_compiles_over_the_model_vocabulary_and_refuses_bad_constraints(setup):
    dc, cfg = setup
    t = dc.tables(Constraint("regex", "[a-c]{2,4}"))
    assert len(t.token_class) == cfg.vocab_size and t.num_states >= 3
    with pytest.raises(GrammarError):
        dc.tables(Constraint("json_schema", '{"type": "object", "uniqueItems": true, "not": {}}'))


def test_waits_for_a_slot_while_all_are_held(setup):
    dc, _ = setup
    t = dc.tables(Constraint("regex", "x+"))
    for i in range(GRAMMAR_SLOTS):
        dc.staging.reserve(Constraint("regex", f"o{i}"), t.token_class, t.next_state)
    with pytest.raises(StagingFull):
        dc.reserve(Constraint("regex", "x+"), t, wait=lambda: False)  # nothing in flight could free one
    calls = []

    def wait():  # the engine drains egress here; a request's last record frees a slot
        calls.append(1)
        if len(calls) == 2:
            dc.staging.unreserve(Constraint("regex", "o5"))
        return True

    dc.reserve(Constraint("regex", "x+"), t, wait)
    assert len(calls) == 2 and dc.staging.slot_of(Constraint("regex", "x+")) == 5
