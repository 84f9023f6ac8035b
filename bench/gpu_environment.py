"""The environment stage of the GPU acceptance run (bench/gpu_check.py): the device, the
versions of the packages that can differ from the ones tested, and which SDPA backends run
each of gptlab's attention calls."""

from __future__ import annotations

import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version

import torch
import torch.nn.functional as F

from run.runtime import synchronize

VERSIONS = ("torch", "triton", "numpy", "pyarrow", "fsspec", "huggingface-hub", "datasets", "hydra-core")


def environment(device: torch.device, sdpa_shape: tuple[int, int, int, int], smoke: bool) -> dict:
    info = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": str(device),
        "versions": _versions(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            gpu=props.name,
            memory_gib=round(props.total_memory / 2**30, 1),
            cuda=torch.version.cuda,
            capability=f"{props.major}.{props.minor}",
            multiprocessors=props.multi_processor_count,
            driver=_nvidia_smi("driver_version"),
            compute_mode=_nvidia_smi("compute_mode"),
        )
    else:
        info.update(cpu=platform.processor() or platform.machine(), threads=torch.get_num_threads())
    info["sdpa"] = sdpa_backends(device, sdpa_shape, torch.float32 if smoke else torch.bfloat16)
    return info


def _versions() -> dict[str, str | None]:
    found = {}
    for name in VERSIONS:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def _nvidia_smi(field: str) -> str:
    try:
        result = subprocess.run(
            ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        )
        return result.stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "unknown"


def sdpa_backends(
    device: torch.device, shape: tuple[int, int, int, int], dtype: torch.dtype
) -> dict[str, dict[str, str]]:
    """For each of gptlab's attention calls, whether each SDPA backend runs it ('ok' or why not)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B, H, T, D = shape
    make = lambda heads, length: torch.randn(B, heads, length, D, device=device, dtype=dtype)  # noqa: E731
    padded = torch.ones(B, 1, T, T, dtype=torch.bool, device=device).tril()
    padded[:, :, :, : T // 4] = False  # the first quarter of every row is padding
    padded[:, :, : T // 4, 0] = True  # padding queries attend to something, as the cache arranges
    calls = {
        "train causal (MHA)": lambda: F.scaled_dot_product_attention(
            make(H, T), make(H, T), make(H, T), is_causal=True
        ),
        "train causal (GQA-4, enable_gqa)": lambda: F.scaled_dot_product_attention(
            make(H, T), make(4, T), make(4, T), is_causal=True, enable_gqa=True
        ),
        "padded prefill (boolean mask)": lambda: F.scaled_dot_product_attention(
            make(H, T), make(H, T), make(H, T), attn_mask=padded
        ),
        "decode, grouped (MQA, 1 query)": lambda: F.scaled_dot_product_attention(
            make(1, H), make(1, T), make(1, T), attn_mask=padded[:, :, -1:, :]
        ),
    }
    backends = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "math": SDPBackend.MATH,
    }
    table = {}
    for call, run in calls.items():
        table[call] = {}
        for name, backend in backends.items():
            try:
                with sdpa_kernel([backend]):
                    run()
                synchronize(device)
                table[call][name] = "ok"
            except RuntimeError as err:
                table[call][name] = "no: " + str(err).strip().splitlines()[0][:80]
    return table
