"""GPTConfig: the shape of a model, validated the moment it is built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

ATTENTION_IMPLS = ("sdpa", "manual")


@dataclass
class GPTConfig:
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64
    block_size: int = 1024  # longest sequence the position table covers
    n_layer: int = 12
    n_head: int = 12  # query heads
    # Key/value heads: None or n_head is MHA, 1 is MQA, any other divisor of n_head is GQA.
    n_kv_head: Optional[int] = None
    n_embd: int = 768
    dropout: float = 0.0  # on attention weights, residual branches and embeddings
    bias: bool = True  # biases in Linear and LayerNorm layers, as in GPT-2
    # "sdpa" uses torch's fused kernels; "manual" is explicit mask + softmax and
    # can return the attention weights. Both compute the same function.
    attn_impl: str = "sdpa"
    # Fair MHA/GQA/MQA comparisons at equal size: widen the MLP by as many units as the
    # smaller key/value projections save, so the total matches the MHA model's.
    match_mha_params: bool = False

    def __post_init__(self) -> None:
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_kv_head", "n_embd"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"GPTConfig.{name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"GPTConfig.n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})"
            )
        if self.n_head % self.n_kv_head:
            raise ValueError(
                f"GPTConfig.n_kv_head ({self.n_kv_head}) must divide n_head ({self.n_head}): "
                "each key/value head serves an equal group of query heads"
            )
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
            raise ValueError(f"GPTConfig.dropout must be in [0, 1), got {self.dropout!r}")
        for name in ("bias", "match_mha_params"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"GPTConfig.{name} must be true or false, got {getattr(self, name)!r}")
        if self.attn_impl not in ATTENTION_IMPLS:
            raise ValueError(
                f"GPTConfig.attn_impl must be one of {ATTENTION_IMPLS}, got {self.attn_impl!r}"
            )

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def mlp_hidden(self) -> int:
        """Width of the MLP's hidden layer: 4 * n_embd, widened when match_mha_params."""
        width = 4 * self.n_embd
        if not self.match_mha_params:
            return width
        bias = int(self.bias)
        # Per layer, each key/value head fewer saves a head_dim-wide slice of K and of V.
        saved = 2 * (self.n_head - self.n_kv_head) * self.head_dim * (self.n_embd + bias)
        # Each hidden unit costs a row of c_fc, its bias, and a column of c_proj.
        return width + round(saved / (2 * self.n_embd + bias))

    @property
    def attention_kind(self) -> str:
        """'MHA', 'MQA' or 'GQA', as the head counts make it."""
        if self.n_kv_head == self.n_head:
            return "MHA"
        return "MQA" if self.n_kv_head == 1 else "GQA"
