"""A decode step captured once as a CUDA graph and replayed for every later token.

At batch 1 a GPU decode step is a few hundred small kernels, which Python launches slower than they run; a CUDA
graph replays one step's launches at once, against fixed tensors. That needs a step whose shapes never change and
whose state lives on the device: a StaticKVCache (kv_cache.py) gives both.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .gpt import GPT
from .kv_cache import KVCache, StaticKVCache

WARMUP_STEPS = 2  # eager runs on a side stream before capture, as torch asks for


def decode_step(model: GPT, cache: KVCache, tokens: Tensor) -> Tensor:
    """Next-token logits (B, vocab) after appending tokens (B,) to the cached sequences."""
    return model(tokens[:, None], kv_cache=cache, last_only=True)[0][:, -1]


class GraphedDecodeStep:
    """decode_step(model, cache, tokens (B,)) as a CUDA graph, captured at the first call from wherever the cache
    stands. Each call replays it (storing keys and values, moving the cache on by one) and returns the next-token
    logits (B, vocab) in the graph's output tensor, which the next call overwrites."""

    def __init__(self, model: GPT, cache: StaticKVCache) -> None:
        device = cache.keys[0].device
        if device.type != "cuda":
            raise ValueError(f"a CUDA graph needs the model on a CUDA device, not {device}")
        self.model, self.cache = model, cache
        self.tokens = torch.zeros(cache.pad_rows.size(0), dtype=torch.long, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: Tensor | None = None

    def __call__(self, tokens: Tensor) -> Tensor:
        self.tokens.copy_(tokens.view(-1))
        if self.graph is None:
            self._capture()
        self.graph.replay()
        self.cache.length += 1  # the replay moved the device's count; Python's follows
        return self.logits

    def _capture(self) -> None:
        # Each warm-up step and the capture advance the cache by one; step back after each, so the first replay
        # writes the position they wrote (with the same tokens).
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                decode_step(self.model, self.cache, self.tokens)
                self.cache.length -= 1
                self.cache.filled -= 1
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = decode_step(self.model, self.cache, self.tokens)
        self.cache.length -= 1  # capture records the kernels without running them
