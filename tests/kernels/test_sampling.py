import struct

import pytest
import torch

from blink.kernels.sampling import (
    SampleOutput,
    apply_penalties_ref,
    apply_penalties_triton,
    choose_tokens_ref,
    choose_tokens_triton,
    keep_thresholds,
    keep_thresholds_triton,
    race_uniform_ref,
    sample,
    sample_ref,
    sample_triton,
)
from blink.kernels.sampling_grid import RACE_CAPACITY
from blink.kernels.sampling_state import SamplingState
from blink.request import SamplingParams

MIXED_PARAMS = [
    SamplingParams(logprobs=3),
    SamplingParams(temperature=0.0, logprobs=0),
    SamplingParams(temperature=0.7, top_k=20, logprobs=20),
    SamplingParams(temperature=1.3, top_p=0.8),
    SamplingParams(min_p=0.05, logprobs=1),
    SamplingParams(temperature=0.9, top_k=50, top_p=0.9, min_p=0.02),
    SamplingParams(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.4),
    SamplingParams(temperature=0.0, repetition_penalty=0.8, logit_bias={3: 5.0, 11: -2.0}),
    SamplingParams(temperature=0.8, frequency_penalty=-1.0, logit_bias={0: 1.5, 5: 100.0, 6: -100.0}),
    SamplingParams(temperature=0.9, top_k=30, top_p=0.9, repetition_penalty=1.2, logit_bias={2: 3.0}, logprobs=2),
]


def mixed_state(vocab: int, seed: int = 0) -> SamplingState:
    gen = torch.Generator().manual_seed(seed)
    state = SamplingState(len(MIXED_PARAMS), vocab, "cpu")
    for slot, params in enumerate(MIXED_PARAMS):
        prompt = torch.randint(0, vocab, (12,), generator=gen).tolist()
        output = torch.randint(0, vocab, (6,), generator=gen).tolist()
        state.set_slot(slot, params, seed=1000 + slot * 7919, prompt_ids=prompt, output_ids=output)
    return state


def mixed_rows(num_rows: int, vocab: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_rows, vocab, generator=gen) * 3
    slots = torch.arange(num_rows, dtype=torch.int32) % len(MIXED_PARAMS)
    slots[-1] = -1  # a padding row
    positions = torch.randint(0, 10_000, (num_rows,), generator=gen)
    return logits, slots, positions


# ---- the RNG -----------------------------------------------------------------------------------------
def murmur3_body(data: bytes, seed: int) -> int:
    """MurmurHash3_x86_32's body over whole 32-bit words, straight from its specification, on Python ints."""
    def rotl(x, r):
        return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF

    h = seed
    for (word,) in struct.iter_unpack("<I", data):
        k = rotl(word * 0xCC9E2D51 & 0xFFFFFFFF, 15) * 0x1B873593 & 0xFFFFFFFF
        h = (rotl(h ^ k, 13) * 5 + 0xE6546B64) & 0xFFFFFFFF
    return h


