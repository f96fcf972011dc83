"""The race's noise, -log(-log u) (sampling_noise.race_noise), in each BLINK_SAMPLER_NOISE mode: for every one of the
2^23 uniforms the hash can give, against float64 (the interpreter here; the GPU's lg2.approx in the gpu test); and
the sampler with the fast noise draws the CPU reference's tokens."""
import pytest
import torch
import triton
import triton.language as tl

from blink.kernels import sampling_noise
from blink.kernels.sampling import sample_ref, sample_triton
from tests.kernels.test_sampling_reject import batch

MODES = {"exact": sampling_noise._noise_exact, "fast": sampling_noise._noise_fast, "fast2": sampling_noise._noise_fast2}
# the error over max(1, |noise|): a few ulps of the noise (2^-23 relative), so of a score at least as large
# (measured on this CPU with numpy's float32 logs: exact 2.9e-7, fast 2.9e-7, fast2 2.6e-7)
MAX_ERROR = 2.0**-21


@triton.jit
def _noise_kernel(u_ptr, out_ptr, n, NOISE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, NOISE(tl.load(u_ptr + offs, mask=mask, other=0.5)), mask=mask)


def noise_errors(device: str) -> dict[str, float]:
    """Each mode's largest error (over max(1, |noise|)) over every u that race_uniform returns: (m + 0.5) 2^-23 for
    every m < 2^23."""
    u = (torch.arange(2**23, dtype=torch.float32, device=device) + 0.5) * 2.0**-23
    truth = -torch.log(-torch.log(u.double()))
    errors = {}
    for name, fn in MODES.items():
        out = torch.empty_like(u)
        block = 1 << 20 if device == "cpu" else 1024  # the interpreter: few programs; the GPU: a real block
        _noise_kernel[(triton.cdiv(u.numel(), block),)](u, out, u.numel(), NOISE=fn, BLOCK=block)
        errors[name] = ((out.double() - truth).abs() / truth.abs().clamp(min=1.0)).max().item()
    return errors


def test_every_mode_is_within_about_an_ulp_of_the_noise():
    errors = noise_errors("cpu")
    assert all(e <= MAX_ERROR for e in errors.values()), errors


def test_the_series_above_one_half_has_a_small_relative_error():
    """The GPU needs the series from u = 1/2 up (lg2.approx's error is absolute, and -log u -> 0 there). The
    interpreter's log2 is exact, so it cannot show that need; this checks the series alone: relative error within
    4 half-ulps."""
    u = (torch.arange(2**22, 2**23, dtype=torch.float32) + 0.5) * 2.0**-23
    out = torch.empty_like(u)

    @triton.jit
    def inner(u_ptr, out_ptr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, sampling_noise.inner_log_fast(tl.load(u_ptr + offs)))

    inner[(4,)](u, out, BLOCK=1 << 20)
    truth = -torch.log(u.double())
    assert ((out.double() - truth).abs() / truth).max().item() <= 4 * 2.0**-24


def test_the_setting():
    assert sampling_noise.noise_setting("fast2") == "fast2"
    with pytest.raises(ValueError, match="BLINK_SAMPLER_NOISE"):
        sampling_noise.noise_setting("approx")
    assert sampling_noise.race_noise is MODES[sampling_noise.NOISE]


@pytest.mark.parametrize("mode", ["fast", "fast2"])
@pytest.mark.parametrize(("race", "reject"), [(0, 0), (1024, "1k"), (1024, "3")])
def test_the_sampler_with_the_fast_noise_draws_the_references_tokens(monkeypatch, mode, race, reject):
    """Every race of the sampler (the row stream, the list, the rejection's rounds) takes the mode's noise."""
    monkeypatch.setattr(sampling_noise, "race_noise", MODES[mode])  # race_score's, every race's
    logits, slots, positions, state = batch(300, 21, seed=11)
    got = sample_triton(logits, slots, positions, state, 2, race=race, reject=reject)
    assert got.token_ids.tolist() == sample_ref(logits, slots, positions, state, 2).token_ids.tolist()


@pytest.mark.gpu
def test_every_mode_on_the_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    errors = noise_errors("cuda")
    print("noise error / max(1, |noise|) on the GPU:", errors)
    assert all(e <= MAX_ERROR for e in errors.values()), errors
