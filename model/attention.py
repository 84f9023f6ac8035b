"""Causal self-attention with n_head query heads sharing n_kv_head key/value heads.

n_kv_head == n_head is multi-head attention (MHA), n_kv_head == 1 is multi-query
attention (MQA), and anything in between is grouped-query attention (GQA):
query head h reads key/value head h // (n_head // n_kv_head).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import GPTConfig


def manual_attention(
    q: Tensor, k: Tensor, v: Tensor, dropout: nn.Module
) -> tuple[Tensor, Tensor]:
    """Explicit causal attention. q: (B, nh, T, hd); k, v: (B, nkv, T, hd).

    Returns the output (B, nh, T, hd) and the attention weights (B, nh, T, T),
    the latter before dropout so they sum to one over keys.
    """
    group = q.size(1) // k.size(1)
    # Give each query head its key/value head: (B, nkv, T, hd) -> (B, nh, T, hd).
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    T, S = q.size(-2), k.size(-2)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))  # (B, nh, T, S)
    # Query i sits at absolute position S - T + i and may look at keys 0..S - T + i.
    future = torch.ones(T, S, dtype=torch.bool, device=q.device).triu(S - T + 1)
    scores = scores.masked_fill(future, float("-inf"))
    weights = F.softmax(scores.float(), dim=-1).to(q.dtype)
    return dropout(weights) @ v, weights


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.n_kv_head = config.n_kv_head
        self.head_dim = config.head_dim
        self.impl = config.attn_impl
        self.dropout = config.dropout
        # One fused projection, laid out [q | k | v]: q is n_head heads wide, k and v
        # are n_kv_head heads wide each, so MQA/GQA really have fewer parameters.
        # With n_kv_head == n_head this is exactly GPT-2's c_attn.
        kv_dim = self.n_kv_head * self.head_dim
        self.split_sizes = (config.n_embd, kv_dim, kv_dim)
        self.c_attn = nn.Linear(config.n_embd, config.n_embd + 2 * kv_dim, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, return_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """x: (B, T, C). Returns the output (B, T, C) and, when asked for (which
        uses the manual path), the attention weights (B, n_head, T, T)."""
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.split_sizes, dim=2)
        # Split channels into heads and move heads before time: (B, T, h*hd) -> (B, h, T, hd).
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)

        weights = None
        if self.impl == "manual" or return_weights:
            y, weights = manual_attention(q, k, v, self.attn_dropout)
        else:
            y = F.scaled_dot_product_attention(
                q, k, v,
                dropout_p=self.dropout if self.training else 0.0,
                is_causal=True,
                enable_gqa=self.n_kv_head != self.n_head,
            )
        # Heads back side by side: (B, nh, T, hd) -> (B, T, C).
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y)), weights
