"""Decode speed and KV-cache size of an attention layout (MHA, GQA, MQA), for report.py: fewer
key/value heads mean a smaller cache and, at long context, faster decoding. The timed steps are
real KV-cached greedy decode steps against a cache filled synthetically (a step's work does not
depend on the values; a CPU prefill of 1024 tokens at GPT-2 size would take many seconds)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from model import GPT, GPTConfig, KVCache

GPT2_SMALL = dict(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768)


def kv_cache_bytes_per_token(config: GPTConfig, bytes_per_value: int = 4) -> int:
    """Bytes the KV cache holds per position of one sequence: a key and a value for every layer and kv head."""
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
    """Tokens/s (all `batch` rows) of greedy decode steps from a cache holding `context` positions,
    on the model's device and dtype: the fastest of `repeats` passes of `steps` (a busy moment does
    not decide it), after `warmup` untimed ones; context + max(steps, warmup) must fit block_size.
    The model comes back in its mode, its weights untouched; torch's global RNG is not used."""
    assert min(batch, steps, repeats) >= 1 and min(warmup, context) >= 0, (batch, steps, repeats, warmup, context)
    block_size, span = model.config.block_size, max(steps, warmup)
    if context + span > block_size:
        raise ValueError(
            f"context {context} + {span} decode steps = {context + span} positions exceeds the "
            f"model's block_size {block_size}: pick context <= {block_size - span}"
        )
    was_training = model.training
    weight = model.eval().lm_head.weight
    device = weight.device
    try:
        with torch.inference_mode():
            generator = torch.Generator(device).manual_seed(0)
            cache = KVCache(model.config, batch, context + span, device=device, dtype=weight.dtype)
            # One random (context, head_dim) block copied into every row, head and layer: drawing them all
            # would take seconds at GPT-2 size. The positions past context are written by the steps.
            block = torch.randn(context, model.config.head_dim, device=device, generator=generator).to(weight.dtype)
            for tensor in cache.keys + cache.values:
                tensor[:, :, :context] = block
            first = torch.randint(0, model.config.vocab_size, (batch,), device=device, generator=generator)

            def run(n: int) -> float:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                start, cache.length, tokens = time.perf_counter(), context, first
                for _ in range(n):
                    tokens = model(tokens[:, None], kv_cache=cache, last_only=True)[0][:, -1].argmax(-1)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                return time.perf_counter() - start

            run(warmup)
            return batch * steps / min(run(steps) for _ in range(repeats))
    finally:
        model.train(was_training)


def measure_layout(model: GPT, batches=(1, 8), contexts=None, steps=16, repeats=3) -> list[DecodeSpeed]:
    """decode_tokens_per_second for every batch and context, batch-major; contexts default to a
    short one (block_size // 16) and the longest that fits (block_size - steps)."""
    if contexts is None:
        contexts = (model.config.block_size // 16, model.config.block_size - max(steps, 2))
    return [DecodeSpeed(b, c, decode_tokens_per_second(model, b, c, steps, repeats)) for b in batches for c in contexts]


def gpt2_sized(config: GPTConfig) -> GPTConfig:
    """The same attention layout at GPT-2 small size: MHA stays MHA (12 key/value heads), MQA
    MQA (1), and GQA keeps its share of the query heads, rounded to the nearest divisor of 12
    that is still GQA (6, 4, 3). attn_impl and match_mha_params (it widens the MLP) carry over."""
    n_head = GPT2_SMALL["n_head"]
    share = n_head * config.kv_heads / config.n_head
    gqa = [d for d in range(2, n_head) if n_head % d == 0]  # 2, 3, 4, 6
    if config.attention_kind == "GQA":
        n_kv_head = min(gqa, key=lambda d: abs(math.log(d / share)))
    else:
        n_kv_head = n_head if config.attention_kind == "MHA" else 1
    return GPTConfig(
        **GPT2_SMALL,
        n_kv_head=n_kv_head,
        bias=True,
        attn_impl=config.attn_impl,
        match_mha_params=config.match_mha_params,
    )
