"""Decode speed and KV-cache size of an attention layout (MHA, GQA, MQA), for report.py.

MHA, GQA and MQA differ only in n_kv_head: how many key/value heads the cache holds.
A decode step reads every weight and the whole cache once, so fewer key/value heads
mean a smaller cache and, at long context, faster decoding.

decode_tokens_per_second times real KV-cached greedy decode steps (model forward of
one token per row, argmax, the token fed back: what model.stream does per step, less
its Python bookkeeping) against a cache that already holds `context` positions. The
cache is filled synthetically with random keys and values instead of by a prefill: a
step's work does not depend on their values, and a CPU prefill of 1024 tokens at
GPT-2 size takes many seconds. So a measurement costs seconds, not minutes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from model import GPT, GPTConfig, KVCache

GPT2_SMALL = dict(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768)


def kv_cache_bytes_per_token(config: GPTConfig, bytes_per_value: int = 4) -> int:
    """Bytes the KV cache holds per position of one sequence: a key and a value
    (2) for every layer and key/value head, head_dim values each."""
    return 2 * config.n_layer * config.kv_heads * config.head_dim * bytes_per_value


def kv_cache_bytes(config: GPTConfig, tokens: int, bytes_per_value: int = 4) -> int:
    """Bytes of the KV cache for `tokens` positions (all rows together: batch * length)."""
    return tokens * kv_cache_bytes_per_token(config, bytes_per_value)


@dataclass(frozen=True)
class DecodeSpeed:
    batch: int
    context: int  # positions already in the cache when the timed steps begin
    tokens_per_s: float  # new tokens of all rows per second


def decode_tokens_per_second(
    model: GPT, batch: int, context: int, steps: int = 16, repeats: int = 3, *, warmup: int = 2
) -> float:
    """Tokens/s (all `batch` rows) of KV-cached greedy decode steps taken when the cache
    already holds `context` positions, on the model's device and in its dtype.

    The cache is filled with random values and its length set to `context`; `warmup`
    untimed steps run first, then `repeats` passes of `steps` timed steps, each pass
    starting again from length `context`. The fastest pass counts, so that a busy
    moment on a shared machine does not decide the figure. The steps cover positions
    context .. context + max(steps, warmup) - 1, so that must stay within block_size
    (ValueError otherwise). The model runs in eval mode and is handed back in the mode
    it came in, its weights untouched; torch's global random state is not used.
    """
    assert min(batch, steps, repeats) >= 1 and min(warmup, context) >= 0, (batch, steps, repeats, warmup, context)
    block_size = model.config.block_size
    span = max(steps, warmup)
    if context + span > block_size:
        raise ValueError(
            f"context {context} + {span} decode steps = {context + span} positions exceeds the "
            f"model's block_size {block_size}: pick context <= {block_size - span}"
        )
    was_training = model.training
    model.eval()
    try:
        return _decode_tokens_per_second(model, batch, context, steps, repeats, warmup)
    finally:
        model.train(was_training)


@torch.inference_mode()
def _decode_tokens_per_second(model: GPT, batch: int, context: int, steps: int, repeats: int, warmup: int) -> float:
    weight = model.lm_head.weight
    device = weight.device
    generator = torch.Generator(device).manual_seed(0)
    cache = KVCache(model.config, batch, context + max(steps, warmup), device=device, dtype=weight.dtype)
    # One random (context, head_dim) block copied into every row, head and layer: the
    # speed does not depend on the values, and drawing them all would take seconds at
    # GPT-2 size (this copy costs about what touching the fresh pages does). The
    # positions past context are written by the steps.
    block = torch.randn(context, model.config.head_dim, device=device, generator=generator).to(weight.dtype)
    for tensor in cache.keys + cache.values:
        tensor[:, :, :context] = block
    first = torch.randint(0, model.config.vocab_size, (batch,), device=device, generator=generator)

    def run(n: int) -> None:
        cache.length = context
        tokens = first
        for _ in range(n):
            logits = model(tokens[:, None], kv_cache=cache, last_only=True)[0][:, -1]
            tokens = logits.argmax(-1)

    run(warmup)
    fastest = math.inf
    for _ in range(repeats):
        _synchronize(device)
        start = time.perf_counter()
        run(steps)
        _synchronize(device)
        fastest = min(fastest, time.perf_counter() - start)
    return batch * steps / fastest


def measure_layout(
    model: GPT,
    batches: Sequence[int] = (1, 8),
    contexts: Sequence[int] | None = None,
    steps: int = 16,
    repeats: int = 3,
) -> list[DecodeSpeed]:
    """decode_tokens_per_second for every batch and context, batch-major. contexts
    defaults to a short one (block_size // 16) and the longest that fits
    (block_size - steps)."""
    if contexts is None:
        contexts = (model.config.block_size // 16, model.config.block_size - max(steps, 2))
    return [
        DecodeSpeed(batch, context, decode_tokens_per_second(model, batch, context, steps, repeats))
        for batch in batches
        for context in contexts
    ]


def gpt2_sized(config: GPTConfig) -> GPTConfig:
    """The same attention layout at GPT-2 small size (12 layers, 12 heads, 768 wide,
    block_size 1024): MHA stays MHA (12 key/value heads), MQA stays MQA (1), and GQA
    keeps its share of the query heads, rounded to the nearest divisor of 12 that is
    still GQA (half the heads: 6, a third: 4, a quarter: 3). attn_impl and
    match_mha_params carry over (the latter widens the MLP, so it changes the speed);
    dropout is 0 (this is for inference)."""
    n_head = GPT2_SMALL["n_head"]
    if config.attention_kind == "MHA":
        n_kv_head = n_head
    elif config.attention_kind == "MQA":
        n_kv_head = 1
    else:
        share = n_head * config.kv_heads / config.n_head
        gqa = [d for d in range(2, n_head) if n_head % d == 0]  # 2, 3, 4, 6
        n_kv_head = min(gqa, key=lambda d: abs(math.log(d / share)))
    return GPTConfig(
        **GPT2_SMALL,
        n_kv_head=n_kv_head,
        bias=True,
        attn_impl=config.attn_impl,
        match_mha_params=config.match_mha_params,
    )


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
