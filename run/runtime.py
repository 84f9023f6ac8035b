"""Where and in what precision a run computes: device, autocast, gradient scaling."""

from __future__ import annotations

import contextlib
import os
import platform
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from conf import DEVICE, DTYPES, PRECISIONS


def describe_machine(device: torch.device) -> str:
    """The device a measurement ran on, for the headers of benchmarks and reports."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{_cpu_model()}, {len(os.sched_getaffinity(0))} cores, {torch.get_num_threads()} threads"


def _cpu_model() -> str:
    return _cpuinfo("model name") or platform.processor() or platform.machine()


CPUINFO = Path("/proc/cpuinfo")  # Linux's; elsewhere there is none, and nothing is read from it
BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # x86 instructions that multiply bf16 natively


def _cpuinfo(key: str) -> str | None:
    """The first core's value of `key` in CPUINFO; None where it cannot be read (not Linux)."""
    try:
        lines = CPUINFO.read_text().splitlines()
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in lines if line.split(":")[0].strip() == key), None)


def cpu_computes_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX512-BF16 or AMX in its flags). Without
    it torch emulates bf16 matmuls, several times slower than fp32; unknown flags count as without."""
    return bool(set((_cpuinfo("flags") or "").split()) & set(BF16_FLAGS))


def resolve_device(name: str) -> torch.device:
    """'auto' is CUDA when present, else CPU; 'cpu', 'cuda' and 'cuda:N' are taken as given
    when this machine has them. A config has checked the spelling already (conf's DEVICE
    rule); the benchmarks and the harness's --device reach here with theirs unchecked."""
    if not DEVICE.allows(name):
        raise ValueError(f"device must be {DEVICE}, got {name!r}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device(name)
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
        if self.name == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def grad_scaler(self) -> torch.amp.GradScaler:
        return torch.amp.GradScaler(self.device_type, enabled=self.uses_grad_scaler)


def resolve_precision(name: str, device: torch.device, cpu_bf16: bool = False) -> Precision:
    """'auto' is bf16 on CUDA devices that support it, fp16 on older CUDA devices, and fp32 on
    a CPU, or with cpu_bf16 (training's autocast) bf16 on a CPU that computes it natively.
    Sampling keeps fp32 there: its weights are cast to the precision, not autocast."""
    if name not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {name!r}")
    if name == "auto":
        if device.type == "cuda":
            name = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        else:
            name = "bf16" if cpu_bf16 and cpu_computes_bf16() else "fp32"
    return Precision(name, device.type)


def available_memory(device: torch.device) -> int | None:
    """Bytes that can still be allocated on device (the kernel's MemAvailable for the
    CPU), or None where that cannot be read."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as meminfo:
            kilobytes = next(int(line.split()[1]) for line in meminfo if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None
    return kilobytes * 1024


def synchronize(device: torch.device) -> None:
    """Wait for queued CUDA work, so wall-clock timings cover it (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def configure_cuda(tf32: bool) -> None:
    """tf32=True: fp32 matmuls (precision=fp32, and the fp32 parts of autocast) run on
    TF32 tensor cores, ~10 bits of mantissa, plenty for training and several times
    faster on Ampere and newer. tf32=False: true IEEE fp32."""
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def reseed(seed: int, rank: int, step: int) -> int:
    """A fresh, reproducible seed for rank `rank` resuming at `step` where the saved
    random streams do not fit (another number of processes)."""
    return int(np.random.SeedSequence([seed, rank, step]).generate_state(1)[0])


def rng_state(device: torch.device) -> dict:
    """This process's random generators (its own CUDA device's only), as tensors and
    plain containers (weights_only-safe)."""
    state = {
        "torch": torch.get_rng_state(),
        "numpy": _numpy_state_to_plain(np.random.get_state()),
        "python": list(random.getstate()),
    }
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


def _numpy_state_to_plain(state: tuple) -> list:
    # numpy's MT19937 key array becomes a tensor: torch.load(weights_only=True) refuses ndarrays.
    name, keys, pos, has_gauss, cached = state
    return [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)]
