"""A run's checkpoints, kept by one manager: each save written whole or not at all, the
`latest` and `best` links moved after it, old saves pruned, a resume's training state
restored. run/checkpoint.py describes the layout, and reads and finds checkpoints.

A checkpoint is written into a temporary directory, fsynced and renamed into
place, and only then does `latest` move (an atomic symlink swap), so a crash or a
kill at any moment leaves the previous good checkpoint where it was. A save that
fails (a full disk) removes its temporary directory and says which checkpoint is intact.
"""

from __future__ import annotations

import errno
import os
import shutil
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from safetensors import SafetensorError
from safetensors.torch import save_file
from torch import nn

from conf import Config
from model import GPTConfig
from run.checkpoint import (
    CHECKPOINTS,
    CONFIG,
    STATE,
    WEIGHTS,
    Checkpoint,
    CheckpointError,
    drop_state,
    last_good_checkpoint,
    load_weights,
    non_finite,
    step_dirs,
    stored_once,
    unwrap_model,
    write_digests,
)
from run.distributed import Ranks
from run.runtime import reseed, seed_everything, set_rng_state
from system import replace_atomically

LEFTOVERS = (".tmp_", ".stale_")  # directories of saves that were interrupted
LINKS = ("latest", "best")  # the checkpoints they lead to are never deleted


class Checkpoints:
    """The checkpoints of the run in `run_dir`, as its one writer keeps them (train.py holds
    the run's lock): every save keeps the newest `keep_last` and whatever `latest` and `best`
    lead to; keep_state="latest" leaves state.pt in the newest only (the others keep weights)."""

    def __init__(self, run_dir: str | Path, *, keep_last: int = 3, keep_state: str = "all") -> None:
        self.run_dir = Path(run_dir)
        self.root = self.run_dir / CHECKPOINTS
        self.keep_last, self.keep_state = keep_last, keep_state

    def latest(self) -> Path | None:
        """The checkpoint a resume of the run continues from; None before the first."""
        return last_good_checkpoint(self.run_dir)

    def save(
        self,
        step: int,
        model: nn.Module,
        config: dict[str, Any],
        state: dict[str, Any],
        *,
        is_best: bool = False,
        files: dict[str, str] | None = None,
    ) -> Path:
        """Write checkpoint `step`, point `latest` (and `best` if is_best) at it, then prune.
        `config` is its config.yaml, `state` its state.pt; `files` are written beside
        config.yaml by name (the tokenizer's, Tokenizer.files()). Returns its path."""
        final = self.root / f"step_{step:06d}"
        weights = {
            k: v.detach().contiguous()
            for k, v in unwrap_model(model).state_dict().items()
            if k not in stored_once(model)
        }
        _check_finite(weights, final)
        tmp = self.root / f"{LEFTOVERS[0]}{final.name}_{os.getpid()}"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            _write_files(tmp, weights, config, state, files or {})
            self._move_into_place(tmp, final, is_best)
            self.prune()
        except (OSError, RuntimeError, SafetensorError) as err:  # torch and safetensors wrap OS errors
            raise self._save_failed(err, tmp, final) from err
        if self.keep_state == "latest":
            for older in step_dirs(self.root):
                if older != final and (older / STATE).exists():
                    drop_state(older)
        return final

    def prune(self) -> None:
        """Delete all but the newest keep_last step checkpoints and leftovers of interrupted
        saves, never what `latest` or `best` leads to."""
        protected = self._linked()
        steps = step_dirs(self.root)
        for old in steps[: max(len(steps) - self.keep_last, 0)]:
            if old.resolve() not in protected:
                shutil.rmtree(old)
        self.remove_interrupted_saves()

    def remove_interrupted_saves(self) -> list[Path]:
        """Delete the temporary directories of saves that were killed, except one that a link
        still leads to; call it only as the run's one writer. Returns what it removed."""
        if not self.root.is_dir():
            return []
        protected = self._linked()
        leftovers = [
            p
            for p in self.root.iterdir()
            if p.name.startswith(LEFTOVERS) and p.is_dir() and p.resolve() not in protected
        ]
        for leftover in leftovers:
            shutil.rmtree(leftover)
        return leftovers

    def restore(
        self,
        checkpoint: Checkpoint,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler,
        config: Config,
        ranks: Ranks,
        device: torch.device,
    ) -> tuple[int, float, str]:
        """Load a checkpoint's weights and training state; returns (step, best val loss, a line to print)."""
        if checkpoint.model_config != model.config:
            raise CheckpointError(
                f"checkpoint {checkpoint.path} holds a different model: "
                f"{model_differences(checkpoint.model_config, model.config)}; "
                "a resume continues the saved model: drop those overrides, or start a new run from it "
                "(init_from=checkpoint)"
            )
        checkpoint.check_finite()
        load_weights(model, checkpoint.model_state)
        state = checkpoint.training_state()
        try:
            optimizer.load_state_dict(state["optimizer"])
        except (KeyError, ValueError) as err:
            raise CheckpointError(
                f"checkpoint {checkpoint.path} holds another optimizer's state than optim.name="
                f"{config.optim.name}'s: resume with the optim.name the run was started with"
            ) from err
        if state["scaler"]:  # empty when the run had no loss scaling (bf16, fp32): a new fp16 run starts afresh
            scaler.load_state_dict(state["scaler"])
        step, rng_states = state["step"], state["rng"]
        note = f"resumed from {checkpoint.path} at step {step}; {max(config.max_iters - step, 0)} steps to go"
        latest = self.latest()
        if latest is not None and latest != checkpoint.path.resolve():
            note += f" (an older checkpoint than latest, {latest.name}: " + (
                "the log after it is replaced as the run goes on)"
                if step < config.max_iters
                else "nothing to train, so the log is kept whole)"
            )
        if len(rng_states) == ranks.world_size:  # each rank continues its own random streams
            set_rng_state(rng_states[ranks.rank], device)
        else:  # the batches stay exact; dropout masks are fresh, distinct per rank and reproducible
            seed_everything(reseed(config.weights_seed, ranks.rank, step))
            note += (
                f" (saved by {len(rng_states)} process(es), resumed on {ranks.world_size}: "
                "the data order is exact, the dropout masks are new)"
            )
        return step, state["best_val_loss"], note

    def _move_into_place(self, tmp: Path, final: Path, is_best: bool) -> None:
        """Rename the complete checkpoint tmp to final, then point `latest` (and `best`) at it."""
        best = self.root / "best"
        links = [self.root / "latest"] + ([best] if is_best else [])
        if final.exists():  # saving the same step again (e.g. interrupted right after a resume)
            leads_here = [best] if not is_best and best.exists() and best.resolve() == final.resolve() else []
            _replace_keeping_links_valid(final, tmp, links + leads_here)
        else:
            tmp.rename(final)
            _fsync(self.root)
        for link in links:
            _point(link, final)
        _fsync(self.root)

    def _save_failed(self, err: Exception, tmp: Path, final: Path) -> CheckpointError:
        """The error of a save that failed, saying which checkpoint is intact, once its
        temporary directory is gone (unless a re-save already pointed a link at it)."""
        what = f"{_write_failure(err, self.root)} writing checkpoint {final}"
        if tmp.resolve() not in self._linked():
            shutil.rmtree(tmp, ignore_errors=True)
        intact = self.latest()
        intact = f"the last good checkpoint {intact} is intact" if intact else "there is no earlier checkpoint"
        return CheckpointError(f"{what}; {intact}")

    def _linked(self) -> set[Path]:
        """The checkpoints `latest` and `best` lead to."""
        return {(self.root / name).resolve() for name in LINKS if (self.root / name).exists()}


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    model: nn.Module,
    config: dict[str, Any],
    state: dict[str, Any],
    keep_last: int = 3,
    is_best: bool = False,
    keep_state: str = "all",
    files: dict[str, str] | None = None,
) -> Path:
    """One save into run_dir's checkpoints, for a writer that keeps no manager (a tool, a test)."""
    return Checkpoints(run_dir, keep_last=keep_last, keep_state=keep_state).save(
        step, model, config, state, is_best=is_best, files=files
    )