def fmix32(h: int) -> int:
    """MurmurHash3's finaliser (the fmix stream's token hash too, test_sampling_hash.py)."""
    h = ((h ^ (h >> 16)) * 0x85EBCA6B) & 0xFFFFFFFF
    h = ((h ^ (h >> 13)) * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


def murmur3_32(data: bytes, seed: int) -> int:
    """MurmurHash3_x86_32 straight from its specification, on Python ints."""
    return fmix32(murmur3_body(data, seed) ^ len(data))


def test_murmur3_matches_published_vectors():
    assert murmur3_32(b"", 0) == 0
    assert murmur3_32(b"", 1) == 0x514E28B7
    assert murmur3_32(b"\x00\x00\x00\x00", 0) == 0x2362F9DE
    assert murmur3_32(b"\xff\xff\xff\xff", 0) == 0x76293B50
    assert murmur3_32(b"\x21\x43\x65\x87", 0x5082EDEE) == 0x2362F9DE


def test_race_uniform_is_murmur3_of_seed_position_token():
    """The murmur stream (BLINK_SAMPLER_HASH=murmur); the default fmix one: test_sampling_hash.py."""
    seeds = [0, 1, -1, 2**63 - 1, -(2**63), 123456789123]
    positions = [0, 5, 2**32 - 1, 77, 1 << 20, 3]
    u = race_uniform_ref(torch.tensor(seeds), torch.tensor(positions), 40, "murmur")
    for row, (seed, position) in enumerate(zip(seeds, positions, strict=True)):
        seed &= (1 << 64) - 1
        for token in (0, 1, 17, 39):
            key = struct.pack("<III", seed >> 32, position, token)
            h = murmur3_32(key, seed & 0xFFFFFFFF)
            assert u[row, token].item() == ((h >> 9) + 0.5) / 2**23
    assert 0 < u.min() and u.max() < 1


# ---- Triton against the reference ------------------------------------------------------------------
@pytest.mark.parametrize("vocab", [64, 777])
def test_triton_matches_reference(vocab):
    state = mixed_state(vocab)
    logits, slots, positions = mixed_rows(40, vocab, seed=vocab)
    penalized = apply_penalties_ref(logits, slots, state)
    torch.testing.assert_close(apply_penalties_triton(logits, slots, state), penalized, rtol=1e-6, atol=1e-6)
    threshold = keep_thresholds(penalized, slots, state)
    assert torch.equal(keep_thresholds_triton(penalized, slots, state), threshold)
    expected = choose_tokens_ref(penalized, threshold, slots, positions, state)
    assert choose_tokens_triton(penalized, threshold, slots, positions, state).tolist() == expected.tolist()
    ref = sample_ref(logits, slots, positions, state, 4)
    tri = sample_triton(logits, slots, positions, state, 4)
    assert tri.token_ids.tolist() == ref.token_ids.tolist()
    torch.testing.assert_close(tri.logprobs, ref.logprobs)
    assert torch.equal(tri.top_ids, ref.top_ids)
    torch.testing.assert_close(tri.top_logprobs, ref.top_logprobs)
    if vocab != 64:
        return  # the interpreter is slow; one vocab shows the in-place path
    # Into a step's buffers (rows of larger tensors, as the runner passes them): the same values, in place
    buffers = SampleOutput(torch.full((48,), -7), torch.zeros(48), torch.zeros(48, 4, dtype=torch.int64),
                           torch.zeros(48, 4))
    out = SampleOutput(*(t[:40] for t in buffers))
    for impl in (sample_triton, sample):
        got = impl(logits, slots, positions, state, 4, out=out)
        assert all(g is o for g, o in zip(got, out, strict=True))
        assert buffers.token_ids[:40].tolist() == ref.token_ids.tolist() and (buffers.token_ids[40:] == -7).all()
        assert torch.equal(buffers.top_ids[:40], ref.top_ids)
        torch.testing.assert_close(buffers.logprobs[:40], ref.logprobs)
        buffers.token_ids[:40] = -7


def test_triton_choice_matches_reference_on_many_rows():
    vocab = 300
    state = SamplingState(1, vocab, "cpu")
    state.set_slot(0, SamplingParams(temperature=0.6), seed=42, prompt_ids=[0])
    logits = torch.randn(150, vocab, generator=torch.Generator().manual_seed(1)) * 2
    slots = torch.zeros(150, dtype=torch.int32)
    positions = torch.arange(150) * 13
    threshold = torch.full((150,), float("-inf"))
    expected = choose_tokens_ref(logits, threshold, slots, positions, state)
    assert choose_tokens_triton(logits, threshold, slots, positions, state).tolist() == expected.tolist()


# ---- determinism -----------------------------------------------------------------------------------
@pytest.mark.parametrize("impl", [sample_ref, sample_triton])
def test_seeded_tokens_do_not_depend_on_the_batch(impl):
    vocab = 128
    state = mixed_state(vocab)
    logits, slots, positions = mixed_rows(12, vocab)
    alone = [impl(logits[i:i + 1], slots[i:i + 1], positions[i:i + 1], state, 0).token_ids.item()
             for i in range(12)]
    order = torch.randperm(12, generator=torch.Generator().manual_seed(3))
    shuffled = impl(logits[order], slots[order], positions[order], state, 0).token_ids
    assert shuffled.tolist() == [alone[i] for i in order.tolist()]
    assert impl(logits, slots, positions, state, 0).token_ids.tolist() == alone


def test_same_seed_same_tokens_other_seed_other_tokens():
    vocab = 100
    state = SamplingState(3, vocab, "cpu")
    for slot, seed in enumerate([5, 5, 6]):
        state.set_slot(slot, SamplingParams(), seed=seed, prompt_ids=[0])
    logits = torch.zeros(60, vocab)  # uniform: every position is a fresh draw
    positions = torch.arange(60)
    draws = [sample(logits, torch.full((60,), s, dtype=torch.int32), positions, state, 0).token_ids
             for s in range(3)]
    assert torch.equal(draws[0], draws[1])
    assert (draws[0] != draws[2]).sum() > 40


LOGITS_8 = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])


