"""Grammar staging (device mode's structured outputs): slots are chosen, written and held as the GPU's copy
needs: identical constraints share a slot and its generation, a held slot is never rewritten, a request
holds its slot from submit to its last egress record, and full staging is a StagingFull (a 503)."""
import numpy as np
import pytest

from blink.request import Constraint, FinishReason, SamplingParams, TokenEvent
from blink.transport.grammar_staging import GrammarStaging, StagingFull
from blink.transport.layout import ENGINE_MODE_DEVICE, FLAG_CONSTRAINT, GRAMMAR_SLOTS
from blink.transport.rings import EgressConsumer, EgressProducer, IngressConsumer, IngressProducer

VOCAB, WORDS = 10, 64


def tables(seed: int, states=3, classes=4):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, classes, VOCAB).astype(np.int32),
            rng.integers(-1, states, (states, classes)).astype(np.int32))


@pytest.fixture
def seg(make_segment):
    s = make_segment(arena_capacity=1024, egress_capacity=64, grammar_slots=GRAMMAR_SLOTS, grammar_slot_words=WORDS)
    s.control.vocab_size = VOCAB
    s.control.engine_mode = ENGINE_MODE_DEVICE
    return s


def key(i: int) -> Constraint:
    return Constraint("regex", f"a{i}")


def test_a_reserved_slot_holds_the_tables_and_identical_constraints_share_it(seg):
    staging = GrammarStaging.of(seg)
    assert GrammarStaging.of(seg) is staging  # one bookkeeper per segment: producer and consumer share it
    cls, nxt = tables(0)
    slot = staging.reserve(key(0), cls, nxt)
    assert (staging.words[slot, :VOCAB] == cls).all()
    assert (staging.words[slot, VOCAB:VOCAB + nxt.size] == nxt.ravel()).all()
    assert staging.reserve(key(0), *tables(99)) == slot  # resident: not rewritten
    assert (staging.words[slot, :VOCAB] == cls).all()
    assert staging.bind(1, key(0)) == staging.bind(2, key(0)) == (slot, 3, 4, 1)


def test_full_staging_refuses_until_a_request_finishes(seg):
    staging = GrammarStaging.of(seg)
    for i in range(GRAMMAR_SLOTS):
        staging.reserve(key(i), *tables(i))
        staging.bind(100 + i, key(i))
        staging.unreserve(key(i))
    with pytest.raises(StagingFull):
        staging.reserve(key(99), *tables(99))
    staging.finished(103)  # slot of key(3) is no longer held
    slot = staging.reserve(key(99), *tables(99))
    assert slot == 3 and staging.slot_of(key(3)) is None
    _, _, _, gen = staging.bind(200, key(99))
    assert gen == GRAMMAR_SLOTS + 1  # a fresh generation: the GPU copies it


def test_an_unheld_slot_keeps_its_tables_and_is_reused_last_recently_used_first(seg):
    staging = GrammarStaging.of(seg)
    for i in range(GRAMMAR_SLOTS):
        staging.reserve(key(i), *tables(i))
        staging.unreserve(key(i))
    staging.reserve(key(0), *tables(0))  # resident and free: reused as is, same generation
    assert staging.bind(1, key(0))[3] == 1
    staging.reserve(key(50), *tables(50))  # evicts the least recently used: key(1)
    assert staging.slot_of(key(1)) is None and staging.slot_of(key(0)) == 0


def test_tables_the_slot_cannot_carry_are_refused(seg):
    staging = GrammarStaging.of(seg)
    with pytest.raises(ValueError, match="vocabulary"):
        staging.reserve(key(0), np.zeros(VOCAB + 1, np.int32), np.zeros((1, 2), np.int32))
    with pytest.raises(ValueError, match="exceed"):
        staging.reserve(key(0), np.zeros(VOCAB, np.int32), np.zeros((10, 10), np.int32))


def test_a_submitted_request_holds_its_slot_until_its_last_record(seg):
    staging = GrammarStaging.of(seg)
    c = key(7)
    params = SamplingParams(max_tokens=3, constraint=c)
    with pytest.raises(ValueError, match="staged"):
        IngressProducer(seg).submit(1, [1, 2], params)  # device mode: tables first
    slot = staging.reserve(c, *tables(7))
    assert IngressProducer(seg).submit(1, [1, 2], params)
    staging.unreserve(c)
    record = IngressConsumer(seg).descriptors.read(0, 1)
    assert record["flags"][0] & FLAG_CONSTRAINT and record["arena_len"][0] == 2  # no text: tables are staged
    assert (record["grammar_slot"][0], record["grammar_states"][0], record["grammar_classes"][0],
            record["grammar_gen"][0]) == (slot, 3, 4, 1)
    assert staging.held_keys() == {c}
    EgressProducer(seg).push([TokenEvent(1, 5, 0)])
    EgressConsumer(seg).poll()
    assert staging.held_keys() == {c}  # not its last record
    EgressProducer(seg).push([TokenEvent(1, 6, 1, FinishReason.STOP)])
    EgressConsumer(seg).poll()
    assert staging.held_keys() == set()


def test_host_mode_descriptors_carry_the_text_and_no_slot(seg):
    seg.control.engine_mode = 1
    params = SamplingParams(max_tokens=3, constraint=key(1))
    assert IngressProducer(seg).submit(1, [1, 2], params)
    [item] = IngressConsumer(seg).poll()
    assert item.params.constraint == key(1)
    assert IngressConsumer(seg).descriptors.read(0, 1)["grammar_slot"][0] == -1
