"""Where a figure came from: the machine, the software and the gptlab commit, for every result file."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from functools import partial
from pathlib import Path

import torch

from run.runtime import describe_machine

ROOT = Path(__file__).resolve().parents[1]  # the checkout


def provenance(device: torch.device | None = None) -> dict:
    """The facts a benchmark's JSON records beside its figures."""
    return {
        "date": utc_now(),
        "machine": describe_machine(device or torch.device("cpu")),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "gptlab": git_state(),
        "load_average": round(os.getloadavg()[0], 2),
    }


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def git_state(paths: tuple[str, ...] = ()) -> str:
    """The commit, and whether the tree (or `paths` in it) differs from it (read-only: no index refresh)."""
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
    git = partial(subprocess.run, cwd=ROOT, capture_output=True, text=True, env=env, check=True)
    try:
        commit = git(["git", "rev-parse", "--short", "HEAD"]).stdout.strip()
        changed = git(["git", "status", "--porcelain", "--untracked-files=no", "--", *paths]).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    where = f" in {' or '.join(p + '/' for p in paths)}" if paths else ""
    return f"{commit}{f' + uncommitted changes{where}' if changed else ''}"
