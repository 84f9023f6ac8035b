"""The inference engine: the sampling of each next token, and generation that prefills the prompts in one
forward pass, then decodes one token per step against a KV cache (kv_cache.py).

Prompts of different lengths share one batch by left padding, which the cache masks. Past block_size the window
slides: the cache is refilled with the last block_size tokens, exactly the context of a model that crops its input
to block_size (each such step costs a prefill of block_size).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor

from rules import SEED, at_least, between, check_rules, setting

from .cuda_graph import GraphedDecodeStep, decode_step
from .gpt import GPT
from .kv_cache import KVCache, StaticKVCache

# Sampling: choosing the next token from logits, greedy, temperature, top-k and top-p (nucleus)
TEMPERATURE = between(0, math.inf, "[)")
TOP_K = at_least(1)
TOP_P = between(0, 1, "(]")


@dataclass(frozen=True)
class Sampling:
    """How to pick each next token, validated the moment it is built."""

    temperature: float = setting(1.0, TEMPERATURE)  # 0 is greedy: always the most likely token
    top_k: int | None = setting(None, TOP_K)  # sample among the k most likely tokens only; None: all
    top_p: float = setting(1.0, TOP_P)  # sample among the most likely tokens holding this much probability
    seed: int | None = setting(None, SEED)  # the same seed, model and prompts give the same tokens

    def __post_init__(self) -> None:
        check_rules(self)

    def generator(self, device: torch.device | str) -> torch.Generator | None:
        """A random generator seeded with `seed` on device, or None for torch's global one."""
        return None if self.seed is None else torch.Generator(device=device).manual_seed(self.seed)


def keep_top_k(logits: Tensor, k: int) -> Tensor:
    """logits (B, V) with every token below the k-th largest of its row set to -inf."""
    kth_largest = torch.topk(logits, min(k, logits.size(-1)), dim=-1).values[:, -1:]  # (B, 1)
    return logits.masked_fill(logits < kth_largest, float("-inf"))


