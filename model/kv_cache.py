"""KVCache: the keys and values of past positions, kept so that decoding one more
token costs one position of work instead of recomputing the whole sequence."""

from __future__ import annotations

import torch
from torch import Tensor

from .config import GPTConfig
from .memory import huge_page_zeros


class KVCache:
    """Keys and values of every layer for a batch of left-padded sequences.

    Preallocated once per layer with shape (batch, n_kv_head, max_len, head_dim), so an
    MQA model's cache is n_head times smaller than an MHA model's. The first `length`
    positions are filled. Row b starts with `pad[b]` padding positions that no real
    query attends to, and its position ids count from its first real token.
    """

    def __init__(
        self,
        config: GPTConfig,
        batch_size: int,
        max_len: int | None = None,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.max_len = max_len or config.block_size
        shape = (batch_size, config.n_kv_head, self.max_len, config.head_dim)
        device = torch.device(device) if device is not None else torch.get_default_device()
        self.keys = [_zeros(shape, dtype, device) for _ in range(config.n_layer)]
        self.values = [_zeros(shape, dtype, device) for _ in range(config.n_layer)]
        self.length = 0
        self.pad: Tensor | None = None  # (batch,) padding per row; None when no row is padded

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.keys + self.values)

    @property
    def megabytes(self) -> float:
        return self.nbytes / 2**20

    def reset(self, pad: Tensor | None = None) -> None:
        """Empty the cache for new sequences whose row b begins with pad[b] padding tokens."""
        self.length = 0
        self.pad = pad if pad is not None and bool(pad.any()) else None

    def positions(self, T: int) -> Tensor:
        """Position ids of the next T tokens: (T,), or (batch, T) when rows are padded
        (padding positions get id 0; no real query looks at them)."""
        device = self.keys[0].device
        pos = torch.arange(self.length, self.length + T, device=device)
        if self.pad is None:
            return pos
        return (pos - self.pad[:, None]).clamp(min=0)

    def attention_mask(self, T: int) -> Tensor | None:
        """Which keys each of the next T queries may attend to, as a boolean mask
        (1 or batch, 1, T, S) over all S = length + T positions, or None when plain
        causal attention is already exact: an empty cache (T == S) or a single query,
        both without padding."""
        if self.pad is None and (self.length == 0 or T == 1):
            return None
        device = self.keys[0].device
        S = self.length + T
        query_pos = torch.arange(self.length, S, device=device)[:, None]  # (T, 1)
        key_pos = torch.arange(S, device=device)  # (S,)
        # Causal, aligned bottom-right: the queries are the last T of S positions.
        allowed = key_pos <= query_pos  # (T, S)
        if self.pad is None:
            return allowed[None, None]
        real_key = key_pos >= self.pad[:, None, None]  # (B, 1, S)
        # A padding query may see itself, so no softmax row is empty (which gives NaN).
        allowed = allowed & (real_key | (key_pos == query_pos))  # (B, T, S)
        return allowed[:, None]

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store a layer's keys and values for the next T positions, k, v: (B, n_kv_head, T, hd).
        Returns that layer's keys and values for all positions so far: (B, n_kv_head, length + T, hd)."""
        end = self.length + k.size(2)
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; {end} were asked for")
        self.keys[layer][:, :, self.length : end] = k
        self.values[layer][:, :, self.length : end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def advance(self, T: int) -> None:
        """Count the T positions every layer has just stored."""
        self.length += T


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """A decode step streams the whole cache, so on a CPU it lives in huge pages."""
    if device.type == "cpu":
        return huge_page_zeros(shape, dtype)
    return torch.zeros(shape, dtype=dtype, device=device)
