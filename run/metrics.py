"""A run's metrics.jsonl: one JSON record per line, read back by resume and by report.py."""

import json
import sys
from pathlib import Path
from typing import Any

from system import write_atomic

METRICS = "metrics.jsonl"


class MetricsError(ValueError):
    """A metrics.jsonl line that is not a JSON record (other than a torn last line)."""


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The records of a run's metrics.jsonl; a torn last line is left out, and said so on stderr."""
    path = Path(run_dir) / METRICS
    records, torn = _parse(path)
    if torn is not None:
        sys.stderr.write(
            f"warning: {path}: its last line was cut short by an interrupted write and is left out: {torn[:60]!r}\n"
        )
    return records


def _parse(path: Path) -> tuple[list[dict[str, Any]], str | None]:
    """The records of a metrics file, and its torn last line (a write cut short: no newline, not JSON), left out."""
    if not path.exists():
        return [], None
    lines, records = path.read_text(encoding="utf-8", errors="replace").split("\n"), []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            if number == len(lines):  # the last line, with no newline after it
                return records, line
            raise MetricsError(
                f"{path} line {number} is not a JSON record ({err.msg}): fix or delete that line"
            ) from err
    return records, None


def rewrite_up_to(path: Path, step: int | None) -> str | None:
    """Keep the records up to `step` (all when None), without a torn last line; returns that line, if any."""
    records, torn = _parse(path)
    kept = [r for r in records if step is None or r["step"] <= step]
    ends_whole = not path.exists() or path.read_bytes()[-1:] in (b"", b"\n")
    if len(kept) == len(records) and torn is None and ends_whole:
        return None
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))
    return torn
