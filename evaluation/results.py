"""downstream.json: the downstream figures of one checkpoint, in its directory, written by
downstream.py (a task evaluated again replaces its entry) and read by report.py (no harness needed).

    {"hellaswag": {"metrics": {"acc": 0.29, "acc_norm": 0.31, ...}, "items": 10042, "num_fewshot": 0, "limit": null}}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from system import UserError, replace_atomically

RESULTS = "downstream.json"


def write_results(checkpoint: Path, tasks: dict[str, dict[str, Any]]) -> Path:
    """Merge `tasks` into the checkpoint's results file (written whole or not at all); returns its path."""
    path = checkpoint / RESULTS
    text = json.dumps({**read_results(checkpoint), **tasks}, indent=2, sort_keys=True) + "\n"
    replace_atomically(path, lambda temp: temp.write_text(text, encoding="utf-8"))
    return path


def read_results(checkpoint: Path) -> dict[str, dict[str, Any]]:
    """The tasks of the checkpoint's results file ({} when it has none)."""
    path = checkpoint / RESULTS
    if not path.is_file():
        return {}
    try:
        tasks = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"cannot read {path}: {err}; delete it and evaluate the tasks again") from err
    entries = tasks.values() if isinstance(tasks, dict) else [None]
    if not all(isinstance(t, dict) and isinstance(t.get("metrics"), dict) for t in entries):
        raise UserError(
            f"{path} is not a results file of downstream.py (task: {{metrics: ...}}); delete it and "
            "evaluate the tasks again"
        )
    return tasks
