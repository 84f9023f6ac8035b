"""The micro-batch a run steps with: batch_size's number, or batch_size=auto's, the largest that fits,
found by running the run's own step (train_step, its precision and compile) on random tokens at the
micro-batches that divide tokens_per_step, bisecting; one fits when it raises no out-of-memory and its
peak stays MARGIN below what the device holds for this process. The trial leaves the run as it was
(throwaway optimizer and scaler; weights, random streams and gradients restored). Under DDP each rank
tries alone, DDP's buckets added to its peak, and all take the smallest choice. On a CPU an allocation
past the RAM swaps instead of raising, so batch_size=auto is refused there by name.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from conf import Config, OptimConfig
from run.distributed import Ranks
from run.runtime import Precision
from system import UserError, describe_out_of_memory
from training.estimate import gib
from training.optim import build_optimizer
from training.step import RandomBatches, Trainer, train_step

MARGIN = 0.10
"""Share of the device's memory a chosen micro-batch leaves free: evaluation, the allocator's
fragmentation over a long run and the CUDA context are not in the trial's peak."""
TRIAL_STEPS = 2  # the second step runs with the optimizer's moments allocated, as every later one


@dataclass(frozen=True)
class Plan:
    """The micro-batches a run may step with, largest first: batch_size's, or every divisor of the sequences."""

    sizes: tuple[int, ...]
    sequences: int  # per optimizer step per process: micro-batch x accumulation
    auto: bool

    def accum(self, size: int) -> int:
        return self.sequences // size


@dataclass(frozen=True)
class MicroBatch:
    size: int  # sequences per micro-batch per process
    accum: int  # micro-batches per optimizer step
    peak: int | None = None  # bytes the trial at `size` peaked at (batch_size=auto only)
    capacity: int | None = None  # bytes the device holds for this process
    tried: dict[int, int | None] = field(default_factory=dict)  # size -> peak bytes; None: out of memory

    def record(self, step: int) -> dict:
        """metrics.jsonl's record of batch_size=auto's choice."""
        record = {"kind": "micro_batch", "step": step, "batch_size": self.size, "accum": self.accum}
        tried = {str(size): peak for size, peak in self.tried.items()}
        return {**record, "peak_bytes": self.peak, "capacity_bytes": self.capacity, "tried": tried}

    def line(self, tokens_per_step: int) -> str:
        """What batch_size=auto chose, and what it measured."""
        tried = ", ".join(
            f"{size}: {'out of memory' if peak is None else gib(peak)}"
            for size, peak in sorted(self.tried.items(), reverse=True)
        )
        peak = "not tried on this rank" if self.peak is None else gib(self.peak)
        return (
            f"batch_size=auto: {self.size} sequences per micro-batch, {self.accum} per step keep tokens_per_step="
            f"{tokens_per_step:,} | peak {peak} of {gib(self.capacity)}, {MARGIN:.0%} kept free | tried {tried}"
        )


def plan_micro_batches(config: Config, block_size: int, world_size: int, device: torch.device) -> Plan:
    """The run's Plan, or a ValueError naming the setting that makes none (checked before any heavy work)."""
    per_micro_sequence = block_size * world_size
    if config.tokens_per_step is None:  # batch_size is a number here (a config rule)
        return Plan((config.batch_size,), config.batch_size * (config.grad_accum_steps or 1), auto=False)
    if config.tokens_per_step % per_micro_sequence:
        raise ValueError(
            f"tokens_per_step ({config.tokens_per_step}) must be a multiple of block_size * "
            f"world_size ({block_size} * {world_size} = {per_micro_sequence})"
        )
    sequences = config.tokens_per_step // per_micro_sequence
    if config.batch_size != "auto":
        if sequences % config.batch_size:
            raise ValueError(
                f"tokens_per_step ({config.tokens_per_step}) must be a multiple of batch_size * block_size * "
                f"world_size ({config.batch_size} * {block_size} * {world_size} = "
                f"{config.batch_size * per_micro_sequence})"
            )
        return Plan((config.batch_size,), sequences, auto=False)
    if device_memory(device) is None:
        raise ValueError(
            f"batch_size=auto searches a GPU's memory, and this run is on {device.type}, whose "
            "allocations past the RAM swap instead of failing: give batch_size a number (e.g. 8)"
        )
    return Plan(tuple(size for size in range(sequences, 0, -1) if sequences % size == 0), sequences, auto=True)


@dataclass
class CudaMemory:
    """CUDA's caching allocator's reserved bytes (what an allocation fails against), peaked within watch()."""

    device: torch.device

    def capacity(self) -> int:
        """This process's reserve plus the device's free memory (another process's share excluded)."""
        free, _ = torch.cuda.mem_get_info(self.device)
        return free + torch.cuda.memory_reserved(self.device)

    @contextlib.contextmanager
    def watch(self) -> Iterator[None]:
        torch.cuda.empty_cache()  # the last trial's cached blocks are not this one's
        torch.cuda.reset_peak_memory_stats(self.device)
        yield

    def peak(self) -> int:
        return torch.cuda.max_memory_reserved(self.device)


def device_memory(device: torch.device) -> CudaMemory | None:
    """What batch_size=auto measures on `device`: CUDA's allocator; None on a CPU."""
    return CudaMemory(device) if device.type == "cuda" else None