def _write_files(
    tmp: Path, weights: dict[str, torch.Tensor], config: dict[str, Any], state: dict[str, Any], files: dict[str, str]
) -> None:
    """The checkpoint's files in `tmp`, fsynced, with their digests written last."""
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file(weights, tmp / WEIGHTS)
    OmegaConf.save(OmegaConf.create(config), tmp / CONFIG)
    torch.save(state, tmp / STATE)
    for name, content in files.items():
        (tmp / name).write_text(content, encoding="utf-8")
    write_digests(tmp)
    for path in tmp.iterdir():
        _fsync(path)
    _fsync(tmp)


def _write_failure(err: Exception, root: Path) -> str:
    """A full disk in plain words, whichever library reported it (torch's message names no errno)."""
    if getattr(err, "errno", None) == errno.ENOSPC or (root.is_dir() and shutil.disk_usage(root).free < 2**20):
        return "no space left on device"
    return f"could not write the checkpoint ({type(err).__name__}: {err})"


def model_differences(saved: GPTConfig, asked: GPTConfig) -> str:
    """'model.<field>: <saved> saved, <asked> asked' for each setting the two configs differ in."""
    return "; ".join(
        f"model.{f.name}: {getattr(saved, f.name)!r} saved, {getattr(asked, f.name)!r} asked"
        for f in fields(GPTConfig)
        if getattr(saved, f.name) != getattr(asked, f.name)
    )


def _check_finite(weights: dict[str, torch.Tensor], destination: Path) -> None:
    bad = non_finite(weights)
    if bad:
        raise CheckpointError(
            f"refusing to write {destination}: non-finite weights in {bad}; the earlier checkpoints are untouched"
        )


def _replace_keeping_links_valid(final: Path, new: Path, links: list[Path]) -> None:
    """Swap the complete checkpoint `new` in for `final` so that every link in `links`
    always leads to a complete checkpoint: first to `new`, then to the new `final`
    (hard links to new's files, so nothing is copied)."""
    for link in links:
        _point(link, new)
    stale = final.with_name(f"{LEFTOVERS[1]}{final.name}_{os.getpid()}")
    final.rename(stale)
    shutil.copytree(new, final, copy_function=_link_or_copy)
    for path in final.iterdir():
        _fsync(path)
    _fsync(final.parent)
    for link in links:
        _point(link, final)
    shutil.rmtree(stale)
    shutil.rmtree(new)


def _link_or_copy(source: str, destination: str) -> None:
    try:
        os.link(source, destination)
    except OSError:  # a filesystem without hard links
        shutil.copy2(source, destination)


def _point(link: Path, target: Path) -> None:
    """Atomically make `link` a relative symlink to `target`."""
    replace_atomically(link, lambda temp: temp.symlink_to(target.name))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
