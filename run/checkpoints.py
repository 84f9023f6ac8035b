"""A run's checkpoints: `Checkpoints` keeps them as the run's one writer (save, prune, the links,
`latest`, a resume's restore); anyone finds one (`find_checkpoint`) and reads it (`load_checkpoint`).

    <run_dir>/checkpoints/
        step_000250/  model.safetensors  weights only (safe to load from anyone)
                      config.yaml        model + data + tokenizer: enough to rebuild the model
                      tokenizer.json     a trained tokenizer (data.tokenizer=bpe), which config.yaml names
                      state.pt           optimizer, scaler, step, RNG states (loaded with weights_only=True)
                      SHA256SUMS         each file's sha256 (`sha256sum -c` reads it), checked on every read
        latest -> step_000250            the newest complete checkpoint
        best   -> step_000250            the one with the lowest validation loss

A save is written into a temporary directory, fsynced and renamed into place before `latest` moves (an
atomic symlink swap): a kill at any moment leaves the previous good checkpoint; a failed save (a full disk)
removes its temporary directory and says which checkpoint is intact.
"""

import errno
import os
import re
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from conf import Config, read_settings
from data import Tokenizer, load_tokenizer
from data.meta import file_sha256
from model import GPTConfig
from model.state import WRAPPER_PREFIXES, fit_problems, non_finite, shared_names, unwrap_model
from run.distributed import Ranks
from run.runtime import reseed, seed_everything, set_rng_state
from system import UserError, fsync, point_link, replace_keeping_links_valid

WEIGHTS, CONFIG, STATE, DIGESTS = "model.safetensors", "config.yaml", "state.pt", "SHA256SUMS"
CHECKPOINTS = "checkpoints"
# What state.pt holds, by key and type: anything else is not a training state of train.py.
STATE_FIELDS = {"step": int, "best_val_loss": float, "optimizer": dict, "scaler": dict, "rng": list}
LEFTOVERS = (".tmp_", ".stale_")  # directories of saves that were interrupted


class CheckpointError(UserError):
    """A checkpoint is missing, incomplete, corrupt or does not fit the model."""


@dataclass
class Checkpoint:
    path: Path
    config: dict[str, Any]  # the contents of config.yaml
    model_state: dict[str, torch.Tensor]

    @property
    def model_config(self) -> GPTConfig:
        try:
            return read_settings(GPTConfig, self.config["model"])
        except ValueError as err:
            first_line = str(err).splitlines()[0]
            raise CheckpointError(f"{self.path / CONFIG} has an invalid model section: {first_line}") from err

    def tokenizer(self) -> Tokenizer:
        """The tokenizer the model was trained with, as its config.yaml describes it."""
        if not isinstance(description := self.config.get("tokenizer"), dict):
            raise CheckpointError(f"{self.path / CONFIG} does not describe a tokenizer (no `tokenizer` section)")
        return load_tokenizer(description, self.path)

    @property
    def run_dir(self) -> Path:
        return self.path.parent.parent

    def check_finite(self) -> None:
        """Refuse weights holding inf or NaN (train.py never saves them; another tool might)."""
        if bad := non_finite(self.model_state):
            raise CheckpointError(
                f"{self.path} holds non-finite weights (inf or NaN) in {bad}: the run diverged "
                "before this save; use an earlier checkpoint of the run (checkpoints/step_*)"
            )

    def training_state(self) -> dict[str, Any]:
        """state.pt: everything besides the weights that resuming needs."""
        path = self.path / STATE
        if not path.is_file():
            raise CheckpointError(f"{self.path} has no {STATE}: it holds weights only and cannot be resumed")
        verify_digests(self.path, [STATE])
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # torch raises several types for damaged archives
            reason = "the file is empty" if path.stat().st_size == 0 else str(err) or type(err).__name__
            raise CheckpointError(
                f"corrupt training state {path}: {reason}; resume from another checkpoint of "
                "the run (checkpoints/step_*)"
            ) from err
        if not isinstance(state, dict):
            problems = [f"it holds a {type(state).__name__}, not a dict"]
        else:
            problems = [
                f"{key!r} missing" if key not in state else f"{key!r} is a {type(got).__name__}, not {kind.__name__}"
                for key, kind in STATE_FIELDS.items()
                if not isinstance(got := state.get(key), kind) or isinstance(got, bool)
            ]
        if problems:
            raise CheckpointError(
                f"{path} is not a training state of train.py ({'; '.join(problems)}): resume from "
                "another checkpoint of the run, or start a new run from these weights with init_from=checkpoint"
            )
        return state


