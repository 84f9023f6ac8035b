"""Checkpoints: their layout, and how one is found and read.

    <run_dir>/checkpoints/
        step_000250/  model.safetensors  weights only (safe to load from anyone)
                      config.yaml        model + data + tokenizer: enough to rebuild the model
                      tokenizer.json     a trained tokenizer (data.tokenizer=bpe), which config.yaml names
                      state.pt           optimizer, scaler, step, RNG states (tensors and plain
                                         containers only, loaded with weights_only=True)
                      SHA256SUMS         the sha256 of each file above (`sha256sum -c` reads it),
                                         checked whenever the checkpoint is read
        latest -> step_000250            the newest complete checkpoint
        best   -> step_000250            the one with the lowest validation loss

The run's one writer keeps them with run/checkpoints.py's Checkpoints (save, prune, the
links, resume); anyone reads them here.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from conf import read_settings
from data import Tokenizer, load_tokenizer
from data.meta import file_sha256
from model import GPTConfig
from system import UserError

WEIGHTS, CONFIG, STATE, DIGESTS = "model.safetensors", "config.yaml", "state.pt", "SHA256SUMS"
CHECKPOINTS = "checkpoints"
STEP_DIR = re.compile(r"^step_(\d+)$")
# What state.pt holds, by key and type: anything else is not a training state of train.py.
STATE_FIELDS = {"step": int, "best_val_loss": float, "optimizer": dict, "scaler": dict, "rng": list}
# A tied head shares its matrix with the token embedding; only one copy is stored.
TIED_WEIGHT = "lm_head.weight"
# Key prefixes added by torch.compile (_orig_mod.) and DistributedDataParallel (module.).
WRAPPER_PREFIXES = re.compile(r"^(?:(?:_orig_mod|module)\.)+")


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
            raise CheckpointError(
                f"{self.path / CONFIG} has an invalid model section: {str(err).splitlines()[0]}"
            ) from err

    def tokenizer(self) -> Tokenizer:
        """The tokenizer the model was trained with, as its config.yaml describes it."""
        description = self.config.get("tokenizer")
        if not isinstance(description, dict):
            raise CheckpointError(f"{self.path / CONFIG} does not describe a tokenizer (no `tokenizer` section)")
        return load_tokenizer(description, self.path)

    @property
    def run_dir(self) -> Path:
        return self.path.parent.parent

    def check_finite(self) -> None:
        """Refuse weights holding inf or NaN (train.py never saves them; another tool might)."""
        bad = non_finite(self.model_state)
        if bad:
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
        _check_state(state, path)
        return state


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain GPT inside torch.compile and DistributedDataParallel wrappers."""
    while True:
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if inner is None:
            return model
        model = inner


def write_digests(path: Path) -> None:
    """Record the sha256 of checkpoint `path`'s files in its SHA256SUMS."""
    names = [name for name in (WEIGHTS, CONFIG, STATE) if (path / name).is_file()]
    names += sorted(p.name for p in path.iterdir() if p.is_file() and p.name not in (*names, DIGESTS))  # tokenizer.json
    (path / DIGESTS).write_text("".join(f"{file_sha256(path / name)}  {name}\n" for name in names))


def drop_state(path: Path) -> None:
    """Delete checkpoint `path`'s state.pt and its line in SHA256SUMS, so that `sha256sum -c`
    still checks what is left (the other lines stand as recorded: no file is read again)."""
    listing = path / DIGESTS
    if listing.exists():
        kept = [
            line
            for line in listing.read_text(encoding="utf-8").splitlines(keepends=True)
            if line.rstrip("\n").split("  ", 1)[-1] != STATE
        ]
        listing.write_text("".join(kept), encoding="utf-8")
    (path / STATE).unlink(missing_ok=True)


def verify_digests(path: Path, names: list[str]) -> None:
    """Check files of checkpoint `path` against its SHA256SUMS (checkpoints saved before
    digests were recorded have none, and are read unchecked)."""
    listing = path / DIGESTS
    if not listing.exists():
        return
    recorded = read_digests(listing)
    for name in names:
        if name not in recorded:
            raise _damaged_digests(listing, f"{name} is not listed")
        if file_sha256(path / name) != recorded[name]:
            raise CheckpointError(
                f"{path / name} does not match the sha256 recorded when it was saved: the file is damaged; "
                "use another checkpoint of the run (checkpoints/step_*) or restore it from a copy"
            )


