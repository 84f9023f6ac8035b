"""Model FLOPs utilisation: achieved training FLOP/s over the hardware's peak."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import torch

from run.runtime import DTYPES

# Dense peak FLOP/s per GPU from NVIDIA's datasheets (the sparsity figures halved),
# by the precision the matmuls run in: "tf32" is precision=fp32 on TF32 tensor cores
# (the default, see run.runtime.configure_cuda), "fp32" is true fp32 (tf32=false).
# Each entry: (label, pattern the whole normalised device name must match, peaks).
_H100_SXM = {"bf16": 989e12, "fp16": 989e12, "tf32": 494e12, "fp32": 67e12}
_NVL = {"bf16": 835e12, "fp16": 835e12, "tf32": 417e12, "fp32": 60e12}  # H100 NVL and H200 NVL
GPU_PEAKS = (
    ("H100 NVL", r"H100 NVL.*", _NVL),
    ("H100 PCIe", r"H100 PCIE.*", {"bf16": 756e12, "fp16": 756e12, "tf32": 378e12, "fp32": 51e12}),
    ("H100 SXM", r"H100(?: SXM5?)?(?: \d+GB)?(?: HBM3E?)?", _H100_SXM),
    ("H200 NVL", r"H200 NVL.*", _NVL),
    ("H200 SXM", r"H200(?: SXM)?(?: \d+GB)?(?: HBM3E)?", _H100_SXM),
    ("GH200", r"GH200(?: \d+GB)?", _H100_SXM),
    ("A100", r"A100(?:[- ].*)?", {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12}),
    ("L40S", r"L40S", {"bf16": 362e12, "fp16": 362e12, "tf32": 183e12, "fp32": 91.6e12}),
    ("L40", r"L40", {"bf16": 181e12, "fp16": 181e12, "tf32": 90.5e12, "fp32": 90.5e12}),
    ("L4", r"L4", {"bf16": 121e12, "fp16": 121e12, "tf32": 60e12, "fp32": 30.3e12}),
    ("A10", r"A10", {"bf16": 125e12, "fp16": 125e12, "tf32": 62.5e12, "fp32": 31.2e12}),
    ("RTX 4090", r"RTX 4090", {"bf16": 165e12, "fp16": 165e12, "tf32": 82.6e12, "fp32": 82.6e12}),
    ("V100 SXM2", r"V100-SXM2.*", {"fp16": 125e12, "tf32": 15.7e12, "fp32": 15.7e12}),  # no TF32 before Ampere
    ("V100 PCIe", r"V100-PCIE.*", {"fp16": 112e12, "tf32": 14e12, "fp32": 14e12}),
    ("T4", r"T4", {"fp16": 65e12, "tf32": 8.1e12, "fp32": 8.1e12}),
)
_VENDOR_WORDS = re.compile(r"^(?:(?:NVIDIA|TESLA|GEFORCE)\s+)+", re.IGNORECASE)


@dataclass(frozen=True)
class Peak:
    flops: float
    source: str  # where the figure comes from, for the run header


def estimate_mfu(flops_per_token: float, tokens_per_second: float, peak_flops: float) -> float:
    """Fraction of peak_flops that tokens_per_second of training achieves."""
    return flops_per_token * tokens_per_second / peak_flops


def gpu_datasheet_peak(device_name: str, precision: str) -> Peak | None:
    """The datasheet peak of a GPU known by its name (torch.cuda.get_device_name's) at precision; None: unknown."""
    name = _VENDOR_WORDS.sub("", device_name.strip())
    for label, pattern, peaks in GPU_PEAKS:
        if re.fullmatch(pattern, name.upper()) and precision in peaks:
            return Peak(peaks[precision], f"{label} datasheet, {precision}")
    return None


def peak_flops(device: torch.device, precision: str, tf32: bool = True) -> Peak | None:
    """The peak MFU is measured against: a known GPU's datasheet figure, a CPU's measured matmul rate, or None."""
    if device.type == "cuda":
        matmul_precision = "tf32" if precision == "fp32" and tf32 else precision
        return gpu_datasheet_peak(torch.cuda.get_device_name(device), matmul_precision)
    return Peak(
        measure_matmul_flops(dtype=DTYPES[precision]),
        f"CPU matmul rate measured at start-up, {precision}: this run's own, so MFU compares "
        "across runs only on an otherwise idle machine",
    )


def run_peak(setting: float | None, device: torch.device, precision: str, tf32: bool) -> Peak | None:
    """A run's peak: logging.peak_flops when set, else peak_flops's."""
    return Peak(setting, "logging.peak_flops") if setting else peak_flops(device, precision, tf32=tf32)


def slow_cpu_precision(precision: str) -> str | None:
    """A warning when `precision` multiplies slower than fp32 on this CPU (bf16 without AVX512-BF16 or AMX)."""
    if precision == "fp32":
        return None
    fp32, chosen = (measure_matmul_flops(size=512, dtype=DTYPES[p]) for p in ("fp32", precision))
    if chosen * 1.5 > fp32:
        return None
    return (
        f"precision={precision} on this CPU: matmuls run {fp32 / chosen:.0f}x slower than in fp32 "
        f"(measured just now: {chosen / 1e9:.0f} against {fp32 / 1e9:.0f} GFLOP/s); precision=fp32 is "
        "faster here"
    )


def measure_matmul_flops(size: int = 2048, trials: int = 3, dtype: torch.dtype = torch.float32) -> float:
    """FLOP/s of square matmuls on the CPU, the practical peak a model's matmuls reach here: the best of
    a few trials (a busy moment does not set it), on operands from a generator of their own (a run's
    random streams are left as they were: resume stays exact)."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, dtype=dtype, generator=generator)
    b = torch.randn(size, size, dtype=dtype, generator=generator)
    a @ b  # warm up threads and caches
    best = float("inf")
    for _ in range(trials):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best
