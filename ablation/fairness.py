"""Which runs report.py may compare; anything else is refused, naming runs, settings and values.

A run's settings are its config.yaml with its checkpoint's (resolved) model and tokenizer. All
runs share data and tokenizer; an arm's seeds differ in their seed only; arms under default
names (kv<n>) differ from the baseline only in ARM_SETTINGS (one named arm=NAME may change
anything else, listed in the report); a null arm must run seeds the baseline did not. The
block is part of the shape (ablation/runs.py), so block settings are never a difference here.
"""

from __future__ import annotations

from typing import Any

from ablation.runs import Arm, Run, flatten
from system import UserError

# Where a run went and how it was run, not what it trained: free to differ between any two runs.
NOT_COMPARED = frozenset(
    ("seed", "out_dir", "resume", "runs_root", "model_path", "device", "compile", "keep_last", "keep_state")
    + tuple(f"data.{key}" for key in ("num_proc", "batch_mb", "data_dir", "hf_cache_dir", "keep_hf_cache", "verify"))
)
NOT_COMPARED_PREFIXES = ("logging.",)
ARM_SETTINGS = ("arm", "model.n_kv_head", "match_mha_flops", "tokens_per_param")  # what a kv<n> arm may change
DATA_PREFIXES = ("data.", "tokenizer.")
NUMERICS = ("device", "compile")  # not compared, yet another value computes other numbers from one seed
SHOWN_CHARS = 40  # of a tokenizer's description (its characters, say) in a message; other values in full


def settings(run: Run) -> dict[str, Any]:
    """The run's settings as dotted keys, those that do not change what it trains left out."""
    described = {key: value for key, value in run.settings.items() if key != "model"}
    described |= {"model": run.checkpoint.config["model"], "tokenizer": run.checkpoint.config.get("tokenizer") or {}}
    flat = flatten(described)
    return {k: v for k, v in flat.items() if k not in NOT_COMPARED and not k.startswith(NOT_COMPARED_PREFIXES)}


def differences(run: Run, other: Run, ignored: tuple[str, ...] = ()) -> dict[str, tuple[Any, Any]]:
    """The settings whose values differ between the two runs: key -> (run's value, other's).
    A setting one of them does not record (it predates the setting) is not compared."""
    mine, theirs = settings(run), settings(other)
    return {k: (mine[k], theirs[k]) for k in sorted(mine.keys() & theirs.keys() - set(ignored)) if mine[k] != theirs[k]}


def check_same_data(runs: list[Run]) -> None:
    """Refuse a sweep whose runs trained on other data or with another tokenizer."""
    first = runs[0]
    for run in runs[1:]:
        if differ := {k: v for k, v in differences(run, first).items() if k.startswith(DATA_PREFIXES)}:
            raise UserError(
                f"{run.path} trained on other data than {first.path}: {_listed(differ)}; a loss on other "
                "text or tokens is not comparable: move one of them out of the sweep directory"
            )


def check_seeds_alike(arm: Arm) -> None:
    """Refuse an arm whose runs differ in anything but their seed."""
    first = arm.runs[0]
    for run in arm.runs[1:]:
        if differ := differences(run, first):
            raise UserError(
                f"{run.path} and {first.path}, two seeds of arm {arm.name}, differ in {_listed(differ)}: "
                "the runs of an arm may differ in their seed only; give the run's settings an arm of their "
                "own (arm=NAME), or move it out of the sweep directory"
            )


def check_against_baseline(arm: Arm, baseline: Arm) -> None:
    """Refuse an arm under its default name kv<n> that differs from a baseline under its
    default name in more than the attention layout and the budget."""
    if not (arm.name == f"kv{arm.config.n_kv_head}" and baseline.name == f"kv{baseline.config.n_kv_head}"):
        return
    if differ := differences(arm.runs[0], baseline.runs[0], ARM_SETTINGS):
        raise UserError(
            f"{arm.runs[0].path} (arm {arm.name}) differs from the baseline {baseline.runs[0].path} (arm "
            f"{baseline.name}) in {_listed(differ)}: arms under their default names kv<n> may differ only in "
            f"{', '.join(ARM_SETTINGS)} and seed; give a deliberate change an arm name of its own (arm=NAME), or "
            "move the run out of the sweep directory"
        )


def check_independent(arm: Arm, baseline: Arm) -> None:
    """Refuse an arm with a run under one of the baseline's seeds and the baseline's
    settings (a null arm that reran a baseline seed): the same settings and seed train the
    same model, so a test would count the baseline's own run on both sides."""
    twins = {run.seed: run for run in baseline.runs}
    for run, twin in ((run, twins[run.seed]) for run in arm.runs if run.seed in twins):
        if not differences(run, twin, ("arm",)) and all(run.settings.get(k) == twin.settings.get(k) for k in NUMERICS):
            free = max(arm.seeds + baseline.seeds) + 1
            raise UserError(
                f"{run.path} (arm {arm.name}, seed {run.seed}) is the baseline's run {twin.path} again: the same "
                f"settings under the same seed train the same model, so it is no independent sample; move it out of "
                f"the sweep directory and run arm {arm.name} under seeds the baseline did not run (seed={free})"
            )


def changes(arm: Arm, baseline: Arm) -> str:
    """What an arm changes besides its layout and budget, e.g. 'optim.learning_rate 0.001 (baseline 0.002)'."""
    differ = differences(arm.runs[0], baseline.runs[0], ARM_SETTINGS)
    return ", ".join(f"{k} {_shown(k, mine)} (baseline {_shown(k, theirs)})" for k, (mine, theirs) in differ.items())


def _listed(differ: dict[str, tuple[Any, Any]]) -> str:
    return ", ".join(f"{key} ({_shown(key, mine)} and {_shown(key, theirs)})" for key, (mine, theirs) in differ.items())


def _shown(key: str, value: Any) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text[:SHOWN_CHARS] + "..." if key.startswith("tokenizer.") and len(text) > SHOWN_CHARS else text
