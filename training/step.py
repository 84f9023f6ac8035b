"""train.py's optimizer step (`train_step` on a `Trainer`) and what it uses besides the model: the
learning rate, the next batch, and the device-side bookkeeping that keeps the host from waiting: the
loss, the gradient norm and the "skip this update" flag stay device tensors until a boundary
(TrainWindow.read). A non-finite step applies no update: fused AdamW takes the flag as its `found_inf`
(as GradScaler passes it); with Muon the host reads it. Under DDP one small all-reduce of every rank's
loss, non-finite flag and stop request makes all ranks skip, stop and log alike.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor, nn

from conf import Config
from data import BatchLoader
from run.distributed import Ranks
from system import UserError
from training.logger import RunLogger
from training.mfu import slow_cpu_precision


def learning_rate(
    step: int, *, max_lr: float, min_lr: float, warmup_iters: int, decay_iters: int, cooldown_frac: float | None = None
) -> float:
    """The learning rate for optimizer step `step` (0-based): a linear warmup reaching max_lr at step
    warmup_iters - 1, then a decay to min_lr at step decay_iters, held after. cooldown_frac=None: the
    decay is half a cosine (nanoGPT's); a fraction: warmup-stable-decay, max_lr held until the last
    cooldown_frac of decay_iters, then a straight line down (the speedrun's, nanochat's)."""
    if step < warmup_iters:
        return max_lr * (step + 1) / warmup_iters
    if step >= decay_iters:
        return min_lr
    if cooldown_frac is not None:
        start = max(decay_iters - round(cooldown_frac * decay_iters), warmup_iters)  # never inside the warmup
        return max_lr - max(step - start, 0) / max(decay_iters - start, 1) * (max_lr - min_lr)
    progress = (step - warmup_iters) / max(decay_iters - warmup_iters, 1)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)


def schedule_warnings(max_iters: int, warmup_iters: int, decay_iters: int) -> list[str]:
    """What about a learning-rate schedule is legal but probably not meant."""
    if max_iters < warmup_iters:
        return [
            f"max_iters ({max_iters}) ends inside the warmup (optim.warmup_iters={warmup_iters}): the "
            "learning rate never reaches its peak and never decays; lower optim.warmup_iters"
        ]
    if max_iters < decay_iters:
        return [
            f"max_iters ({max_iters}) ends before the decay does (optim.decay_iters={decay_iters}): the "
            "run stops above optim.min_lr"
        ]
    return []


def run_warnings(config: Config, device: torch.device, precision: str) -> list[str]:
    """Settings that are legal but probably not meant, or slow where they run."""
    max_iters, optim = config.max_iters, config.optim
    warnings = schedule_warnings(max_iters, optim.warmup_iters, optim.decay_iters or max_iters)
    slow = slow_cpu_precision(precision) if device.type == "cpu" else None
    return warnings + ([slow] if slow else [])


class Prefetcher:
    """The loader's batches, each fetched one micro-step ahead (its slicing, pinning and copy to the
    device overlap this one's compute); batches are a pure function of (step, micro_step)."""

    def __init__(self, loader: BatchLoader) -> None:
        self.loader = loader
        self._ahead: tuple[tuple[int, int], tuple[Tensor, Tensor]] | None = None

    def get(self, step: int, micro_step: int) -> tuple[Tensor, Tensor]:
        ahead, self._ahead = self._ahead, None
        return ahead[1] if ahead and ahead[0] == (step, micro_step) else self.loader.get_batch(step, micro_step)

    def fetch_after(self, step: int, micro_step: int) -> None:
        """Start fetching the micro-batch that follows (step, micro_step)."""
        following = (step, micro_step + 1) if micro_step + 1 < self.loader.accum_steps else (step + 1, 0)
        self._ahead = (following, self.loader.get_batch(*following))


class RandomBatches:
    """A Prefetcher's stand-in where a step's time and memory are wanted, not its learning (estimate=true,
    batch_size=auto's trial): one micro-batch of random tokens, drawn on the device by a generator of its
    own (the run's random streams untouched), for every micro-step."""

    def __init__(self, vocab_size: int, batch_size: int, block_size: int, device: torch.device) -> None:
        generator = torch.Generator(device=device).manual_seed(0)
        tokens = torch.randint(vocab_size, (batch_size, block_size + 1), device=device, generator=generator)
        self.batch = (tokens[:, :-1], tokens[:, 1:])

    def get(self, step: int, micro_step: int) -> tuple[Tensor, Tensor]:
        return self.batch

    def fetch_after(self, step: int, micro_step: int) -> None:
        pass


@dataclass
class StepResult:
    """What a step did, as 0-d device tensors (reading one to the host waits for the step)."""

    loss: Tensor  # mean over micro-batches and ranks; NaN or inf when not finite
    grad_norm: Tensor  # global norm of the true (unscaled) gradients, before clipping
    skipped: Tensor  # bool: no update was applied
    nonfinite: Tensor  # bool: the loss, or the gradients outside fp16's loss scaling, were not finite
    stop: Tensor  # bool: some rank asked to stop


def agree_across_ranks(ranks: Ranks, local_loss: Tensor, stop_requested: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(mean loss, any rank's loss not finite, any rank asked to stop): one all-reduce, queued on the device."""
    stop = torch.full((), float(stop_requested), device=local_loss.device)  # a fill kernel, not a host copy
    flags = torch.stack([local_loss, (~torch.isfinite(local_loss)).float(), stop])
    if ranks.world_size > 1:
        dist.all_reduce(flags)
    return flags[0] / ranks.world_size, flags[1] > 0, flags[2] > 0


def update_unless_skipped(optimizer: torch.optim.Optimizer, skip: Tensor) -> None:
    """optimizer.step(), unless `skip` (a device bool): then weights, moments and step counts stay."""
    if not optimizer.defaults.get("fused"):  # no device-side skip (Muon): the host reads the flag
        if not skip.item():
            optimizer.step()
        return
    # found_inf is the fused kernels' own "leave everything as it was" flag.
    optimizer.grad_scale, optimizer.found_inf = None, skip.float()
    try:
        optimizer.step()
    finally:
        del optimizer.grad_scale, optimizer.found_inf


@dataclass
class Trainer:
    """What an optimizer step works with."""

    model: torch.nn.Module  # the model that trains: compiled and wrapped in DDP when asked
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler  # scales fp16 losses (disabled otherwise)
    autocast: contextlib.AbstractContextManager  # the forward's precision
    accum_steps: int
    grad_clip: float  # 0: no clipping
    ranks: Ranks  # DDP: the loss, non-finite flag and stop are all-reduced across them

    def __post_init__(self) -> None:
        self.parameters = [p for p in self.model.parameters() if p.requires_grad]


def train_step(t: Trainer, batches: Prefetcher | RandomBatches, step: int, stop_requested: bool = False) -> StepResult:
    """One optimizer step: forward and backward over accum_steps micro-batches, unscale, measure and clip
    the gradients, update (nothing when the loss or gradients are not finite). The host waits for nothing."""
    loss_sum, ddp = 0.0, isinstance(t.model, nn.parallel.DistributedDataParallel)
    for micro in range(t.accum_steps):
        x, y = batches.get(step, micro)
        # DDP all-reduces (averages) the accumulated gradients on the last backward only.
        with t.model.no_sync() if ddp and micro < t.accum_steps - 1 else contextlib.nullcontext():
            with t.autocast:
                loss = t.model(x, y)[1]  # the logits (batch x context x vocabulary) are freed here, not kept
            batches.fetch_after(step, micro)  # the next batch's copy overlaps this backward
            t.scaler.scale(loss / t.accum_steps).backward()  # the gradients add up
        loss_sum = loss_sum + loss.detach().float()
    loss, loss_bad, stop = agree_across_ranks(t.ranks, loss_sum / t.accum_steps, stop_requested)

    t.scaler.unscale_(t.optimizer)  # true gradients for the norm and the clip (no-op unless fp16)
    grad_norm = torch.nn.utils.get_total_norm([p.grad for p in t.parameters if p.grad is not None])
    if t.grad_clip > 0:
        torch.nn.utils.clip_grads_with_norm_(t.parameters, t.grad_clip, grad_norm)
    grads_bad = ~torch.isfinite(grad_norm)  # the same on every rank: DDP averaged the gradients
    skipped = loss_bad | grads_bad
    update_unless_skipped(t.optimizer, skipped)
    t.scaler.update()  # fp16: lower the scale after an overflow, raise it after a quiet stretch
    t.optimizer.zero_grad(set_to_none=True)
    # Under fp16 overflowing gradients are the loss scale's business, not a fault; a non-finite loss always is.
    nonfinite = loss_bad | (grads_bad & (not t.scaler.is_enabled()))
    return StepResult(loss=loss, grad_norm=grad_norm, skipped=skipped, nonfinite=nonfinite, stop=stop)


@dataclass(frozen=True)
class WindowSummary:
    """The steps since the last read, on the host."""

    steps: int
    loss: float | None  # mean loss of the steps that updated (None if every one was skipped)
    grad_norm: float  # of the last step
    skipped: int  # steps whose update was skipped (non-finite, or an fp16 overflow)
    nonfinite: int
    first_nonfinite_step: int | None
    stop: bool


class TrainWindow:
    """Sums of StepResults kept on the device between two host reads."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.reset()

    def reset(self) -> None:
        # [sum of counted losses, counted steps, skipped steps, non-finite steps, stop requests]
        self.sums = torch.zeros(5, dtype=torch.float64, device=self.device)
        self.first_nonfinite = torch.full((), float("inf"), dtype=torch.float64, device=self.device)
        self.grad_norm = torch.zeros((), dtype=torch.float64, device=self.device)
        self.steps = 0

    def add(self, step: int, result: StepResult) -> None:
        """Record step number `step` (1-based: the step just completed)."""
        counted = ~result.skipped
        flags = (counted, result.skipped, result.nonfinite, result.stop)
        self.sums += torch.stack([torch.where(counted, result.loss.double(), 0.0), *(f.double() for f in flags)])
        step_number = torch.full((), step, dtype=torch.float64, device=self.device)  # a fill kernel
        first = torch.where(result.nonfinite, step_number, float("inf"))
        self.first_nonfinite = torch.minimum(self.first_nonfinite, first)
        self.grad_norm = result.grad_norm.double()
        self.steps += 1

    def read(self) -> WindowSummary:
        """One host read (it waits for the steps to finish), then a fresh window."""
        loss_sum, counted, skipped, nonfinite, stop, first, grad_norm = torch.cat(
            [self.sums, self.first_nonfinite.view(1), self.grad_norm.view(1)]
        ).tolist()
        loss, first = loss_sum / counted if counted else None, int(first) if nonfinite else None
        summary = WindowSummary(
            self.steps,
            loss,
            grad_norm,
            skipped=int(skipped),
            nonfinite=int(nonfinite),
            first_nonfinite_step=first,
            stop=stop > 0,
        )
        self.reset()
        return summary


class NonFiniteLoss(UserError):
    """on_nonfinite=stop, and a step's loss or gradients were not finite."""


def check_finite(
    summary: WindowSummary, policy: str, checkpoint: Path | None, logger: RunLogger, optimizer: str = "adamw"
) -> None:
    """Non-finite steps applied no update; `stop` ends the run here, at the first boundary after them,
    before anything is saved. `optimizer` (optim.name) says which learning rates the advice names."""
    if not summary.nonfinite:
        return
    if policy == "stop":
        rates = "optim.learning_rate"
        if optimizer == "muon":
            rates = "optim.muon_lr (Muon's, the blocks' matrices) or optim.learning_rate (AdamW's, the rest)"
        raise NonFiniteLoss(
            f"the loss or the gradients became non-finite at step {summary.first_nonfinite_step}; no update "
            f"was applied, and the last good checkpoint ({checkpoint or 'none yet'}) is untouched. Lower "
            f"{rates}, or set on_nonfinite=skip to skip such steps"
        )
    logger.print(
        f"{summary.nonfinite} non-finite step(s) since step {summary.first_nonfinite_step}: "
        "updates skipped (on_nonfinite=skip)"
    )
