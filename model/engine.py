"""The inference engine: a KV cache, the sampling of each next token, and generation
that prefills the prompts in one forward pass, then decodes one token per step against
the cache.

The cache keeps the keys and values of past positions, so that decoding one more token
costs one position of work instead of recomputing the whole sequence. Prompts of
different lengths share one batch by left padding: the cache masks the padding and
counts each row's positions from its first real token, so a row gets the tokens it
would get alone. Past block_size the window slides: the cache is refilled with the last
block_size tokens, exactly the context of a model that crops its input to block_size
(each such step costs a prefill of block_size).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Optional

import torch
from torch import Tensor

from .config import GPTConfig
from .cuda_graph import GraphedDecodeStep
from .gpt import GPT
from .memory import huge_page_zeros
from rules import SEED, at_least, between, check_rules, setting

# Sampling: choosing the next token from logits, greedy, temperature, top-k and top-p (nucleus)
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


# The KV cache
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
        shape = (batch_size, config.kv_heads, self.max_len, config.head_dim)
        device = torch.device(device) if device is not None else torch.get_default_device()
        self.keys = [_zeros(shape, dtype, device) for _ in range(config.n_layer)]
        self.values = [_zeros(shape, dtype, device) for _ in range(config.n_layer)]
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
        """Position ids of the next T tokens: (T,), or (batch, T) when rows are padded
        (padding positions get id 0; no real query looks at them)."""
        device = self.keys[0].device
        pos = torch.arange(self.length, self.length + T, device=device)
        if self.pad is None:
            return pos
        return (pos - self.pad[:, None]).clamp(min=0)

    def attention_mask(self, T: int) -> Tensor | None:
        """Which keys each of the next T queries may attend to (see _allowed), or None
        when plain causal attention is already exact: an empty cache (T == S) or a
        single query, both without padding."""
        if self.pad is None and (self.length == 0 or T == 1):
            return None
        query_pos = torch.arange(self.length, self.length + T, device=self.keys[0].device)
        return _allowed(query_pos, self.length + T, self.pad)

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store a layer's keys and values for the next T positions, k, v: (B, n_kv_head, T, hd),
        B being the cache's batch or, in a prefill shared by several rows, its first B rows.
        Returns that layer's keys and values for all positions so far: (B, n_kv_head, length + T, hd)."""
        B, end = k.size(0), self._check_room(k.size(2))
        self.keys[layer][:B, :, self.length : end] = k
        self.values[layer][:B, :, self.length : end] = v
        return self.keys[layer][:B, :, :end], self.values[layer][:B, :, :end]

    def _check_room(self, T: int) -> int:
        """Where T more positions would end; ValueError past max_len."""
        end = self.length + T
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; {end} were asked for")
        return end

    def spread(self, source_rows: Tensor, pad: Tensor) -> None:
        """Give every row b the filled positions of row source_rows[b] and pad[b] padding
        positions (both (batch,)): one prefill serves all the rows that share a prompt."""
        for buffer in self.keys + self.values:
            buffer[:, :, : self.length] = buffer[source_rows, :, : self.length]  # indexing copies first
        self.pad = pad if bool(pad.any()) else None

    def advance(self, T: int) -> None:
        """Count the T positions every layer has just stored."""
        self.length += T


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """A decode step streams the whole cache, so on a CPU it lives in huge pages."""
    if device.type == "cpu":
        return huge_page_zeros(shape, dtype)
    return torch.zeros(shape, dtype=dtype, device=device)


def _allowed(query_pos: Tensor, S: int, pad: Tensor | None) -> Tensor:
    """Which of S key positions each query, at query_pos (T,), may attend to: a boolean
    mask (1 or B, 1, T, S), causal and aligned bottom-right, hiding each row's pad[b]
    leading padding positions. A padding query may see itself, so no softmax row is
    empty (which gives NaN)."""
    query_pos = query_pos[:, None]  # (T, 1)
    key_pos = torch.arange(S, device=query_pos.device)  # (S,)
    allowed = key_pos <= query_pos  # (T, S)
    if pad is None:
        return allowed[None, None]
    real_key = key_pos >= pad[:, None, None]  # (B, 1, S)
    return (allowed & (real_key | (key_pos == query_pos)))[:, None]  # (B, 1, T, S)


