"""Choosing the next token from logits: greedy, temperature, top-k and top-p (nucleus)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from .rules import SEED, at_least, between, check_rules, setting

TEMPERATURE = between(0, math.inf, "[)")
TOP_K = at_least(1)
TOP_P = between(0, 1, "(]")


@dataclass(frozen=True)
class Sampling:
    """How to pick each next token, validated the moment it is built."""

    temperature: float = setting(1.0, TEMPERATURE)  # 0 is greedy: always the most likely token
    top_k: Optional[int] = setting(None, TOP_K)  # sample among the k most likely tokens only; None: all
    top_p: float = setting(1.0, TOP_P)  # sample among the most likely tokens holding this much probability
    seed: Optional[int] = setting(None, SEED)  # the same seed, model and prompts give the same tokens

    def __post_init__(self) -> None:
        check_rules(self)

    def generator(self, device: torch.device | str) -> torch.Generator | None:
        """A random generator seeded with `seed` on device, or None for torch's global one."""
        if self.seed is None:
            return None
        return torch.Generator(device=device).manual_seed(self.seed)


def keep_top_k(logits: Tensor, k: int) -> Tensor:
    """logits (B, V) with every token below the k-th largest of its row set to -inf."""
    kth_largest = torch.topk(logits, min(k, logits.size(-1)), dim=-1).values[:, -1:]  # (B, 1)
    return logits.masked_fill(logits < kth_largest, float("-inf"))


def keep_top_p(logits: Tensor, p: float) -> Tensor:
    """logits (B, V) keeping, per row, the smallest set of most likely tokens whose
    probabilities add up to at least p; the rest set to -inf."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # probability of all more likely tokens
    # A token is needed while the more likely ones hold less than p; the first always is.
    drop_sorted = mass_before >= p
    drop = torch.empty_like(drop_sorted).scatter_(-1, order, drop_sorted)  # back to vocab order
    return logits.masked_fill(drop, float("-inf"))


def sample_next(logits: Tensor, sampling: Sampling, generator: torch.Generator | None = None) -> Tensor:
    """One token id per row from logits (B, V): a (B,) tensor."""
    logits = logits.float()
    if sampling.temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits / sampling.temperature
    if sampling.top_k is not None:
        logits = keep_top_k(logits, sampling.top_k)
    if sampling.top_p < 1:
        logits = keep_top_p(logits, sampling.top_p)
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)
