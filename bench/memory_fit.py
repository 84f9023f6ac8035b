"""What micro-batch of the gpt2 preset fits a GPU: the model's own arithmetic, and the same
measured by the run's own step (training/microbatch.py's Trial, what batch_size=auto runs).

    python bench/memory_fit.py          # the arithmetic's table (docs/training.md#memory)
    python bench/gpu_check.py --out DIR --stages memory    # measured on a GPU beside it

The arithmetic, in bytes, for P parameters, width d, L layers, padded vocabulary V and
N = micro-batch x block_size tokens, under bf16 autocast with fp32 weights:
- static: fp32 weights 4P, gradients 4P, AdamW's two moments 8P, and autocast's bf16
  copies of the weights 2P; under DDP its gradient buckets add 4P.
- per token and layer, eager, 38d: layer norms' fp32 inputs 2 x 4d; the bf16 inputs the
  four matmuls keep for their weight gradients (2d + 2d + 2d + 8d); q, k, v 6d and the
  attention's output 2d (flash attention keeps no T x T matrix); GELU's input 8d. The
  CPU's bf16 autocast measures 36d (tests/test_memory_fit.py).
- compiled, 28d: Inductor recomputes layer norms and GELU in the backward from the
  tensors it keeps, saving their inputs' fp32 copies and GELU's output (an estimate).
- the loss per token: eager 12V (the fp32 log-softmax kept, 4V, and 8V more while its
  backward runs); compiled 6V (bf16 logits kept, the fused backward's gradient).
A micro-batch fits when static + N x per token stays below training/microbatch.py's
MARGIN of the card. These are estimates until a GPU measures them (the memory stage).
"""

from __future__ import annotations

import contextlib
import math
import sys
import weakref
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

from conf import OptimConfig, model_preset  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from run.runtime import resolve_precision  # noqa: E402
from training.microbatch import MARGIN, Trial, device_memory  # noqa: E402

CARDS_GIB = (24, 40, 80)
SEQUENCES = 512  # gpt2_fineweb's per step on one GPU: its micro-batches are the powers of two up to it
LAYER_D = {False: 38, True: 28}  # bytes per token and layer, in units of the width; by compile
LOSS_V = {False: 12, True: 6}  # bytes per token of the loss, in units of the vocabulary; by compile


def preset_config(name: str = "gpt2", vocab_size: int = 50304) -> GPTConfig:
    """A model preset at a padded vocabulary (GPT-2's 50,257 ids padded to 64s, as train.py does)."""
    return replace(model_preset(name), vocab_size=vocab_size)


def static_bytes(config: GPTConfig, world_size: int = 1) -> int:
    params = GPT.shapes_only(config).num_params()
    return (4 + 4 + 8 + 2 + (4 if world_size > 1 else 0)) * params


def bytes_per_token(config: GPTConfig, compiled: bool) -> int:
    return config.n_layer * LAYER_D[compiled] * config.n_embd + LOSS_V[compiled] * config.vocab_size


def largest_fitting(static: float, per_sequence: float, card: float, sizes) -> int | None:
    """The largest of `sizes` whose static + size x per_sequence stays MARGIN below `card`."""
    return max((s for s in sizes if static + s * per_sequence <= (1 - MARGIN) * card), default=None)


def arithmetic_table(config: GPTConfig) -> list[dict]:
    """Per card and compile: the arithmetic's largest micro-batch and its peak."""
    sizes = [2**i for i in range(int(math.log2(SEQUENCES)) + 1)]
    rows = []
    for compiled in (False, True):
        per_sequence = bytes_per_token(config, compiled) * config.block_size
        for card in CARDS_GIB:
            size = largest_fitting(static_bytes(config), per_sequence, card * 2**30, sizes)
            rows.append(
                {
                    "card_gib": card,
                    "compile": compiled,
                    "micro_batch": size,
                    "peak_gib": round((static_bytes(config) + (size or 0) * per_sequence) / 2**30, 1),
                }
            )
    return rows


class CountedMemory(TorchDispatchMode):
    """A CPU stand-in for CUDA's allocator, with the interface training/microbatch.py measures
    through: the bytes of every storage an operation allocates while watched (not views or
    in-place results, whose storage was there), until freed; an allocation past `limit`
    raises torch.OutOfMemoryError, as CUDA's does."""

    def __init__(self, limit: float = math.inf) -> None:
        super().__init__()
        self.limit, self.live, self.highest, self.counted = limit, 0, 0, set()

    def capacity(self) -> int:
        return int(min(self.limit, 2**62))

    @contextlib.contextmanager
    def watch(self):
        self.highest = self.live
        with self:
            yield

    def peak(self) -> int:
        return self.highest

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(result.alias_info for result in func._schema.returns):
            return out
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self._count(tensor.untyped_storage())
        if self.live > self.limit:
            raise torch.OutOfMemoryError(f"{self.live} bytes are over the limit of {self.limit:.0f}")
        return out

    def _count(self, storage: torch.UntypedStorage) -> None:
        key = storage.data_ptr()
        if key in self.counted or storage.nbytes() == 0:
            return
        self.counted.add(key)
        self.live += storage.nbytes()
        self.highest = max(self.highest, self.live)
        weakref.finalize(storage, self._free, key, storage.nbytes())

    def _free(self, key: int, nbytes: int) -> None:
        self.counted.discard(key)
        self.live -= nbytes


def measure(
    device: torch.device, config: GPTConfig, sizes: tuple[int, int], precision: str, compiles: tuple[bool, ...]
) -> dict:
    """The step's peak at two micro-batches, eager and compiled, and the line through them
    (static + size x per sequence) judged on each card beside the arithmetic's."""
    memory = device_memory(device) or CountedMemory()
    rows, fits = [], []
    for compiled in compiles:
        torch.manual_seed(0)
        model = GPT(config).to(device)
        trial = Trial(
            model,
            torch.compile(model) if compiled else model,
            OptimConfig(),
            resolve_precision(precision, device),
            device,
            config.vocab_size,
            config.block_size,
        )
        peaks = {size: trial.peak(size, 2, memory) for size in sizes}
        for size, peak in peaks.items():
            arithmetic = static_bytes(config) + size * bytes_per_token(config, compiled) * config.block_size
            rows.append({"compile": compiled, "micro_batch": size, "peak_bytes": peak, "arithmetic_bytes": arithmetic})
        if None in peaks.values():
            continue
        small, large = sizes
        per_sequence = (peaks[large] - peaks[small]) / (large - small)
        static = peaks[small] - small * per_sequence
        powers = [2**i for i in range(int(math.log2(SEQUENCES)) + 1)]
        fits += [
            {
                "compile": compiled,
                "card_gib": card,
                "measured": largest_fitting(static, per_sequence, card * 2**30, powers),
            }
            for card in CARDS_GIB
        ]
        del model, trial
    return {"rows": rows, "fits": fits, "arithmetic": arithmetic_table(config)}


def main() -> None:
    config = preset_config()
    print(
        f"gpt2 preset, context {config.block_size}, bf16 autocast, AdamW, one GPU "
        f"(the arithmetic: bench/memory_fit.py's docstring); static {static_bytes(config) / 2**30:.2f} GiB"
    )
    print("| card | eager: micro-batch (peak) | compile=true: micro-batch (peak) |\n|---|---|---|")
    rows = arithmetic_table(config)
    for card in CARDS_GIB:
        cells = [f"{r['micro_batch']} ({r['peak_gib']} GiB)" for r in rows if r["card_gib"] == card]
        print(f"| {card} GB | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