class StaticKVCache(KVCache):
    """A KVCache whose decode steps all have the same shapes and read how far the cache
    is filled from a device tensor, not from Python: the step a CUDA graph can capture
    once and replay (see cuda_graph.py). Every query attends over all max_len positions
    through a mask that hides the unfilled ones, so a step costs a full-length attention.
    """

    def __init__(self, config: GPTConfig, batch_size: int, max_len: int | None = None, **placement) -> None:
        """As KVCache; placement: its device= and dtype=."""
        super().__init__(config, batch_size, max_len, **placement)
        device = self.keys[0].device
        self.filled = torch.zeros((), dtype=torch.long, device=device)  # `length` on the device
        self.pad_rows = torch.zeros(batch_size, dtype=torch.long, device=device)  # `pad`, always a tensor
        self.rows = batch_size  # rows in use: fewer during a prefill shared by several rows

    def reset(self, pad: Tensor | None = None) -> None:
        super().reset(pad)
        pad = pad if pad is not None else torch.zeros_like(self.pad_rows)
        self.rows = pad.numel()
        # In place: a captured step keeps reading these very tensors.
        self.filled.zero_()
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
        """Store k, v (rows, n_kv_head, T, hd) at the next T positions; returns the whole
        buffers (rows, n_kv_head, max_len, hd), which the mask limits to what is filled."""
        self._check_room(k.size(2))
        where = self._query_positions(k.size(2))
        keys, values = self.keys[layer][: self.rows], self.values[layer][: self.rows]
        keys.index_copy_(2, where, k)
        values.index_copy_(2, where, v)
        return keys, values

    def advance(self, T: int) -> None:
        self.length += T
        self.filled += T


# Generation
# Decides from a row's generated tokens (the newest last) whether the row is done.
StopCheck = Callable[[list[int]], bool]
# eager: a KVCache sized to what is filled; graph: a StaticKVCache and the decode step
# replayed as a CUDA graph; static: the same step run as plain calls (what the graph
# captures, checkable on any device).
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
    """Generate continuations of prompts (lists of token ids) as one batch, yielding
    after every step {row: new token} for the rows still generating.

    A row ends when it samples one of stop_tokens (such as <|endoftext|>, which is not
    yielded), when stop(its generated tokens) is true (the token that made it true is
    yielded; sample.py maps stop strings to this), or after max_new_tokens. Only ids
    below vocab_size are sampled: pass the tokenizer's when the model's vocabulary is
    padded (the padding rows are never trained). decode is one of DECODE_MODES. Rows
    with the same prompt share one prefill. Put the model in eval mode first.
    """
    _check_request(model, prompts, max_new_tokens, decode)
    weight = model.transformer.ln_f.weight  # in the activations' dtype, whatever the weight format
    # Room for the tokens grows as they come, not all up front: max_new_tokens may be huge.
    room = min(max_new_tokens, model.config.block_size)
    history, pad = _left_pad(prompts, room, weight.device)  # (B, n + room), (B,)
    n = history.size(1) - room  # columns filled so far, padding included
    end = n + max_new_tokens  # the column after a row's last possible token
    max_len = min(end, model.config.block_size)
    cache_type = KVCache if decode == "eager" else StaticKVCache
    cache = cache_type(model.config, len(prompts), max_len, device=weight.device, dtype=weight.dtype)
    step = GraphedDecodeStep(model, cache) if decode == "graph" else partial(_decode_step, model, cache)
    generator = sampling.generator(weight.device)
    rows = _Rows(len(prompts), stop_tokens, stop)
    logits = _prefill(model, cache, history[:, :n], pad)
    while True:
        tokens = sample_next(logits[:, :vocab_size], sampling, generator)  # (B,)
        if n == history.size(1):  # (B, n) -> (B, up to 2n)
            history = torch.cat([history, torch.zeros_like(history[:, : end - n])], dim=1)
        history[:, n] = tokens
        n += 1
        new = rows.accept(tokens.tolist())
        if new:
            yield new
        if n == end or all(rows.ended):
            return
        if cache.length == cache.max_len:  # past block_size: slide the window
            logits = _prefill(model, cache, history[:, :n], pad)
        else:
            logits = step(tokens)