def read_digests(listing: Path) -> dict[str, str]:
    """{file name: sha256} from a SHA256SUMS listing; CheckpointError naming it when it is
    not one (truncated, edited, not text)."""
    try:
        lines = [line.split("  ", 1) for line in listing.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as err:
        raise _damaged_digests(listing, getattr(err, "strerror", None) or str(err)) from err
    malformed = [" ".join(line) for line in lines if len(line) != 2 or not re.fullmatch(r"[0-9a-f]{64}", line[0])]
    if malformed:
        raise _damaged_digests(listing, f"{malformed[0]!r} is not '<sha256>  <file>'")
    return {name: digest for digest, name in lines}


def _damaged_digests(listing: Path, why: str) -> CheckpointError:
    return CheckpointError(
        f"{listing} is damaged ({why}): the checkpoint's files cannot be checked; use another "
        f"checkpoint of the run (checkpoints/step_*), or delete {listing.name} to load them unchecked"
    )


def find_checkpoint(target: str | Path | None, runs_root: str | Path, setting: str = "checkpoint") -> Path:
    """Resolve what the user asked for to one checkpoint directory.

    target may be a checkpoint directory, a run directory (its latest checkpoint), a
    checkpoints/ directory, or None for the latest checkpoint of the run saved most
    recently anywhere under runs_root (sweep members included). `setting` is what the
    user would pass a path as, for the message when there is none.
    """
    if target is None:
        links = (d / "latest" for d in Path(runs_root).glob(f"**/{CHECKPOINTS}"))  # a dangling one too
        runs = sorted((link for link in links if link.is_symlink()), key=lambda p: p.lstat().st_mtime)
        if not runs:
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
        newest = _newest_complete(root) if root.is_dir() else None
        if newest is not None:
            print(
                f"warning: {root} has no `latest` link; using its newest complete checkpoint, {newest}", file=sys.stderr
            )
            return newest.resolve()
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {path}: the path does not exist")
    raise CheckpointError(f"no checkpoint at {path}: expected {WEIGHTS} and {CONFIG} in it, or a run directory")


def _follow_latest(link: Path) -> Path:
    """Where a `latest` link leads; if its checkpoint is gone, the newest complete one
    left, said on stderr."""
    if (link / WEIGHTS).is_file():
        return link.resolve()
    newest = _newest_complete(link.parent)
    if newest is None:
        raise CheckpointError(
            f"{link} leads to {os.readlink(link)}, which is gone, and no other checkpoint is left in {link.parent}"
        )
    print(
        f"warning: {link} leads to {os.readlink(link)}, which is gone or incomplete; using the newest complete "
        f"checkpoint left, {newest}",
        file=sys.stderr,
    )
    return newest.resolve()


def last_good_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint a resume of the run continues from: where `latest` leads, else (the
    link lost, dangling or a loop) the newest complete one; None before the first."""
    root = run_dir / CHECKPOINTS
    if (root / "latest" / WEIGHTS).is_file():
        return (root / "latest").resolve()
    return _newest_complete(root) if root.is_dir() else None


def _newest_complete(root: Path) -> Path | None:
    """The newest step checkpoint under root that has its weights and config."""
    complete = [p for p in step_dirs(root) if (p / WEIGHTS).is_file() and (p / CONFIG).is_file()]
    return complete[-1] if complete else None


def has_checkpoint(run_dir: Path) -> bool:
    """Whether a run has saved a checkpoint: its `latest` link exists (even if what it led
    to was deleted since) or a complete step directory does; the temporaries of
    interrupted saves do not count."""
    root = Path(run_dir) / CHECKPOINTS
    return root.is_dir() and ((root / "latest").is_symlink() or _newest_complete(root) is not None)


def step_dirs(root: Path) -> list[Path]:
    """The step checkpoints under root, oldest first (by step number, not by name:
    step_1000000 is newer than step_999999)."""
    steps = (p for p in root.iterdir() if STEP_DIR.match(p.name) and not p.is_symlink())
    return sorted(steps, key=lambda p: int(STEP_DIR.match(p.name).group(1)))


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read a checkpoint's config and weights (to CPU); raises CheckpointError on damage."""
    path = Path(path)
    missing = [name for name in (WEIGHTS, CONFIG) if not (path / name).is_file()]
    if missing:
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
    """Load weights saved by Checkpoints.save (or from a compiled / DDP model's
    state_dict) into `model`, explaining any mismatch in plain words."""
    target = unwrap_model(model)
    state = {WRAPPER_PREFIXES.sub("", k): v for k, v in state.items()}
    expected = target.state_dict()
    missing = sorted(set(expected) - set(state) - stored_once(target))
    unexpected = sorted(set(state) - set(expected))
    wrong_shape = [
        f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(expected[k].shape)}"
        for k, v in state.items()
        if k in expected and v.shape != expected[k].shape
    ]
    problems = []
    if missing:
        problems.append(f"missing {_first_few(missing)}")
    if unexpected:
        problems.append(f"unexpected {_first_few(unexpected)}")
    if wrong_shape:
        problems.append("different shapes: " + "; ".join(wrong_shape[:5]))
    if problems:
        raise CheckpointError("checkpoint does not fit this model (a different model shape?): " + "; ".join(problems))
    target.load_state_dict(state, strict=False)


def stored_once(model: nn.Module) -> set[str]:
    """The tied head's name when the model ties it to the token table (its matrix is saved
    as transformer.wte.weight), else none: an untied head is saved as itself."""
    return {TIED_WEIGHT} if unwrap_model(model).config.tie_embeddings else set()


def non_finite(weights: dict[str, torch.Tensor]) -> str:
    """The names of the tensors holding inf or NaN (a few, for a message), or ''."""
    finite = torch.stack([torch.isfinite(t).all() for t in weights.values()])  # one host read for all
    return "" if bool(finite.all()) else _first_few([name for name, ok in zip(weights, finite.tolist()) if not ok])


def _check_state(state: object, path: Path) -> None:
    if not isinstance(state, dict):
        problems = [f"it holds a {type(state).__name__}, not a dict"]
    else:
        problems = [
            f"{key!r} missing" if key not in state else f"{key!r} is a {type(state[key]).__name__}, not {kind.__name__}"
            for key, kind in STATE_FIELDS.items()
            if not isinstance(state.get(key), kind) or isinstance(state.get(key), bool)
        ]
    if problems:
        raise CheckpointError(
            f"{path} is not a training state of train.py ({'; '.join(problems)}): resume from "
            "another checkpoint of the run, or start a new run from these weights with "
            "init_from=checkpoint"
        )


def _first_few(names: list[str], n: int = 5) -> str:
    return ", ".join(names[:n]) + (" ..." if len(names) > n else "")
