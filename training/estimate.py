"""What a run will cost, said before it has spent much: its tokens against the prepared data and,
from a rate train.py measures, its training time and price. Pure arithmetic and formatting."""

from __future__ import annotations

import math
from dataclasses import dataclass

WARMUP_STEPS = 10
"""Optimizer steps left out of a measured rate: the first compiles the model (compile=true) and the first
few settle the CUDA allocator and the kernels' autotuning."""


@dataclass(frozen=True)
class Estimate:
    seconds: float  # training steps only: evaluations and checkpoints come on top
    gpu_hours: float  # seconds / 3600 x processes (one GPU each)
    cost: float | None  # gpu_hours x the price of a GPU-hour; None without a price


def estimate(steps: int, tokens_per_step: int, tok_per_s: float, world_size: int, gpu_hour: float | None) -> Estimate:
    """`steps` optimizer steps of `tokens_per_step` tokens at `tok_per_s` (all processes together)."""
    seconds = steps * tokens_per_step / tok_per_s
    gpu_hours = seconds / 3600 * world_size
    return Estimate(seconds, gpu_hours, None if gpu_hour is None else gpu_hours * gpu_hour)


def estimate_steps(micro_batches: int, accum: int) -> tuple[range, range]:
    """estimate=true's untimed and timed optimizer steps: WARMUP_STEPS and `micro_batches` micro-batches'
    worth, in whole steps of `accum` (16 micro-batches settle as fast as 16 steps of one)."""
    warmup = math.ceil(WARMUP_STEPS / accum)
    return range(warmup), range(warmup, warmup + math.ceil(micro_batches / accum))


def tokens_line(max_iters: int, tokens_per_step: int, train_tokens: int | None) -> str:
    """The run's tokens, the prepared train split's, and how many passes over it they make
    (batches are random windows: a pass is that many tokens drawn, not each token once)."""
    total = max_iters * tokens_per_step
    split = (
        "train split not prepared yet"
        if train_tokens is None
        else f"prepared train split: {train_tokens:,} ({rounded(train_tokens)}) | {total / train_tokens:.2f} epochs"
    )
    return f"tokens: {max_iters:,} steps x {tokens_per_step:,} = {total:,} ({rounded(total)}) | {split}"


def gib(count: int) -> str:
    return f"{count / 2**30:.1f} GiB"


def peak_line(peak: int, capacity: int) -> str:
    """The device memory the timed steps peaked at, per GPU."""
    return f"peak memory: {gib(peak)} per GPU of the {gib(capacity)} this process may use ({peak / capacity:.0%})"


def rounded(count: int) -> str:
    """9,999,745,024 as '10.00B', 4,844,571 as '4.84M', 1,536 as '1.5k'."""
    for scale, unit in ((1e9, "B"), (1e6, "M")):
        if count >= scale:
            return f"{count / scale:.2f}{unit}"
    return f"{count / 1e3:.1f}k"


def estimate_line(
    tok_per_s: float, measured: tuple[int, int], steps_to_go: int, tokens_per_step: int, world_size: int, gpu_hour
) -> str:
    """One line: the measured rate (over optimizer steps measured[0]..measured[1]), the
    time the steps to go take at that rate and, with a price, what they cost."""
    e = estimate(steps_to_go, tokens_per_step, tok_per_s, world_size, gpu_hour)
    cost = (
        "cost.gpu_hour=<price> adds the cost"
        if e.cost is None
        else f"cost {e.cost:,.2f} ({e.gpu_hours:,.1f} GPU-hours x {gpu_hour:g}, {world_size} GPU(s))"
    )
    return (
        f"estimate: {tok_per_s:,.0f} tokens/s (steps {measured[0]}-{measured[1]}) | {steps_to_go:,} steps to "
        f"max_iters: {duration(e.seconds)} of training, evaluations not included | {cost}"
    )


def duration(seconds: float) -> str:
    """'2 d 3 h', '5 h 07 min', '4 min 09 s' or '12 s': the two largest units."""
    whole = round(seconds)
    days, hours, minutes, secs = whole // 86400, whole // 3600 % 24, whole // 60 % 60, whole % 60
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"