def generate(
    model: GPT,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    sampling: Sampling = Sampling(),
    *,
    stop_tokens: Collection[int] = (),
    stop: StopCheck | None = None,
    vocab_size: int | None = None,
    decode: str = "eager",
) -> list[list[int]]:
    """The generated tokens of every prompt: everything stream() yields, per row."""
    outputs: list[list[int]] = [[] for _ in prompts]
    steps = stream(model, prompts, max_new_tokens, sampling,
                   stop_tokens=stop_tokens, stop=stop, vocab_size=vocab_size, decode=decode)
    for new in steps:
        for row, token in new.items():
            outputs[row].append(token)
    return outputs


class _Rows:
    """Each row's generated tokens and whether it has ended."""

    def __init__(self, batch_size: int, stop_tokens: Collection[int], stop: StopCheck | None) -> None:
        self.generated: list[list[int]] = [[] for _ in range(batch_size)]
        self.ended = [False] * batch_size
        self.stop_tokens = stop_tokens
        self.stop = stop

    def accept(self, tokens: list[int]) -> dict[int, int]:
        """Take one sampled token per row; returns {row: token} for the rows it extends."""
        new = {}
        for row, token in enumerate(tokens):
            if self.ended[row]:
                continue
            if token in self.stop_tokens:
                self.ended[row] = True
                continue
            self.generated[row].append(token)
            new[row] = token
            self.ended[row] = self.stop is not None and self.stop(self.generated[row])
        return new


def _check_request(model: GPT, prompts: Sequence[Sequence[int]], max_new_tokens: int, decode: str) -> None:
    if decode not in DECODE_MODES:
        raise ValueError(f"decode must be one of {DECODE_MODES}, got {decode!r}")
    assert max_new_tokens >= 1, max_new_tokens
    if not prompts or any(len(prompt) == 0 for prompt in prompts):
        raise ValueError("every prompt needs at least one token (start from <|endoftext|>)")
    vocab_size = model.config.vocab_size
    outside = sorted({t for prompt in prompts for t in prompt if not 0 <= t < vocab_size})
    if outside:
        raise ValueError(f"token ids {outside[:5]} are outside the model's vocabulary [0, {vocab_size})")


def _left_pad(
    prompts: Sequence[Sequence[int]], extra_columns: int, device: torch.device
) -> tuple[Tensor, Tensor]:
    """The prompts right-aligned in a (B, longest + extra_columns) tensor with room for
    extra_columns more tokens, and how many padding columns each row starts with: (B,)."""
    longest = max(len(prompt) for prompt in prompts)
    history = torch.zeros(len(prompts), longest + extra_columns, dtype=torch.long, device=device)
    for row, prompt in enumerate(prompts):
        history[row, longest - len(prompt) : longest] = torch.tensor(prompt, dtype=torch.long)
    pad = torch.tensor([longest - len(prompt) for prompt in prompts], device=device)
    return history, pad


def _prefill(model: GPT, cache: KVCache, tokens: Tensor, pad: Tensor) -> Tensor:
    """Refill the cache with the last block_size columns of tokens (B, n), whose row b
    begins with pad[b] padding columns, running each distinct row once (the samples of
    one prompt share its prefill). Returns the next-token logits (B, vocab)."""
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


def _decode_step(model: GPT, cache: KVCache, tokens: Tensor) -> Tensor:
    """Next-token logits (B, vocab) after appending tokens (B,) to the cached sequences."""
    return model(tokens[:, None], kv_cache=cache, last_only=True)[0][:, -1]
