"""Run directories: where a new run goes, its one writer, what `resume=...` continues, the config it records."""

import contextlib
import os
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import filelock
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from conf import Config, one_line_errors
from run.checkpoints import (
    WEIGHTS,
    Checkpoint,
    CheckpointError,
    Checkpoints,
    find_checkpoint,
    has_checkpoint,
    load_checkpoint,
)
from run.metrics import METRICS, read_metrics
from system import write_atomic

RUN_CONFIG = "config.yaml"  # the resolved config the run started with
LOCK = ".lock"  # held by the one process writing the run
HOLDER = ".lock.pid"  # that process's id
RUN_GROUPS = "groups.yaml"  # its config-group choices (model=nano, ...)


def new_run_dir(config: Config) -> Path:
    """out_dir if given, else a Hydra sweep's (`-m`) job directory, else a fresh <runs_root>/<date>_<time>; never
    one holding a run with a checkpoint (one that stopped before its first is started afresh: see run_lock)."""
    if config.out_dir or (HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN):
        path = Path(config.out_dir or HydraConfig.get().runtime.output_dir)
        _refuse_a_run_with_checkpoints(path)
        _check_creatable(path, "out_dir" if config.out_dir else "hydra.sweep.dir")
        return path
    _check_creatable(Path(config.runs_root), "runs_root")
    base = Path(config.runs_root) / datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    path, n = base, 1
    while path.exists():
        path, n = base.with_name(f"{base.name}_{n}"), n + 1
    return path


def _refuse_a_run_with_checkpoints(path: Path) -> None:
    if (path / RUN_CONFIG).exists() and has_checkpoint(path):
        raise ValueError(f"{path} already holds a run; pass resume={path} to continue it")


def _check_creatable(path: Path, setting: str) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"{setting}={path}: cannot create that directory ({err.strerror})") from err
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"{setting}={path}: that directory is not writable")


@contextlib.contextmanager
def run_lock(run_dir: Path, *, new_run: bool) -> Iterator[str]:
    """One writer per run directory: an OS lock on .lock, released however the process ends (kill -9 included); a
    second writer is told who holds it. The writer removes what killed saves left; a new run takes over a directory
    whose run stopped before its first checkpoint, yielding a line saying so ('' otherwise)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(run_dir / LOCK)
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        holder = (run_dir / HOLDER).read_text().strip() if (run_dir / HOLDER).exists() else "unknown"
        raise ValueError(
            f"{run_dir} is in use: process {holder} is writing it; wait for it to end, or train into another out_dir"
        ) from None
    try:
        if new_run:  # another run may have taken it between our check and the lock
            _refuse_a_run_with_checkpoints(run_dir)
        (run_dir / HOLDER).write_text(f"{os.getpid()}\n")
        Checkpoints(run_dir).remove_interrupted_saves()
        yield _take_over(run_dir) if new_run else ""
    finally:
        lock.release()
        if new_run and not (run_dir / RUN_CONFIG).exists():  # failed before it began: leave nothing behind
            for name in (LOCK, HOLDER):
                (run_dir / name).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                run_dir.rmdir()  # only if empty


def _take_over(run_dir: Path) -> str:
    """Clear the files of a run that stopped before its first checkpoint, once sure that is what they are (a
    config.yaml gptlab did not write, or the log of a run whose checkpoints were deleted since, is refused)."""
    if not (run_dir / RUN_CONFIG).exists():
        return ""
    if not (run_dir / RUN_GROUPS).exists():
        raise ValueError(
            f"{run_dir} holds a {RUN_CONFIG} that no gptlab run wrote (it has no {RUN_GROUPS}): "
            "train into another out_dir"
        )
    if logged_a_save(run_dir):
        raise ValueError(
            f"{run_dir} held a run that saved checkpoints (its {METRICS} has evaluations past step 0, "
            "each followed by a save), and they are gone: its log is kept; train into another out_dir, "
            "or delete the directory to reuse it"
        )
    for name in (RUN_CONFIG, RUN_GROUPS, METRICS):
        (run_dir / name).unlink(missing_ok=True)
    return f"{run_dir} held a run that stopped before its first checkpoint: starting it afresh"


def logged_a_save(run_dir: Path) -> bool:
    """Whether the run's log shows a saved checkpoint: its first evaluation past step 0 is logged just before
    the first save, and more only once that is done, or the run ends there (at max_iters); an evaluation that
    ends the log before max_iters does not count (the save after it may have been cut short)."""
    records = read_metrics(run_dir)
    first = next((i for i, r in enumerate(records) if r.get("kind") == "eval" and r.get("step", 0) > 0), None)
    if first is None:
        return False
    try:
        max_iters = read_run_yaml(run_dir / RUN_CONFIG, run_dir).get("max_iters")
    except CheckpointError:  # unknown: read it as a finished run's, the cautious reading
        max_iters = None
    return first < len(records) - 1 or not isinstance(max_iters, int) or records[first]["step"] >= max_iters


def left_behind(run_dir: Path) -> str:
    """What a run that stopped before its end leaves, and how to go on."""
    if intact := Checkpoints(run_dir).latest():
        return f"the last good checkpoint {intact} is intact, and resume={run_dir} continues from it"
    if logged_a_save(run_dir):  # its one save, at max_iters, cut short (or deleted since)
        return (
            f"no checkpoint is left, and its {METRICS} reads as a run that saved one, so resume={run_dir} "
            f"refuses it: train into another out_dir, or delete {run_dir} to run it again there"
        )
    return f"stopped before the first checkpoint; resume={run_dir} starts the run afresh"


def save_run_config(run_dir: Path, settings: dict) -> None:
    """The run's settings, resolved (no interpolation left), as config.yaml."""
    run_dir.mkdir(parents=True, exist_ok=True)
    # groups.yaml first: a config.yaml without one is not a run's (see _take_over), even if a kill lands between.
    # A resume's is the run's own (a resume keeps its groups): its command's choices are only defaults.
    if not (run_dir / RUN_GROUPS).exists():
        OmegaConf.save(OmegaConf.create(group_choices()), run_dir / RUN_GROUPS)
    # Replaced whole (a resume rewrites it); resume: null, wherever it was resumed from.
    write_atomic(run_dir / RUN_CONFIG, OmegaConf.to_yaml({**settings, "resume": None}))