def write_digests(path: Path) -> None:
    names = [name for name in (WEIGHTS, CONFIG, STATE) if (path / name).is_file()]
    names += sorted(p.name for p in path.iterdir() if p.is_file() and p.name not in (*names, DIGESTS))  # tokenizer.json
    (path / DIGESTS).write_text("".join(f"{file_sha256(path / name)}  {name}\n" for name in names))


def verify_digests(path: Path, names: list[str]) -> None:
    """Check files of checkpoint `path` against its SHA256SUMS (older checkpoints have none, and are read unchecked)."""
    listing = path / DIGESTS

    def damaged(why: str) -> CheckpointError:  # truncated, edited, not text
        return CheckpointError(
            f"{listing} is damaged ({why}): the checkpoint's files cannot be checked; use another "
            f"checkpoint of the run (checkpoints/step_*), or delete {listing.name} to load them unchecked"
        )

    if not listing.exists():
        return
    try:
        lines = [line.split("  ", 1) for line in listing.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as err:
        raise damaged(getattr(err, "strerror", None) or str(err)) from err
    if malformed := [" ".join(line) for line in lines if len(line) != 2 or not re.fullmatch(r"[0-9a-f]{64}", line[0])]:
        raise damaged(f"{malformed[0]!r} is not '<sha256>  <file>'")
    recorded = {name: digest for digest, name in lines}
    for name in names:
        if name not in recorded:
            raise damaged(f"{name} is not listed")
        if file_sha256(path / name) != recorded[name]:
            raise CheckpointError(
                f"{path / name} does not match the sha256 recorded when it was saved: the file is damaged; "
                "use another checkpoint of the run (checkpoints/step_*) or restore it from a copy"
            )


def find_checkpoint(target: str | Path | None, runs_root: str | Path, setting: str = "checkpoint") -> Path:
    """One checkpoint directory from a checkpoint, run or checkpoints/ directory, or (None) the latest one saved
    under runs_root (sweep members included); `setting` is what the user passes a path as, for the message."""
    if target is None:
        links = (d / "latest" for d in Path(runs_root).glob(f"**/{CHECKPOINTS}"))  # a dangling one too
        if not (runs := sorted((link for link in links if link.is_symlink()), key=lambda p: p.lstat().st_mtime)):
            raise CheckpointError(
                f"no checkpoint found under {Path(runs_root).resolve()}: train one first with "
                f"`python train.py`, or pass {setting}=PATH"
            )
        return _follow_latest(runs[-1])
    if not str(target).strip():  # `resume=` would otherwise mean the current directory
        raise CheckpointError(f"{setting} is empty: pass a checkpoint or run directory, or leave it unset")
    path = Path(target)
    if (path / WEIGHTS).is_file():
        return path.resolve()
    for link in (path / "latest", path / CHECKPOINTS / "latest"):
        if link.is_symlink():
            return _follow_latest(link)
    for root in (path, path / CHECKPOINTS):  # a run whose `latest` link was lost
        if newest := _newest_complete(root):
            sys.stderr.write(f"warning: {root} has no `latest` link; using its newest complete checkpoint, {newest}\n")
            return newest.resolve()
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {path}: the path does not exist")
    raise CheckpointError(f"no checkpoint at {path}: expected {WEIGHTS} and {CONFIG} in it, or a run directory")


def _follow_latest(link: Path) -> Path:
    """Where a `latest` link leads; if its checkpoint is gone, the newest complete one left, said on stderr."""
    if (link / WEIGHTS).is_file():
        return link.resolve()
    newest, gone = _newest_complete(link.parent), f"{link} leads to {os.readlink(link)}, which is gone"
    if newest is None:
        raise CheckpointError(f"{gone}, and no other checkpoint is left in {link.parent}")
    print(f"warning: {gone} or incomplete; using the newest complete checkpoint left, {newest}", file=sys.stderr)
    return newest.resolve()


def _newest_complete(root: Path) -> Path | None:
    return next((p for p in reversed(step_dirs(root)) if (p / WEIGHTS).is_file() and (p / CONFIG).is_file()), None)


def has_checkpoint(run_dir: Path) -> bool:
    """Whether a run has saved a checkpoint: a `latest` link (even dangling) or a complete step directory."""
    root = Path(run_dir) / CHECKPOINTS
    return (root / "latest").is_symlink() or _newest_complete(root) is not None


def step_dirs(root: Path) -> list[Path]:
    """The step checkpoints under root, oldest first (by number: step_1000000 is newer than step_999999)."""
    steps = (p for p in root.glob("step_*") if re.fullmatch(r"step_\d+", p.name) and not p.is_symlink())
    return sorted(steps, key=lambda p: int(p.name[5:]))


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read a checkpoint's config and weights (to CPU); raises CheckpointError on damage."""
    path = Path(path)
    if missing := [name for name in (WEIGHTS, CONFIG) if not (path / name).is_file()]:
        raise CheckpointError(f"incomplete checkpoint {path}: missing {', '.join(missing)}")
    verify_digests(path, [WEIGHTS, CONFIG])
    try:
        config = OmegaConf.to_container(OmegaConf.load(path / CONFIG), resolve=True)
    except Exception as err:
        raise CheckpointError(
            f"corrupt {path / CONFIG}: {str(err).splitlines()[0] if str(err) else type(err).__name__}; "
            "use another checkpoint of the run (checkpoints/step_*)"
        ) from err
    if not isinstance(config, dict) or "model" not in config:
        raise CheckpointError(f"{path / CONFIG} has no `model` section")
    try:
        model_state = load_file(path / WEIGHTS)
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"corrupt weights file {path / WEIGHTS}: {err}") from err
    return Checkpoint(path=path, config=config, model_state=model_state)


