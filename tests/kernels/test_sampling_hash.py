"""The race's uniforms in each BLINK_SAMPLER_HASH mode (sampling_rng): Triton's bits are the reference's, the
uniform's bit construction is the reference's formula for every 23-bit value, the fmix stream (the default) is
fmix32 of the row hash and the token and as uniform as murmur3's, and the sampler draws the reference's tokens in
each mode."""
import struct

import pytest
import torch
import triton
import triton.language as tl

from blink.kernels import sampling_noise, sampling_rng
from blink.kernels.sampling import sample_ref, sample_triton
from tests.kernels.test_sampling import fmix32, murmur3_body
from tests.kernels.test_sampling_reject import batch

UNIFORMS = {"murmur": sampling_rng._uniform_murmur, "fmix": sampling_rng._uniform_fmix}
SEEDS = [0, 1, -1, 2**63 - 1, -(2**63), 123456789123]
POSITIONS = [0, 5, 2**32 - 1, 77, 1 << 20, 3]


@triton.jit
def _uniform_kernel(seed_ptr, position_ptr, out_ptr, vocab, UNIFORM: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    hash_of_row = sampling_rng.row_hash(tl.load(seed_ptr + row), tl.load(position_ptr + row))
    for start in range(0, vocab, BLOCK):
        tokens = start + tl.arange(0, BLOCK)
        tl.store(out_ptr + row * vocab + tokens, UNIFORM(hash_of_row, tokens, sampling_rng.KEY_BYTES),
                 mask=tokens < vocab)


@triton.jit
def _unit_kernel(out_ptr, BLOCK: tl.constexpr):
    m = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + m, sampling_rng._unit(m.to(tl.uint32) << 9))


def test_the_fmix_stream_is_fmix32_of_the_row_hash_and_the_token():
    """fmix (the default) keeps murmur3's row part, the body over (seed_hi, position) keyed by seed_lo, and hashes
    the token as fmix32(row ^ token * 0x9E3779B9): both from plain-Python murmur3 (test_sampling.py)."""
    u = sampling_rng.race_uniform_ref(torch.tensor(SEEDS), torch.tensor(POSITIONS), 40, "fmix")
    for row, (seed, position) in enumerate(zip(SEEDS, POSITIONS, strict=True)):
        seed &= (1 << 64) - 1
        hash_of_row = murmur3_body(struct.pack("<II", seed >> 32, position), seed & 0xFFFFFFFF)
        for token in (0, 1, 17, 39):
            bits = fmix32(hash_of_row ^ (token * 0x9E3779B9 & 0xFFFFFFFF))
            assert u[row, token].item() == ((bits >> 9) + 0.5) / 2**23


@pytest.mark.parametrize("mode", list(UNIFORMS))
def test_triton_bits_are_the_references(mode):
    seeds, positions, vocab = torch.tensor(SEEDS), torch.tensor(POSITIONS), 3000
    out = torch.empty(len(SEEDS), vocab)
    _uniform_kernel[(len(SEEDS),)](seeds, positions, out, vocab, UNIFORM=UNIFORMS[mode], BLOCK=1024)
    assert torch.equal(out, sampling_rng.race_uniform_ref(seeds, positions, vocab, mode))


def test_the_bit_construction_is_the_formula_for_every_value():
    out = torch.empty(2**23)
    _unit_kernel[(8,)](out, BLOCK=1 << 20)
    m = torch.arange(2**23, dtype=torch.float64)
    assert torch.equal(out.double(), (m + 0.5) * 2.0**-23)


def test_the_fmix_stream_is_uniform_and_differs_from_murmurs():
    seeds, positions, vocab = torch.tensor(SEEDS), torch.tensor(POSITIONS), 128256
    murmur = sampling_rng.race_uniform_ref(seeds, positions, vocab, "murmur")
    fmix = sampling_rng.race_uniform_ref(seeds, positions, vocab, "fmix")
    assert (fmix != murmur).float().mean() > 0.99
    for u in (murmur, fmix):
        counts = torch.stack([torch.histc(row, bins=64, min=0, max=1) for row in u])
        expected = vocab / 64
        chi2 = ((counts - expected) ** 2 / expected).sum(dim=1)
        assert (chi2 < 120).all(), chi2  # 63 degrees of freedom: P(chi2 > 120) ~ 2e-5
        for row in u:  # neighbours (consecutive ids) and the same id in the next row are uncorrelated
            assert abs(torch.corrcoef(torch.stack([row[:-1], row[1:]]))[0, 1]) < 0.02
        assert abs(torch.corrcoef(u[:2])[0, 1]) < 0.02


def test_the_setting(monkeypatch):
    monkeypatch.delenv("BLINK_SAMPLER_HASH", raising=False)
    assert sampling_rng.hash_setting() == "fmix"  # the default since session 41
    assert sampling_rng.hash_setting("fmix") == "fmix"
    with pytest.raises(ValueError, match="BLINK_SAMPLER_HASH"):
        sampling_rng.hash_setting("xxhash")
    assert sampling_rng.race_uniform is UNIFORMS[sampling_rng.HASH]


@pytest.mark.parametrize(("race", "reject"), [(0, 0), (1024, "1k"), (1024, "3")])
@pytest.mark.parametrize("mode", list(UNIFORMS))
def test_the_sampler_draws_the_references_tokens_in_each_mode(monkeypatch, mode, race, reject):
    """Every race (the row stream, the list, the rejection's rounds) takes the mode's uniforms, and so does the
    reference; the two modes' tokens differ on some rows."""
    logits, slots, positions, state = batch(300, 21, seed=12)
    other = "murmur" if mode == "fmix" else "fmix"
    monkeypatch.setattr(sampling_rng, "HASH", other)
    theirs = sample_ref(logits, slots, positions, state, 2).token_ids.tolist()
    monkeypatch.setattr(sampling_rng, "HASH", mode)
    monkeypatch.setattr(sampling_noise, "race_uniform", UNIFORMS[mode])  # race_score's, every race's
    ref = sample_ref(logits, slots, positions, state, 2).token_ids.tolist()
    got = sample_triton(logits, slots, positions, state, 2, race=race, reject=reject)
    assert got.token_ids.tolist() == ref and ref != theirs


@pytest.mark.gpu
@pytest.mark.parametrize("mode", list(UNIFORMS))
def test_gpu_bits_are_the_references(mode):
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    seeds, positions, vocab = torch.tensor(SEEDS), torch.tensor(POSITIONS), 128256
    out = torch.empty(len(SEEDS), vocab, device="cuda")
    _uniform_kernel[(len(SEEDS),)](seeds.cuda(), positions.cuda(), out, vocab, UNIFORM=UNIFORMS[mode], BLOCK=1024)
    assert torch.equal(out.cpu(), sampling_rng.race_uniform_ref(seeds, positions, vocab, mode))
    units = torch.empty(2**23, device="cuda")
    _unit_kernel[(2**23 // 1024,)](units, BLOCK=1024)
    assert torch.equal(units.cpu().double(), (torch.arange(2**23, dtype=torch.float64) + 0.5) * 2.0**-23)
