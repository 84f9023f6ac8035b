"""Rotary position embeddings (RoPE; Su et al., 2021), in Llama's layout: channel i of a head's first half and
channel i of its second half form a pair, turned by position * base ** (-2i / d), so attention scores depend on how
far apart two tokens are, not where. Hugging Face's Llama pairs channels the same way (rotate_half)."""

from __future__ import annotations

import torch
from torch import Tensor


def rotary_angles(pos: Tensor, head_dim: int, base: float) -> tuple[Tensor, Tensor]:
    """cos and sin (fp32) of every position's angles, each pair's in both its channels: (T, head_dim) for positions
    (T,), or (B, 1, T, head_dim) for positions (B, T) (the 1 broadcasts over heads)."""
    exponents = torch.arange(0, head_dim, 2, device=pos.device, dtype=torch.float32) / head_dim
    inv_freq = 1.0 / (base**exponents)  # (head_dim / 2,)
    angles = pos.float()[..., None] * inv_freq  # (..., T, head_dim / 2)
    angles = torch.cat([angles, angles], dim=-1)
    if pos.dim() == 2:
        angles = angles[:, None]
    return angles.cos(), angles.sin()


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (B, heads, T, head_dim) rotated by the angles cos, sin (rotary_angles), in x's dtype."""
    first, second = x.chunk(2, dim=-1)
    turned = torch.cat([-second, first], dim=-1)  # each pair (a, b) -> (-b, a)
    return x * cos.to(x.dtype) + turned * sin.to(x.dtype)
