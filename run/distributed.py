"""Data parallelism on PyTorch's own stack: torchrun starts one process per device, DistributedDataParallel
averages gradients (NCCL on CUDA, gloo on CPU); without torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE)
everything here is a no-op. A rank does not train on without its launcher (Ranks.launcher), nor wait on a
rank that ended: rank 0's refusals reach the others, and a rank that finds a peer gone stops with one line."""

import contextlib
import gc
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from run.runtime import resolve_device
from system import UserError, command_finished

LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
# How gloo says a peer's end of the connection closed: the peer process ended.
PEER_GONE = ("Connection closed by peer", "Connection reset by peer")
T = TypeVar("T")


class PeerStopped(UserError):
    """Another rank ended (it refused the run, failed or was killed), so this one stops too."""


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    launcher: int | None = None  # the process id of the launcher (torchrun's agent) that started this one

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 alone logs, evaluates, writes files and talks to wandb."""
        return self.rank == 0


def init_distributed(device_setting: str) -> tuple[Ranks, torch.device]:
    """Join torchrun's process group (if any) and pick this process's device (on CUDA, its local rank's GPU)."""
    device = resolve_device(device_setting)
    if not all(name in os.environ for name in LAUNCHER_VARIABLES):
        return Ranks(), device
    ranks = Ranks(*(int(os.environ[name]) for name in LAUNCHER_VARIABLES), launcher=os.getppid())
    if device.type == "cuda":
        device = torch.device("cuda", ranks.local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    return ranks, device


def wrap_model(model: nn.Module, ranks: Ranks, device: torch.device) -> nn.Module:
    if not ranks.enabled:
        return model
    return nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def broadcast_from_main(ranks: Ranks, value: Any) -> Any:
    """Rank 0's value on every rank (e.g. the run directory, which only rank 0 may choose)."""
    holder = [value]
    if ranks.enabled:
        dist.broadcast_object_list(holder, src=0)
    return holder[0]


def main_decides(ranks: Ranks, decide: Callable[[], T]) -> T:
    """Rank 0 alone runs `decide`, every rank gets its result; rank 0's refusal stops the others with one line."""
    if not ranks.enabled:
        return decide()
    value, refused = None, None
    if ranks.is_main:
        try:
            value = decide()
        except (UserError, ValueError) as err:
            refused = err
    value, was_refused = broadcast_from_main(ranks, (value, refused is not None))
    if refused is not None:
        raise refused
    if was_refused:
        raise PeerStopped(f"rank {ranks.rank}: stopped, rank 0 refused the run (its line says why)")
    return value


@contextlib.contextmanager
def peers_watched(ranks: Ranks, left_behind: Callable[[], str]) -> Iterator[None]:
    """When another rank ends mid-collective, this one stops with one line saying what is left (`left_behind()`),
    not gloo's traceback; signals are ignored from there, so the last line is not the launcher's SIGTERM."""
    try:
        yield
    except RuntimeError as err:
        if not (ranks.enabled and any(gone in str(err) for gone in PEER_GONE)):
            raise
        command_finished()
        peer = f"rank {1 - ranks.rank}" if ranks.world_size == 2 else "another rank"
        raise PeerStopped(
            f"rank {ranks.rank}: lost {peer} (killed, or failed with its own line), so this rank "
            f"stopped too; {left_behind()}"
        ) from None


def gather_to_main(ranks: Ranks, value: Any) -> list[Any]:
    """[value of rank 0, value of rank 1, ...] on rank 0 (and [value] when alone)."""
    if not ranks.enabled:
        return [value]
    gathered = [None] * ranks.world_size if ranks.is_main else None
    dist.gather_object(value, gathered, dst=0)
    return gathered


def all_reduce_sum(ranks: Ranks, tensor: torch.Tensor) -> torch.Tensor:
    """The sum over all ranks (in place; queued on the device, the host does not wait)."""
    if ranks.enabled:
        dist.all_reduce(tensor)
    return tensor


def barrier(ranks: Ranks) -> None:
    if ranks.enabled:
        dist.barrier()


def shutdown(ranks: Ranks) -> None:
    """Close the process group while the interpreter is fully alive: DDP holds it through reference cycles, and
    destroyed during finalization, gloo's threads touching a Python tensor abort the process (SIGABRT)."""
    if dist.is_initialized():  # also a group of one (torchrun --nproc_per_node=1)
        gc.collect()
        dist.destroy_process_group()
