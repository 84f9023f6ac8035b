"""Learning-rate schedule: linear warmup, then cosine decay to a floor."""

from __future__ import annotations

import math


def learning_rate(step: int, *, max_lr: float, min_lr: float, warmup_iters: int, decay_iters: int) -> float:
    """The learning rate for optimizer step `step` (0-based).

    Rises linearly over warmup_iters steps to reach max_lr at step warmup_iters - 1,
    follows half a cosine from max_lr down to min_lr at step decay_iters, and stays
    at min_lr after that.
    """
    if step < warmup_iters:
        return max_lr * (step + 1) / warmup_iters
    if step >= decay_iters:
        return min_lr
    progress = (step - warmup_iters) / max(decay_iters - warmup_iters, 1)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)


def schedule_warnings(*, max_iters: int, warmup_iters: int, decay_iters: int) -> list[str]:
    """What about a schedule is legal but probably not meant."""
    if max_iters < warmup_iters:
        return [f"max_iters ({max_iters}) ends inside the warmup (optim.warmup_iters={warmup_iters}): the "
                "learning rate never reaches its peak and never decays; lower optim.warmup_iters"]
    if max_iters < decay_iters:
        return [f"max_iters ({max_iters}) ends before the decay does (optim.decay_iters={decay_iters}): the "
                "run stops above optim.min_lr"]
    return []