def load_weights(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load weights saved by Checkpoints.save (or a compiled / DDP model's) into `model`, explaining any mismatch."""
    target, state = unwrap_model(model), {WRAPPER_PREFIXES.sub("", k): v for k, v in state.items()}
    expected = {name: tensor.shape for name, tensor in target.state_dict().items()}
    if problems := fit_problems(state, expected, "the checkpoint", "the model", optional=shared_names(target.config)):
        raise CheckpointError(f"checkpoint does not fit this model (a different model shape?): {problems}")
    target.load_state_dict(state, strict=False)


class Checkpoints:
    """The checkpoints of the run in `run_dir`, as its one writer (train.py holds the lock) keeps them: a save
    keeps the newest `keep_last` and what `latest` and `best` lead to; keep_state="latest" keeps state.pt in one."""

    def __init__(self, run_dir: str | Path, *, keep_last: int = 3, keep_state: str = "all") -> None:
        self.root, self.keep_last, self.keep_state = Path(run_dir) / CHECKPOINTS, keep_last, keep_state

    def latest(self) -> Path | None:
        """Where `latest` leads, else (link lost, dangling, a loop) the newest complete one; None before the first."""
        latest = self.root / "latest"
        return latest.resolve() if (latest / WEIGHTS).is_file() else _newest_complete(self.root)

    def save(
        self, step: int, model: nn.Module, config: dict, state: dict, is_best: bool = False, files: dict | None = None
    ) -> Path:
        """Write checkpoint `step` (and `files`: Tokenizer.files()), point `latest` (`best` if is_best) at it, prune."""
        final, shared = self.root / f"step_{step:06d}", shared_names(unwrap_model(model).config)
        weights = {k: v.detach().contiguous() for k, v in unwrap_model(model).state_dict().items() if k not in shared}
        if bad := non_finite(weights):
            raise CheckpointError(
                f"refusing to write {final}: non-finite weights in {bad}; the earlier checkpoints are untouched"
            )
        tmp = self.root / f"{LEFTOVERS[0]}{final.name}_{os.getpid()}"
        try:
            self._write(tmp, weights, config, state, files or {})
            self._move_into_place(tmp, final, is_best)
            self.prune()
        except (OSError, RuntimeError, SafetensorError) as err:  # torch and safetensors wrap OS errors
            low = self.root.is_dir() and shutil.disk_usage(self.root).free < 2**20
            what = f"could not write the checkpoint ({type(err).__name__}: {err})"
            if getattr(err, "errno", None) == errno.ENOSPC or low:  # a full disk, whichever library reported it
                what = "no space left on device"
            if tmp.resolve() not in self._linked():  # unless a re-save already pointed a link at it
                shutil.rmtree(tmp, ignore_errors=True)
            intact = self.latest()
            intact = f"the last good checkpoint {intact} is intact" if intact else "there is no earlier checkpoint"
            raise CheckpointError(f"{what} writing checkpoint {final}; {intact}") from err
        if self.keep_state == "latest":
            self._drop_states(keep=final)
        return final

    def _write(self, tmp: Path, weights: dict, config: dict, state: dict, files: dict[str, str]) -> None:
        """Every file of a checkpoint into tmp, fsynced; the digests last, of complete files."""
        self.root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        save_file(weights, tmp / WEIGHTS)
        OmegaConf.save(OmegaConf.create(config), tmp / CONFIG)
        torch.save(state, tmp / STATE)
        for name, content in files.items():
            (tmp / name).write_text(content, encoding="utf-8")
        write_digests(tmp)
        for path in [*tmp.iterdir(), tmp]:
            fsync(path)

    def _move_into_place(self, tmp: Path, final: Path, is_best: bool) -> None:
        """Rename tmp to final, then point `latest` (and `best`) at it: each move atomic."""
        best = self.root / "best"
        links = [self.root / "latest"] + ([best] if is_best else [])
        if final.exists():  # saving the same step again (e.g. interrupted right after a resume)
            leads_here = [best] if not is_best and best.exists() and best.resolve() == final.resolve() else []
            stale = final.with_name(f"{LEFTOVERS[1]}{final.name}_{os.getpid()}")
            replace_keeping_links_valid(final, tmp, links + leads_here, stale)
        else:
            tmp.rename(final)
            fsync(self.root)
        for link in links:
            point_link(link, final)
        fsync(self.root)

    def prune(self) -> None:
        """Remove all but the newest keep_last checkpoints (a linked one stays) and interrupted saves' leftovers."""
        protected, steps = self._linked(), step_dirs(self.root)
        for old in steps[: max(len(steps) - self.keep_last, 0)]:
            if old.resolve() not in protected:
                shutil.rmtree(old)
        self.remove_interrupted_saves()

    def _drop_states(self, keep: Path) -> None:
        """keep_state=latest: the other checkpoints' state.pt and its line in their SHA256SUMS go, so that
        `sha256sum -c` still checks what is left (the other lines stand as recorded: no file is read again)."""
        for listing in [p / DIGESTS for p in step_dirs(self.root) if p != keep and (p / STATE).exists()]:
            if listing.exists():
                lines = listing.read_text(encoding="utf-8").splitlines(keepends=True)
                kept = "".join(line for line in lines if line.rstrip("\n").split("  ", 1)[-1] != STATE)
                listing.write_text(kept, encoding="utf-8")
            (listing.parent / STATE).unlink(missing_ok=True)

    def remove_interrupted_saves(self) -> list[Path]:
        """Delete and return the directories of killed saves but one a link leads to (only as the run's writer)."""
        leftovers = [p for p in self.root.glob(".*") if p.name.startswith(LEFTOVERS) and p.is_dir()]
        leftovers = [p for p in leftovers if p.resolve() not in self._linked()]
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
            saved, asked = asdict(checkpoint.model_config), asdict(model.config)
            raise CheckpointError(
                f"checkpoint {checkpoint.path} holds a different model: "
                + "; ".join(f"model.{k}: {v!r} saved, {asked[k]!r} asked" for k, v in saved.items() if v != asked[k])
                + "; a resume continues the saved model: drop those overrides, or start a new run from it "
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
        if (latest := self.latest()) not in (None, checkpoint.path.resolve()):
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

    def _linked(self) -> set[Path]:
        return {(self.root / name).resolve() for name in ("latest", "best") if (self.root / name).exists()}
