"""Rotary position embeddings (RoPE; Su et al., 2021), in the layout Llama uses.

Each query and key head of width d is rotated by angles that grow with its position:
channel i of the head's first half and channel i of its second half form a pair,
turned by the angle position * base ** (-2i / d). A query at position m and a key at
position n then meet as if both were at 0 and n - m: attention scores depend on how
far apart two tokens are, not on where they are. Hugging Face's Llama pairs channels
the same way (its rotate_half), so its q and k projections are gptlab's as they are.
"""

from __future__ import annotations

import torch
from torch import Tensor


def rotary_angles(pos: Tensor, head_dim: int, base: float) -> tuple[Tensor, Tensor]:
    """cos and sin of every position's angles, each channel pair's angle written in
    both its channels: (T, head_dim) for positions (T,), or (B, 1, T, head_dim) for
    positions (B, T) (one row each; the 1 broadcasts over heads). fp32."""
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