# ---- penalties and bias ----------------------------------------------------------------------------
def penalized_by_hand(row, params, prompt, output):
    row = row.tolist()
    for token, bias in params.logit_bias.items():
        row[token] += bias
    for token in range(len(row)):
        count = output.count(token)
        if count or token in prompt:
            rp = params.repetition_penalty
            row[token] = row[token] / rp if row[token] > 0 else row[token] * rp
        row[token] -= params.frequency_penalty * count + params.presence_penalty * (count > 0)
    return torch.tensor(row)


@pytest.mark.parametrize("apply_penalties", [apply_penalties_ref, apply_penalties_triton])
def test_penalties_and_bias_match_a_hand_written_reference(apply_penalties):
    vocab = 16
    prompt, output = [1, 2, 3, 3], [3, 4, 4, 5, 9]
    cases = [
        SamplingParams(repetition_penalty=1.5),
        SamplingParams(presence_penalty=0.7, frequency_penalty=0.3),
        SamplingParams(repetition_penalty=0.7, presence_penalty=-0.5, frequency_penalty=-1.2),
        SamplingParams(logit_bias={0: 3.0, 4: -20.0, 15: 0.5}),
        SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, logit_bias={1: -4.0, 4: 6.0, 7: 1.0}),
        SamplingParams(),
    ]
    state = SamplingState(len(cases), vocab, "cpu")
    for slot, params in enumerate(cases):
        state.set_slot(slot, params, seed=0, prompt_ids=prompt, output_ids=output[:-1])
    slots = torch.arange(len(cases), dtype=torch.int32)
    state.record_tokens(slots, torch.full((len(cases),), output[-1]))
    logits = torch.randn(len(cases), vocab, generator=torch.Generator().manual_seed(0)) * 4
    got = apply_penalties(logits, slots, state)
    for slot, params in enumerate(cases):
        torch.testing.assert_close(got[slot], penalized_by_hand(logits[slot], params, prompt, output))
    # A padding row (slot -1) passes its logits through, whatever slot 0 holds.
    torch.testing.assert_close(apply_penalties(logits[:1], torch.tensor([-1], dtype=torch.int32), state),
                               logits[:1])


def test_greedy_picks_the_argmax_of_the_penalized_logits():
    state = SamplingState(1, 8, "cpu")
    state.set_slot(0, SamplingParams(temperature=0.0, logit_bias={6: 10.0}), seed=0, prompt_ids=[])
    slots, positions = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.long)
    out = sample(LOGITS_8[None], slots, positions, state, 2)
    assert out.token_ids.item() == 6
    # ...while its logprob is the raw one.
    assert out.logprobs.item() == pytest.approx(torch.log_softmax(LOGITS_8, -1)[6].item())