def choose_micro_batch(
    plan: Plan,
    model: nn.Module,
    compiled: nn.Module,
    config: Config,
    precision: Precision,
    ranks: Ranks,
    device: torch.device,
    vocab_size: int,
) -> MicroBatch:
    """The micro-batch the run steps with: the plan's one, or batch_size=auto's search on the device."""
    if not plan.auto:
        return MicroBatch(plan.sizes[0], plan.accum(plan.sizes[0]))
    memory = device_memory(device)
    capacity = memory.capacity()
    buckets = sum(p.numel() * p.element_size() for p in model.parameters()) if ranks.enabled else 0  # DDP's
    trial = Trial(model, compiled, config.optim, precision, device, vocab_size, block_size=model.config.block_size)
    tried: dict[int, int | None] = {}

    def fits(size: int) -> bool:
        peak = trial.peak(size, plan.accum(size), memory)
        tried[size] = None if peak is None else peak + buckets
        return peak is not None and peak + buckets <= (1 - MARGIN) * capacity

    with trial.leaving_the_run_as_it_was():
        size = largest_that_fits(plan.sizes, fits)
    size = smallest_across_ranks(ranks, size, device)
    if size is None:
        raise ValueError(
            f"batch_size=auto: not even a micro-batch of 1 fits in {gib(int((1 - MARGIN) * capacity))} "
            f"({1 - MARGIN:.0%} of {gib(capacity)}): lower {smaller_run(config)}"
        )
    return MicroBatch(size, plan.accum(size), tried.get(size), capacity, tried)


def largest_that_fits(sizes: tuple[int, ...], fits: Callable[[int], bool]) -> int | None:
    """The largest of `sizes` (largest first) that fits, by bisection (fitting is monotone); None: none does."""
    fitting, failing = len(sizes), -1  # indices: sizes[fitting] fits, sizes[failing] does not
    while fitting - failing > 1:
        middle = (fitting + failing) // 2
        if fits(sizes[middle]):
            fitting = middle
        else:
            failing = middle
    return sizes[fitting] if fitting < len(sizes) else None


def smallest_across_ranks(ranks: Ranks, size: int | None, device: torch.device) -> int | None:
    """Every rank's choice made one: the smallest (None, nothing fits, below all)."""
    if not ranks.enabled:
        return size
    agreed = torch.tensor(size or 0, device=device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
    return int(agreed.item()) or None


@dataclass
class Trial:
    """The run's step at one micro-batch, on random tokens, with a throwaway optimizer."""

    model: nn.Module
    compiled: nn.Module
    optim: OptimConfig
    precision: Precision
    device: torch.device
    vocab_size: int
    block_size: int

    def peak(self, size: int, accum: int, memory: CudaMemory) -> int | None:
        """Bytes the step at `size` peaked at, or None when it ran out of memory."""
        try:
            with memory.watch():
                self.run(size, min(accum, 2))  # two micro-batches: the second's forward meets the first's gradients
            peak = memory.peak()
        except torch.OutOfMemoryError:
            peak = None
        self.model.zero_grad(set_to_none=True)  # an out-of-memory in the backward leaves some
        gc.collect()  # whatever the failed step left in reference cycles would count in the next trial
        return peak

    def run(self, size: int, accum: int) -> None:
        optimizer, precision = build_optimizer(self.model, self.optim, self.device.type), self.precision
        scaler, autocast, clip = precision.grad_scaler(), precision.autocast(), self.optim.grad_clip
        trainer = Trainer(self.compiled, optimizer, scaler, autocast, accum, clip, Ranks())  # each rank tries alone
        batches = RandomBatches(self.vocab_size, size, self.block_size, self.device)
        for step in range(TRIAL_STEPS):
            result = train_step(trainer, batches, step)
        result.loss.item()  # waits for the device: an asynchronous failure surfaces here

    @contextlib.contextmanager
    def leaving_the_run_as_it_was(self) -> Iterator[None]:
        """The weights (on the host meanwhile) and the random streams (a resume's, for dropout) put back after."""
        weights = {name: value.detach().to("cpu", copy=True) for name, value in self.model.state_dict().items()}
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            yield
        self.model.load_state_dict(weights)


def smaller_run(config: Config) -> str:
    """What else holds memory, beside the micro-batch."""
    return (
        "model.block_size or the model's size"
        + ("" if config.compile else ", or set compile=true (it keeps fewer activations)")
        + (", or precision=bf16" if config.precision == "fp32" else "")
    )


def out_of_memory_advice(config: Config) -> str:
    """What to make smaller after an out-of-memory, under this config's way of batching."""
    rest = smaller_run(config)
    if config.batch_size == "auto":
        return (
            f"batch_size=auto already chose the largest micro-batch that fit its trial with {MARGIN:.0%} free; "
            f"something else took memory (evaluation, another process): give batch_size a number below its "
            f"choice, or lower {rest}"
        )
    if config.tokens_per_step is not None:
        return (
            f"lower batch_size (tokens_per_step={config.tokens_per_step} keeps the tokens per step through more "
            f"micro-batches; batch_size=auto finds the largest that fits on a GPU), or lower {rest}"
        )
    return (
        f"lower batch_size and raise grad_accum_steps to keep the tokens per step (or set tokens_per_step, "
        f"which does it for you), or lower {rest}"
    )


@contextlib.contextmanager
def out_of_memory_advised(config: Config) -> Iterator[None]:
    """An allocation that fails inside ends the command in one line of advice fitting the config."""
    try:
        yield
    except RuntimeError as err:
        message = describe_out_of_memory(err, out_of_memory_advice(config))
        if message is None:
            raise
        raise UserError(message) from None