def keep_top_p(logits: Tensor, p: float) -> Tensor:
    """logits (B, V) keeping, per row, the fewest most likely tokens holding at least p; the rest set to -inf."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # probability of all more likely tokens
    # A token is needed while the more likely ones hold less than p; the first always is.
    drop = torch.empty_like(order, dtype=torch.bool).scatter_(-1, order, mass_before >= p)  # back to vocab order
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
    return torch.multinomial(logits.softmax(dim=-1), num_samples=1, generator=generator).squeeze(-1)


StopCheck = Callable[[list[int]], bool]  # from a row's generated tokens (newest last): is the row done?
# eager: a KVCache sized to what is filled; graph: a StaticKVCache and the decode step replayed as a CUDA graph;
# static: the same step run as plain calls (what the graph captures, checkable on any device).
DECODE_MODES = ("eager", "graph", "static")


@torch.inference_mode()
def stream(
    model: GPT,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    sampling: Sampling = Sampling(),
    *,
    stop_tokens: Collection[int] = (),
    stop: StopCheck | None = None,
    vocab_size: int | None = None,
    decode: str = "eager",
) -> Iterator[dict[int, int]]:
    """Generate continuations of prompts (lists of token ids) as one batch, yielding {row: new token} after every
    step for the rows still generating. A row ends when it samples one of stop_tokens (such as <|endoftext|>, not
    yielded), when stop(its generated tokens) is true (that token is yielded; sample.py maps stop strings to this),
    or after max_new_tokens. Only ids below vocab_size are sampled: pass the tokenizer's when the model's vocabulary
    is padded (the padding rows are never trained). decode: one of DECODE_MODES. Rows with the same prompt share one
    prefill. Put the model in eval mode first."""
    if decode not in DECODE_MODES:
        raise ValueError(f"decode must be one of {DECODE_MODES}, got {decode!r}")
    assert max_new_tokens >= 1, max_new_tokens
    if not prompts or any(len(prompt) == 0 for prompt in prompts):
        raise ValueError("every prompt needs at least one token (start from <|endoftext|>)")
    if outside := sorted({t for prompt in prompts for t in prompt if not 0 <= t < model.config.vocab_size}):
        raise ValueError(f"token ids {outside[:5]} are outside the model's vocabulary [0, {model.config.vocab_size})")
    # Room for the tokens grows as they come, not all up front: max_new_tokens may be huge.
    room = min(max_new_tokens, model.config.block_size)
    history, pad = _left_pad(prompts, room, model.device)  # (B, n + room), (B,)
    n = history.size(1) - room  # columns filled so far, padding included
    end = n + max_new_tokens  # the column after a row's last possible token
    max_len = min(end, model.config.block_size)
    cache_type = KVCache if decode == "eager" else StaticKVCache
    cache = cache_type(model.config, len(prompts), max_len, device=model.device, dtype=model.activation_dtype)
    step = GraphedDecodeStep(model, cache) if decode == "graph" else partial(decode_step, model, cache)
    generator = sampling.generator(model.device)
    generated: list[list[int]] = [[] for _ in prompts]
    ended = [False] * len(prompts)
    logits = _prefill(model, cache, history[:, :n], pad)
    while True:
        tokens = sample_next(logits[:, :vocab_size], sampling, generator)  # (B,)
        if n == history.size(1):  # (B, n) -> (B, up to 2n)
            history = torch.cat([history, torch.zeros_like(history[:, : end - n])], dim=1)
        history[:, n] = tokens
        n += 1
        new = {}
        for row, token in enumerate(tokens.tolist()):
            if ended[row] or token in stop_tokens:  # a stop token ends its row, unyielded
                ended[row] = True
                continue
            generated[row].append(token)
            new[row] = token
            ended[row] = stop is not None and stop(generated[row])
        if new:
            yield new
        if n == end or all(ended):
            return
        if cache.length == cache.max_len:  # past block_size: slide the window
            logits = _prefill(model, cache, history[:, :n], pad)
        else:
            logits = step(tokens)


def generate(
    model: GPT, prompts: Sequence[Sequence[int]], max_new_tokens: int, sampling: Sampling = Sampling(), **options
) -> list[list[int]]:
    """The generated tokens of every prompt: everything stream() (with the same options) yields, per row."""
    outputs: list[list[int]] = [[] for _ in prompts]
    for new in stream(model, prompts, max_new_tokens, sampling, **options):
        for row, token in new.items():
            outputs[row].append(token)
    return outputs


def _left_pad(prompts: Sequence[Sequence[int]], extra_columns: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """The prompts right-aligned in a (B, longest + extra_columns) tensor, and each row's padding columns (B,)."""
    longest = max(len(prompt) for prompt in prompts)
    history = torch.zeros(len(prompts), longest + extra_columns, dtype=torch.long, device=device)
    for row, prompt in enumerate(prompts):
        history[row, longest - len(prompt) : longest] = torch.tensor(prompt, dtype=torch.long)
    return history, torch.tensor([longest - len(prompt) for prompt in prompts], device=device)


def _prefill(model: GPT, cache: KVCache, tokens: Tensor, pad: Tensor) -> Tensor:
    """Refill the cache with the last block_size columns of tokens (B, n), row b beginning with pad[b] padding
    columns, running each distinct row once (a prompt's samples share it). Returns the next-token logits (B, vocab)."""
    start = max(0, tokens.size(1) - model.config.block_size)
    pad = (pad - start).clamp(min=0)
    # Equal tokens with different padding are different rows: a prompt may begin with id 0.
    rows = torch.cat([pad[:, None], tokens[:, start:]], dim=1)
    distinct, source = torch.unique(rows, dim=0, return_inverse=True)  # (U, 1 + n - start), (B,)
    if len(distinct) == len(rows):  # no row shared (always so once the window slides): no copies
        distinct, source = rows, None
    cache.reset(distinct[:, 0])
    logits, _ = model(distinct[:, 1:], kv_cache=cache, last_only=True)
    if source is None:
        return logits[:, -1]
    cache.spread(source, pad)
    return logits[source, -1]