def resolve_resume(cfg: DictConfig) -> tuple[DictConfig, Checkpoint | None]:
    """With resume set, the saved run's own config: single values (max_iters=5000) still apply, group choices
    (model=nano) must be the run's own, so repeating the original command line works."""
    if cfg.resume is None or str(cfg.resume).lower() == "false":  # resume=false: a new run, as resume=null
        return OmegaConf.merge(cfg, {"resume": None}), None
    target = None if str(cfg.resume).lower() in ("true", "latest") else cfg.resume
    run = Path(str(target))
    # A run directory (not a checkpoint: those hold a config.yaml too) without a checkpoint starts afresh.
    if target is not None and (run / RUN_CONFIG).is_file() and not (run / WEIGHTS).exists() and not has_checkpoint(run):
        merged = _saved_config(run, cfg)
        merged.out_dir, merged.resume = str(target), None
        return merged, None
    if target is not None and (run / LOCK).exists() and not (run / RUN_CONFIG).exists():
        raise CheckpointError(
            f"{target} holds a run that stopped before it wrote its {RUN_CONFIG} (only its {LOCK} is "
            f"there): nothing was saved to resume; run the original command with out_dir={target} "
            "to start it there afresh, or delete the directory"
        )
    checkpoint = load_checkpoint(find_checkpoint(target, cfg.runs_root, setting="resume"))
    run_dir = checkpoint.run_dir
    if not (run_dir / RUN_CONFIG).is_file():
        raise CheckpointError(f"{run_dir} has no {RUN_CONFIG}: it is not a run directory of train.py")
    merged = _saved_config(run_dir, cfg)
    # The saved config says what seeded the run: a resume that changed it would record a run that never was.
    saved = OmegaConf.merge(OmegaConf.structured(Config), read_run_yaml(run_dir / RUN_CONFIG, run_dir))
    for key in ("seed", "seed_scope"):
        if merged[key] != saved[key]:
            raise ValueError(
                f"cannot apply {key}={merged[key]} when resuming {run_dir}: it was started with "
                f"{key}={saved[key]}, which seeded its steps so far (start a new run instead)"
            )
    merged.resume = cfg.resume
    return merged, checkpoint


def _saved_config(run_dir: Path, cfg: DictConfig) -> DictConfig:
    """The run's saved config with this command line's single-value overrides."""
    groups = run_dir / RUN_GROUPS
    saved_groups = read_run_yaml(groups, run_dir, may_be_empty=True) if groups.is_file() else {}
    values = []
    for override in command_line_overrides():
        key, _, value = override.lstrip("+").partition("=")
        if key in group_choices() or override.startswith("~"):
            if str(started_with := saved_groups.get(key, "<not recorded>")) != value:
                raise ValueError(
                    f"cannot apply '{override}' when resuming {run_dir}: it was started with "
                    f"{key}={started_with}; a run keeps its config groups (start a new run instead)"
                )
        elif key != "resume":
            values.append(f"{key}={value}")
    saved = read_run_yaml(run_dir / RUN_CONFIG, run_dir)
    if isinstance(saved.get("model"), dict):  # the model it built: its vocab_size and eot_id are the tokenizer's
        for key in ("vocab_size", "eot_id"):  # set again
            saved["model"].pop(key, None)
    try:
        with one_line_errors():  # omegaconf's validation errors: a value of the wrong type, an unknown key
            return OmegaConf.merge(OmegaConf.structured(Config), saved, OmegaConf.from_dotlist(values))
    except ValueError as err:
        raise ValueError(
            f"{run_dir / RUN_CONFIG} does not fit train.py's settings: {err}; mend that value in it, or start a new run"
        ) from err


def read_run_yaml(path: Path, run_dir: Path, *, may_be_empty: bool = False) -> dict:
    """A run's YAML file as a dict, or one error naming it (truncated, not UTF-8, a !!python tag, not a mapping)."""
    try:
        content = OmegaConf.to_container(OmegaConf.load(path))
    except Exception as err:  # yaml and omegaconf raise many types; all mean "unreadable"
        reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    else:
        if isinstance(content, dict) and (content or may_be_empty):
            return content
        reason = f"it holds a {type(content).__name__}, not settings" if content else "it is empty"
    raise CheckpointError(
        f"{path} is damaged ({reason}); restore it, or start a new run from the run's "
        f"weights with init_from=checkpoint model_path={run_dir}"
    )


def group_choices() -> dict[str, str | None]:
    """Which option of each config group this run uses, e.g. {"model": "nano"} (none when composed from Python)."""
    if not HydraConfig.initialized():
        return {}
    return {k: v for k, v in HydraConfig.get().runtime.choices.items() if not k.startswith("hydra")}


def command_line_overrides() -> list[str]:
    """This command's overrides as typed (`model.qk_norm=true`); none when composed from Python."""
    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
