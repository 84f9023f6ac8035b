"""One optimizer step, decided on the device.

A step never waits for the GPU: the loss, the gradient norm and the "skip this
update" decision stay device tensors, and the host reads them only when the loop
asks (TrainWindow.read, at log, evaluation and checkpoint boundaries). A step whose
loss or gradients are not finite applies no update at all: the fused AdamW kernel
takes the flag as its `found_inf` (as GradScaler passes it), leaving weights,
moments and step count untouched, and the gradients are cleared as after any step.

Under DDP a step runs one small all-reduce besides the gradients' own: the loss,
the non-finite flag and the stop request of every rank, fused into one tensor, so
that all ranks skip, stop and log alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from data import BatchLoader
from training.distributed import Distributed, all_reduce_sum, gradient_sync
from training.runtime import Precision


class Prefetcher:
    """The loader's batches, each fetched one micro-step ahead: slicing, pinning and
    the non-blocking host-to-device copy of the next batch overlap this one's compute.
    Batches are a pure function of (step, micro_step), so prefetching changes nothing
    a resumed run would see."""

    def __init__(self, loader: BatchLoader) -> None:
        self.loader = loader
        self._ahead: tuple[tuple[int, int], tuple[Tensor, Tensor]] | None = None

    def get(self, step: int, micro_step: int) -> tuple[Tensor, Tensor]:
        if self._ahead is not None and self._ahead[0] == (step, micro_step):
            batch = self._ahead[1]
        else:
            batch = self.loader.get_batch(step, micro_step)
        self._ahead = None
        return batch

    def fetch_after(self, step: int, micro_step: int) -> None:
        """Start fetching the micro-batch that follows (step, micro_step)."""
        following = (step, micro_step + 1) if micro_step + 1 < self.loader.accum_steps else (step + 1, 0)
        self._ahead = (following, self.loader.get_batch(*following))


@dataclass
class StepResult:
    """What a step did, as 0-d device tensors (reading one to the host waits for the step)."""

    loss: Tensor  # mean over micro-batches and ranks; NaN or inf when not finite
    grad_norm: Tensor  # global norm of the true (unscaled) gradients, before clipping
    skipped: Tensor  # bool: no update was applied
    nonfinite: Tensor  # bool: the loss, or the gradients outside fp16's loss scaling, were not finite
    stop: Tensor  # bool: some rank asked to stop


class TrainStep:
    """Forward and backward over accum_steps micro-batches, then unscale, clip and
    update, or skip the update where the step is not finite."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler,
        *,
        precision: Precision,
        accum_steps: int,
        grad_clip: float,
        group: Distributed,
    ) -> None:
        self.model, self.optimizer, self.scaler = model, optimizer, scaler
        self.precision, self.accum_steps, self.grad_clip, self.group = precision, accum_steps, grad_clip, group
        self.parameters = [p for p in model.parameters() if p.requires_grad]

    def __call__(self, batches: Prefetcher, step: int, stop_requested: bool = False) -> StepResult:
        loss_sum = None
        for micro in range(self.accum_steps):
            x, y = batches.get(step, micro)
            with gradient_sync(self.model, sync=micro == self.accum_steps - 1):
                with self.precision.autocast():
                    _, loss = self.model(x, y)
                batches.fetch_after(step, micro)
                self.scaler.scale(loss / self.accum_steps).backward()
            loss_sum = loss.detach().float() if loss_sum is None else loss_sum + loss.detach().float()
        loss, loss_bad, stop = self._agree(loss_sum / self.accum_steps, stop_requested)

        self.scaler.unscale_(self.optimizer)  # true gradients for the norm and the clip (no-op unless fp16)
        grads = [p.grad for p in self.parameters if p.grad is not None]
        grad_norm = torch.nn.utils.get_total_norm(grads)
        if self.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(self.parameters, self.grad_clip, grad_norm)
        grads_bad = ~torch.isfinite(grad_norm)  # the same on every rank: DDP averaged the gradients
        skipped = loss_bad | grads_bad
        self._update_unless(skipped)
        self.scaler.update()  # fp16: lower the scale after an overflow, raise it after a quiet stretch
        self.optimizer.zero_grad(set_to_none=True)
        # Under fp16, overflowing gradients are the loss scale's business (skipped, scale
        # lowered), not a fault of the run; a non-finite loss always is.
        nonfinite = loss_bad | (grads_bad & (not self.scaler.is_enabled()))
        return StepResult(loss=loss, grad_norm=grad_norm, skipped=skipped, nonfinite=nonfinite, stop=stop)

    def _agree(self, local_loss: Tensor, stop_requested: bool) -> tuple[Tensor, Tensor, Tensor]:
        """(mean loss, any rank's loss not finite, any rank asked to stop): one all-reduce."""
        device = local_loss.device
        flags = torch.stack([
            local_loss,
            (~torch.isfinite(local_loss)).float(),
            torch.full((), float(stop_requested), device=device),  # a fill kernel, not a host copy
        ])
        flags = all_reduce_sum(self.group, flags)
        return flags[0] / self.group.world_size, flags[1] > 0, flags[2] > 0

    def _update_unless(self, skip: Tensor) -> None:
        if not self.optimizer.defaults.get("fused"):
            # Other optimizers (the benchmark's reference on a CPU) have no device-side
            # skip: the host reads the flag, one sync per step.
            if not skip.item():
                self.optimizer.step()
            return
        # found_inf is the fused kernels' own "leave everything as it was" flag.
        self.optimizer.grad_scale, self.optimizer.found_inf = None, skip.float()
        try:
            self.optimizer.step()
        finally:
            del self.optimizer.grad_scale, self.optimizer.found_inf


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
        self.sums += torch.stack([
            torch.where(counted, result.loss.double(), 0.0), counted.double(), result.skipped.double(),
            result.nonfinite.double(), result.stop.double(),
        ])
        step_number = torch.full((), step, dtype=torch.float64, device=self.device)  # a fill kernel
        self.first_nonfinite = torch.minimum(
            self.first_nonfinite, torch.where(result.nonfinite, step_number, float("inf"))
        )
        self.grad_norm = result.grad_norm.double()
        self.steps += 1

    def read(self) -> WindowSummary:
        """One host read (it waits for the steps to finish), then a fresh window."""
        loss_sum, counted, skipped, nonfinite, stop, first, grad_norm = torch.cat(
            [self.sums, self.first_nonfinite.view(1), self.grad_norm.view(1)]
        ).tolist()
        summary = WindowSummary(
            steps=self.steps, loss=loss_sum / counted if counted else None, grad_norm=grad_norm,
            skipped=int(skipped), nonfinite=int(nonfinite),
            first_nonfinite_step=int(first) if nonfinite else None, stop=stop > 0,
        )
        self.reset()
        return summary
