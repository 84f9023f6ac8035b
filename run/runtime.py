"""Where and in what precision a run computes: device, autocast, gradient scaling."""

import contextlib
import os
import platform
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from conf import DEVICE, DTYPES, PRECISIONS

CPUINFO, MEMINFO = Path("/proc/cpuinfo"), Path("/proc/meminfo")  # Linux's; elsewhere nothing is read from them
BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # x86 instructions that multiply bf16 natively


def describe_machine(device: torch.device) -> str:
    """The device a measurement ran on, for the headers of benchmarks and reports."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = _proc(CPUINFO, "model name") or platform.processor() or platform.machine()
    return f"{cpu}, {len(os.sched_getaffinity(0))} cores, {torch.get_num_threads()} threads"


def _proc(path: Path, key: str) -> str | None:
    """The (first core's) value of `key` in a /proc file; None where it cannot be read (not Linux)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in lines if line.split(":")[0].strip() == key), None)


def resolve_device(name: str) -> torch.device:
    """'auto' is CUDA when present, else CPU; 'cpu', 'cuda' and 'cuda:N' as given when this machine has them
    (the spelling checked again: the benchmarks and the harness's --device reach here unchecked)."""
    if not DEVICE.allows(name):
        raise ValueError(f"device must be {DEVICE}, got {name!r}")
    if name in ("auto", "cpu"):
        return torch.device("cuda" if name == "auto" and torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        raise ValueError(f"device={name} was asked for but CUDA is not available; use device=cpu")
    if int(name.partition(":")[2] or 0) >= torch.cuda.device_count():  # read here: torch refuses a huge index
        raise ValueError(f"device={name} does not exist: {torch.cuda.device_count()} CUDA device(s)")
    return torch.device(name)


@dataclass(frozen=True)
class Precision:
    """How the forward pass is computed. Weights and optimizer state stay fp32."""

    name: str  # fp32, bf16 or fp16
    device_type: str

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.name]

    @property
    def uses_grad_scaler(self) -> bool:
        # fp16's narrow exponent range underflows small gradients unless the loss is scaled.
        return self.name == "fp16"

    def autocast(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext() if self.name == "fp32" else torch.autocast(self.device_type, dtype=self.dtype)

    def grad_scaler(self) -> torch.amp.GradScaler:
        return torch.amp.GradScaler(self.device_type, enabled=self.uses_grad_scaler)


def resolve_precision(name: str, device: torch.device, cpu_bf16: bool = False) -> Precision:
    """'auto' is bf16 on CUDA devices that support it, fp16 on older ones, and fp32 on a CPU, or with cpu_bf16
    (training's autocast) bf16 on a CPU that multiplies it in hardware: elsewhere torch emulates bf16 matmuls,
    several times slower than fp32 (sampling keeps fp32 there: its weights are cast, not autocast)."""
    if name not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {name!r}")
    if name == "auto":
        if device.type == "cuda":
            name = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        else:
            name = "bf16" if cpu_bf16 and set((_proc(CPUINFO, "flags") or "").split()) & set(BF16_FLAGS) else "fp32"
    return Precision(name, device.type)


def available_memory(device: torch.device) -> int | None:
    """Bytes that can still be allocated on device (the kernel's MemAvailable for the CPU); None if unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    kilobytes = _proc(MEMINFO, "MemAvailable")  # "<n> kB"
    return int(kilobytes.split()[0]) * 1024 if kilobytes else None


def synchronize(device: torch.device) -> None:
    """Wait for queued CUDA work, so wall-clock timings cover it (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def configure_cuda(tf32: bool) -> None:
    """tf32=True: fp32 matmuls (also autocast's) run on TF32 tensor cores, ~10 bits of mantissa, plenty for
    training and several times faster on Ampere and newer. tf32=False: true IEEE fp32."""
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def reseed(seed: int, rank: int, step: int) -> int:
    """A fresh, reproducible seed for `rank` resuming at `step` where the saved streams do not fit."""
    return int(np.random.SeedSequence([seed, rank, step]).generate_state(1)[0])


def rng_state(device: torch.device) -> dict:
    """This process's random generators (its own CUDA device's only), as tensors and plain containers:
    weights_only=True refuses ndarrays, so numpy's MT19937 key array becomes a tensor."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    numpy = [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)]
    state = {"torch": torch.get_rng_state(), "numpy": numpy, "python": list(random.getstate())}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if device.type == "cuda" and isinstance(state.get("cuda"), torch.Tensor):
        torch.cuda.set_rng_state(state["cuda"], device)
