"""Model FLOPs utilisation: achieved training FLOP/s over the hardware's peak."""

from __future__ import annotations

import time

import torch

# Dense peak FLOP/s per GPU from the vendors' datasheets (no sparsity), by the
# precision the matmuls run in. fp32 entries assume TF32 tensor cores (enabled
# by training.runtime.configure_cuda).
GPU_PEAK_FLOPS = {
    "H200": {"bf16": 989e12, "fp16": 989e12, "fp32": 494e12},
    "H100": {"bf16": 989e12, "fp16": 989e12, "fp32": 494e12},
    "A100": {"bf16": 312e12, "fp16": 312e12, "fp32": 156e12},
    "L40S": {"bf16": 362e12, "fp16": 362e12, "fp32": 183e12},
    "A10": {"bf16": 125e12, "fp16": 125e12, "fp32": 62.5e12},
    "L4": {"bf16": 121e12, "fp16": 121e12, "fp32": 60e12},
    "RTX 4090": {"bf16": 165e12, "fp16": 165e12, "fp32": 82.6e12},
    "RTX 3090": {"bf16": 71e12, "fp16": 71e12, "fp32": 35.6e12},
    "V100": {"fp16": 125e12, "fp32": 15.7e12},
    "T4": {"fp16": 65e12, "fp32": 8.1e12},
}


def estimate_mfu(flops_per_token: float, tokens_per_second: float, peak_flops: float) -> float:
    """Fraction of peak_flops that tokens_per_second of training achieves."""
    return flops_per_token * tokens_per_second / peak_flops


def peak_flops(device: torch.device, precision: str) -> float | None:
    """The peak to measure MFU against: the datasheet figure of a known GPU, the
    measured matmul rate of a CPU, or None for an unknown GPU."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, peaks in GPU_PEAK_FLOPS.items():
            if key in name:
                return peaks.get(precision)
        return None
    return measure_matmul_flops(dtype=torch.float32 if precision == "fp32" else torch.bfloat16)


def measure_matmul_flops(size: int = 2048, trials: int = 3, dtype: torch.dtype = torch.float32) -> float:
    """FLOP/s of square matmuls on the CPU: the practical peak a model's matmuls can
    reach here (a CPU has no datasheet figure that software attains). The best of a
    few short trials, so a busy moment on a shared machine does not set the peak."""
    a = torch.randn(size, size, dtype=dtype)
    b = torch.randn(size, size, dtype=dtype)
    a @ b  # warm up threads and caches
    best = float("inf")
    for _ in range(trials):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best
