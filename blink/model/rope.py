"""RoPE tables: cos|sin of position x inverse frequency, for the apply_rope kernel (neox / rotate_half).

The inverse frequencies are computed exactly as transformers does (on the CPU, in float32, with the same
operation order), so the tables match HF's rotary embedding bit for bit before the final cos/sin.
"""
from __future__ import annotations

import math

import torch

from blink.model.config import Llama3RopeScaling, ModelConfig


def inverse_frequencies(cfg: ModelConfig) -> torch.Tensor:
    """[head_dim / 2] float32 on the CPU."""
    dim = cfg.head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    inv_freq = 1.0 / (cfg.rope_theta**exponents)
    if cfg.rope_scaling is not None:
        inv_freq = _llama3_scale(inv_freq, cfg.rope_scaling)
    return inv_freq


def _llama3_scale(inv_freq: torch.Tensor, s: Llama3RopeScaling) -> torch.Tensor:
    """Llama 3.1: keep high frequencies, divide low ones by `factor`, blend smoothly in between."""
    low_freq_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_freq_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rope_cos_sin(cfg: ModelConfig, max_positions: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[max_positions, head_dim] float32: cos(pos * inv_freq) in the first half, sin in the second."""
    inv_freq = inverse_frequencies(cfg).to(device)
    positions = torch.arange(max_positions, device=device, dtype=torch.int64).to(torch.float32)
    angles = positions[:, None] * inv_freq[None, :]
    return torch.cat((angles.cos(), angles.sin()), dim=-1).contiguous()