# ---- logprobs --------------------------------------------------------------------------------------
@pytest.mark.parametrize("impl", [sample_ref, sample_triton])
def test_logprobs_are_raw_log_softmax(impl):
    vocab = 200
    state = mixed_state(vocab)
    logits, slots, positions = mixed_rows(9, vocab)
    out = impl(logits, slots, positions, state, 5)
    expected = torch.log_softmax(logits, -1)
    torch.testing.assert_close(out.logprobs, expected.gather(1, out.token_ids[:, None]).squeeze(1))
    top_values, top_ids = expected.topk(5, -1)
    asks = torch.tensor([p.logprobs is not None and p.logprobs > 0 for p in MIXED_PARAMS])[slots.clamp(min=0)]
    asks &= slots >= 0
    assert asks.any() and not asks.all()
    assert torch.equal(out.top_ids[asks], top_ids[asks])
    torch.testing.assert_close(out.top_logprobs[asks], top_values[asks])
    # Rows whose slot asks for no logprobs (or padding) get nothing computed.
    assert (out.top_ids[~asks] == -1).all() and (out.top_logprobs[~asks] == float("-inf")).all()
    assert out.token_ids.dtype == torch.int64 and out.top_ids.dtype == torch.int64
    empty = impl(logits, slots, positions, state, 0)
    assert empty.top_ids.shape == (9, 0) and empty.top_logprobs.shape == (9, 0)


# ---- GPU -------------------------------------------------------------------------------------------
@pytest.mark.gpu
# session 17's levers off and on: the row race and two reads, the list race (sampling_race) and one read
# (sampling_compact)
@pytest.mark.parametrize(("race", "once"), [(0, False), (RACE_CAPACITY, True)])
def test_gpu_matches_reference_on_a_real_vocab(race, once):
    vocab, rows = 128256, 64
    cpu_state = mixed_state(vocab)
    cuda_state = SamplingState(cpu_state.max_slots, vocab, "cuda")
    for name, tensor in vars(cpu_state).items():
        if isinstance(tensor, torch.Tensor):
            getattr(cuda_state, name).copy_(tensor)
    logits, slots, positions = mixed_rows(rows, vocab)
    logits = (logits * 2).bfloat16().float()  # bf16-rounded like a real model's logits
    ref = sample_ref(logits, slots, positions, cpu_state, 20)
    got = sample_triton(logits.cuda(), slots.cuda(), positions.cuda(), cuda_state, 20, race=race, compact_once=once)
    torch.testing.assert_close(apply_penalties_triton(logits.cuda(), slots.cuda(), cuda_state).cpu(),
                               apply_penalties_ref(logits, slots, cpu_state))
    assert got.token_ids.cpu().tolist() == ref.token_ids.tolist()
    torch.testing.assert_close(got.logprobs.cpu(), ref.logprobs, rtol=1e-5, atol=1e-5)
    assert torch.equal(got.top_ids.cpu(), ref.top_ids)  # bf16 logits tie a lot: ties go by token id
    torch.testing.assert_close(got.top_logprobs.cpu(), ref.top_logprobs, rtol=1e-5, atol=1e-5)
    penalized = apply_penalties_ref(logits, slots, cpu_state)
    assert torch.equal(keep_thresholds_triton(penalized.cuda(), slots.cuda(), cuda_state, race=race,
                                              compact_once=once).cpu(),
                       keep_thresholds(penalized, slots, cpu_state))
    cuda_state.record_tokens(slots.cuda(), got.token_ids)
    cpu_state.record_tokens(slots, ref.token_ids)
    assert torch.equal(cuda_state.output_counts.cpu(), cpu_state.output_counts)
