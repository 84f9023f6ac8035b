"""The KV cache: the keys and values of past positions, kept so that decoding one more token costs one position of
work instead of recomputing the whole sequence.

Prompts of different lengths share one batch by left padding: the cache masks the padding and counts each row's
positions from its first real token, so a row gets the tokens it would get alone. KVCache grows with what is filled;
StaticKVCache keeps every step's shapes fixed, for a CUDA graph (cuda_graph.py). The model reads and writes a cache
through positions, attention_mask, update and advance; this module needs nothing from it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .config import GPTConfig
from .memory import huge_page_zeros


class KVCache:
    """Keys and values of every layer for a batch of left-padded sequences, preallocated per layer as
    (batch, n_kv_head, max_len, head_dim) (an MQA model's is n_head times smaller than MHA's; on a CPU, in huge
    pages: a decode step streams it whole). The first `length` positions are filled. Row b starts with `pad[b]`
    padding positions that no real query attends to, and its position ids count from its first real token."""

    def __init__(
        self, config: GPTConfig, batch_size: int, max_len: int | None = None, *, device=None, dtype=torch.float32
    ):
        self.max_len = max_len or config.block_size
        shape = (batch_size, config.kv_heads, self.max_len, config.head_dim)
        device = torch.device(device) if device is not None else torch.get_default_device()
        self.keys = [huge_page_zeros(shape, dtype, device) for _ in range(config.n_layer)]
        self.values = [huge_page_zeros(shape, dtype, device) for _ in range(config.n_layer)]
        self.length = 0
        self.pad: Tensor | None = None  # (batch,) padding per row; None when no row is padded

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.keys + self.values)

    @staticmethod
    def bytes_for(config: GPTConfig, batch_size: int, max_len: int, dtype: torch.dtype) -> int:
        """What a cache of this size holds, before allocating it."""
        return 2 * config.n_layer * batch_size * config.kv_heads * max_len * config.head_dim * dtype.itemsize

    @property
    def megabytes(self) -> float:
        return self.nbytes / 2**20

    def reset(self, pad: Tensor | None = None) -> None:
        """Empty the cache for new sequences whose row b begins with pad[b] padding tokens."""
        self.length = 0
        self.pad = pad if pad is not None and bool(pad.any()) else None

    def positions(self, T: int) -> Tensor:
        """Position ids of the next T tokens: (T,), or (batch, T) when rows are padded (padding gets 0)."""
        pos = torch.arange(self.length, self.length + T, device=self.keys[0].device)
        return pos if self.pad is None else (pos - self.pad[:, None]).clamp(min=0)

    def attention_mask(self, T: int) -> Tensor | None:
        """Which keys each of the next T queries may attend to (see _allowed), or None when plain causal attention
        is already exact: an empty cache (T == S) or a single query, both without padding."""
        if self.pad is None and (self.length == 0 or T == 1):
            return None
        query_pos = torch.arange(self.length, self.length + T, device=self.keys[0].device)
        return _allowed(query_pos, self.length + T, self.pad)

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store a layer's k, v (B, n_kv_head, T, hd) at the next T positions (B: the batch, or its first B rows in a
        shared prefill); returns the layer's keys and values so far: (B, n_kv_head, length + T, hd)."""
        B, end = k.size(0), self._check_room(k.size(2))
        self.keys[layer][:B, :, self.length : end] = k
        self.values[layer][:B, :, self.length : end] = v
        return self.keys[layer][:B, :, :end], self.values[layer][:B, :, :end]

    def _check_room(self, T: int) -> int:
        """Where T more positions would end; ValueError past max_len."""
        if self.length + T > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; {self.length + T} were asked for")
        return self.length + T

    def spread(self, source_rows: Tensor, pad: Tensor) -> None:
        """Give every row b the filled positions of row source_rows[b] and pad[b] padding positions (both (batch,)):
        one prefill serves all the rows that share a prompt."""
        for buffer in self.keys + self.values:
            buffer[:, :, : self.length] = buffer[source_rows, :, : self.length]  # indexing copies first
        self.pad = pad if bool(pad.any()) else None

    def advance(self, T: int) -> None:
        """Count the T positions every layer has just stored."""
        self.length += T


def _allowed(query_pos: Tensor, S: int, pad: Tensor | None) -> Tensor:
    """Which of S key positions each query, at query_pos (T,), may attend to: a boolean mask (1 or B, 1, T, S),
    causal and aligned bottom-right, hiding each row's pad[b] leading padding positions. A padding query may see
    itself, so no softmax row is empty (which gives NaN)."""
    query_pos = query_pos[:, None]  # (T, 1)
    key_pos = torch.arange(S, device=query_pos.device)  # (S,)
    allowed = key_pos <= query_pos  # (T, S)
    if pad is None:
        return allowed[None, None]
    real_key = key_pos >= pad[:, None, None]  # (B, 1, S)
    return (allowed & (real_key | (key_pos == query_pos)))[:, None]  # (B, 1, T, S)


class StaticKVCache(KVCache):
    """A KVCache whose decode steps all have the same shapes and read how far the cache is filled from a device
    tensor, not from Python: the step a CUDA graph can capture once and replay (see cuda_graph.py). Every query
    attends over all max_len positions through a mask that hides the unfilled ones (a full-length attention)."""

    def __init__(self, config: GPTConfig, batch_size: int, max_len: int | None = None, **placement) -> None:
        super().__init__(config, batch_size, max_len, **placement)  # placement: device= and dtype=
        device = self.keys[0].device
        self.filled = torch.zeros((), dtype=torch.long, device=device)  # `length` on the device
        self.pad_rows = torch.zeros(batch_size, dtype=torch.long, device=device)  # `pad`, always a tensor
        self.rows = batch_size  # rows in use: fewer during a prefill shared by several rows

    def reset(self, pad: Tensor | None = None) -> None:
        super().reset(pad)
        pad = pad if pad is not None else torch.zeros_like(self.pad_rows)
        self.rows = pad.numel()
        self.filled.zero_()  # in place: a captured step keeps reading these very tensors
        self.pad_rows[: self.rows].copy_(pad)

    def spread(self, source_rows: Tensor, pad: Tensor) -> None:
        super().spread(source_rows, pad)
        self.rows = pad.numel()
        self.pad_rows.copy_(pad)

    def _query_positions(self, T: int) -> Tensor:
        return self.filled + torch.arange(T, device=self.filled.device)  # (T,)

    def positions(self, T: int) -> Tensor:
        """(rows, T) position ids, counted from each row's first real token."""
        return (self._query_positions(T)[None] - self.pad_rows[: self.rows, None]).clamp(min=0)

    def attention_mask(self, T: int) -> Tensor:
        """(rows, 1, T, max_len): causal over the filled positions, padding hidden."""
        return _allowed(self._query_positions(T), self.max_len, self.pad_rows[: self.rows])

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store k, v (rows, n_kv_head, T, hd) at the next T positions; returns the whole buffers
        (rows, n_kv_head, max_len, hd), which the mask limits to what is filled."""
        self._check_room(k.size(2))
        where = self._query_positions(k.size(2))
        keys, values = self.keys[layer][: self.rows], self.values[layer][: self.rows]
        keys.index_copy_(2, where, k)
        values.index_copy_(2, where, v)
        return keys, values

    def advance(self, T: int) -> None:
        self.length += T
        self.filled += T
