"""Causal self-attention with n_head query heads sharing n_kv_head key/value heads: n_kv_head == n_head is
multi-head attention (MHA), 1 is multi-query (MQA), anything between is grouped-query (GQA), query head h
reading key/value head h // (n_head // n_kv_head)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import GPTConfig
from .documents import BlockMask, flex_attend
from .kv_cache import KVCache
from .rotary import apply_rotary, rotary_angles

Rope = tuple[Tensor, Tensor]  # cos and sin of rotary's angles (rotary_angles)


Mask = Tensor | BlockMask | None  # a KV cache's attention_mask, or a document mask (documents.py)


def manual_attention(q: Tensor, k: Tensor, v: Tensor, dropout: nn.Module, allowed: Tensor | None = None):
    """Explicit attention. q: (B, nh, T, hd); k, v: (B, nkv, S, hd), the queries being the last T of S positions;
    allowed: a boolean mask broadcastable to (B, nh, T, S), True where a query may attend; causal when None.
    Returns the output (B, nh, T, hd) and the attention weights (B, nh, T, S), before dropout (summing to one)."""
    group = q.size(1) // k.size(1)
    # Give each query head its key/value head: (B, nkv, S, hd) -> (B, nh, S, hd).
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    T, S = q.size(-2), k.size(-2)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))  # (B, nh, T, S)
    if allowed is None:  # query i sits at absolute position S - T + i and may look at keys 0..S - T + i
        allowed = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)
    weights = F.softmax(scores.masked_fill(~allowed, float("-inf")).float(), dim=-1).to(q.dtype)
    return dropout(weights) @ v, weights


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, layer_idx: int = 0) -> None:
        super().__init__()
        self.layer_idx = layer_idx  # which of a KVCache's layers is this one's
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.kv_heads, config.head_dim
        self.impl, self.dropout = config.attn_impl, config.dropout
        self.qk_norm, self.norm_eps = config.qk_norm, config.norm_eps
        self.rope_base = config.rope_base if config.position == "rope" else None  # None: no rotary
        # One fused projection, laid out [q | k | v]: q is n_head heads wide, k and v
        # are n_kv_head heads wide each, so MQA/GQA really have fewer parameters.
        # With n_kv_head == n_head this is exactly GPT-2's c_attn.
        kv_dim = self.n_kv_head * self.head_dim
        self.split_sizes = (config.n_embd, kv_dim, kv_dim)
        self.c_attn = nn.Linear(config.n_embd, config.n_embd + 2 * kv_dim, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(
        self, x: Tensor, kv_cache: KVCache | None = None, mask: Mask = None, rope: Rope | None = None
    ) -> Tensor:
        """x: (B, T, C) -> (B, T, C). With a kv_cache, x holds the T positions after the cached ones, and mask is the
        cache's attention_mask(T) (None: plain causal); without, mask may be a document mask. rope: see heads."""
        B, T, C = x.shape
        q, k, v = self.heads(x, rope)
        if kv_cache is not None:
            k, v = kv_cache.update(self.layer_idx, k, v)  # (B, nkv, S, hd), S = cached + T
        if isinstance(mask, BlockMask):
            y = flex_attend(q, k, v, mask)
        elif self.impl == "manual":
            y, _ = manual_attention(q, k, v, self.attn_dropout, mask)
        else:
            y = self._sdpa(q, k, v, mask)
        # Heads back side by side: (B, nh, T, hd) -> (B, T, C).
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))

    def heads(self, x: Tensor, rope: Rope | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """The queries (B, n_head, T, hd), keys and values (B, n_kv_head, T, hd) of x (B, T, C), q and k RMS-normed
        per head with qk_norm, then rotated by rope (cos, sin: rotary_angles of x's positions; without it, those of
        0..T-1). A KV cache stores k as returned."""
        B, T, _ = x.shape
        # Split channels into heads and move heads before time: (B, T, h*hd) -> (B, h, T, hd).
        q, k, v = (t.view(B, T, -1, self.head_dim).transpose(1, 2) for t in self.c_attn(x).split(self.split_sizes, 2))
        if self.qk_norm:
            q, k = (F.rms_norm(t, (self.head_dim,), eps=self.norm_eps) for t in (q, k))
        if self.rope_base is not None:
            cos, sin = rope or rotary_angles(torch.arange(T, device=x.device), self.head_dim, self.rope_base)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        return q, k, v

    def _sdpa(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """torch's fused attention. q: (B, nh, T, hd); k, v: (B, nkv, S, hd)."""
        B, _, T, hd = q.shape
        group = self.n_head // self.n_kv_head
        options = dict(attn_mask=mask, dropout_p=self.dropout if self.training else 0.0)
        if T == 1 and group > 1:
            # One new token: each key/value head answers its group of query heads as `group` queries,
            # (B, nh, 1, hd) -> (B, nkv, group, hd), so the cache is read once per kv head, not per query head.
            y = F.scaled_dot_product_attention(q.reshape(B, self.n_kv_head, group, hd), k, v, **options)
            return y.reshape(B, self.n_head, 1, hd)
        # is_causal aligns its mask top-left, which is right only when T == S; a single query needs no mask, and
        # other cases come with an explicit mask. A branch, not an expression: under torch.compile's dynamic
        # shapes T > 1 is symbolic, and the kernel takes a plain bool (the branch becomes a guard).
        causal = True if mask is None and T > 1 else False
        return F.scaled_dot_product_attention(q, k, v, **options, is_causal=causal, enable_gqa=group > 1)
