"""What a run reports: metrics.jsonl, the console, and (when asked) wandb."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from run.metrics import METRICS, rewrite_up_to

_META = ("kind", "step", "time")  # a record's keys that are not metrics


class RunLogger:
    """Every record to <run_dir>/metrics.jsonl, the console (a live bar on a terminal, plain lines
    otherwise) and wandb (wandb.mode offline or online). Resuming at step k drops the records after k
    when steps after k are about to be trained (start_step < max_iters), so a resumed run's log reads
    like an uninterrupted one's; a last line cut short by a crash or a full disk is dropped, and said so.
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        start_step: int,
        max_iters: int,
        progress: bool,
        wandb_settings: dict[str, Any],
        config: dict[str, Any],
        enabled: bool = True,
    ) -> None:
        self.enabled = enabled  # False on DDP ranks other than 0: they report nothing
        if not enabled:
            return
        self.path = Path(run_dir) / METRICS
        torn = rewrite_up_to(self.path, start_step if start_step < max_iters else None)
        self.file = self.path.open("a")
        live = progress and sys.stderr.isatty()
        self.bar = tqdm(total=max_iters, initial=start_step, desc="train", dynamic_ncols=True, disable=not live)
        self.wandb_run = _start_wandb(wandb_settings, config, Path(run_dir))
        if torn:
            self.print(f"{self.path}: dropped its last line, cut short by an interrupted write: {torn[:60]!r}")

    def log(self, record: dict[str, Any], echo: bool = True) -> None:
        """One record: {"kind": "train" | "eval" | "micro_batch", "step": ..., metrics...}; echo=False: not printed."""
        if not self.enabled:
            return
        record = {**record, "time": round(time.time(), 3)}
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.wandb_run is not None:
            self.wandb_run.log(
                {f"{record['kind']}/{k}": v for k, v in record.items() if k not in _META}, step=record["step"]
            )
        if record["kind"] == "train" and not self.bar.disable:
            self.bar.n = record["step"]
            self.bar.set_postfix_str(_format(record, ("loss", "lr", "tok_per_s", "mfu")), refresh=True)
        elif echo:
            self.print(f"step {record['step']:>6} | {record['kind']:<5} | " + _format(record))

    def print(self, text: str) -> None:
        if self.enabled:
            tqdm.write(text, file=sys.stderr if not self.bar.disable else sys.stdout)

    def close(self) -> None:
        if not self.enabled:
            return
        self.bar.close()
        self.file.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()


def _format(record: dict[str, Any], keys: Iterable[str] = ()) -> str:
    """`keys` of the record (all but _META's when none are named), formatted as the console shows them."""
    keys = keys or [k for k in record if k not in _META]
    return " | ".join(_part(key, record[key]) for key in keys if record.get(key) is not None)


def _part(key: str, value: Any) -> str:
    if key == "lr":
        return f"lr {value:.2e}"
    if key in ("tok_per_s", "tokens"):
        return f"{key} {value:,.0f}"
    if key == "mfu":
        return f"mfu {100 * value:.1f}%"
    return f"{key} {value:.4f}" if isinstance(value, float) else f"{key} {value}"


def check_wandb(mode: str) -> None:
    """ValueError when wandb is to log online without an API key (train.py asks before any work)."""
    if mode != "online":
        return
    import wandb  # imported only when used: it is slow to import

    if not wandb.login(prompt=False, verify=False):
        raise ValueError(
            "logging.wandb.mode=online needs a wandb API key (run `wandb login` or set WANDB_API_KEY); "
            "use logging.wandb.mode=offline to log locally and `wandb sync` later"
        )


def _start_wandb(settings: dict[str, Any], config: dict[str, Any], run_dir: Path):
    mode = settings["mode"]
    if mode == "disabled":
        return None
    check_wandb(mode)
    import wandb

    run_id = hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:16]  # one wandb run per run directory
    name, group = settings.get("name") or run_dir.name, settings.get("group")
    return wandb.init(
        mode=mode,
        project=settings["project"],
        name=name,
        group=group,
        id=run_id,
        resume="allow",
        dir=str(run_dir),
        config=config,
    )
