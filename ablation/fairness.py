"""Which runs report.py may compare: those on the same data, whose settings differ only
where an arm may differ.

A run's settings are its config.yaml, with the model and the tokenizer its checkpoint
describes (the model resolved: n_kv_head 4, not null). Every run of a sweep trains on
the same data with the same tokenizer. The seeds of one arm differ in their seed only.
Arms under their default names (kv<n>, as the attention experiments name them) differ
from the baseline only in ARM_SETTINGS: the attention layout and the budget. An arm
given a name of its own (arm=NAME) may change anything else, and the report lists
what it changes. An arm with the baseline's settings (a null check) must run seeds the
baseline did not: under a baseline seed it would rerun the baseline's own run. Anything
else is refused, naming the runs, the settings and both values.
The block (model.position, norm, mlp; ablation/runs.py's shape) is part of the group, as
the model's size is: runs of two blocks are two groups, each with its own baseline, so
their block settings are never a difference here.
"""

from __future__ import annotations

from typing import Any

from ablation.runs import Arm, Run, flatten
from system import UserError

# Where a run went and how it was run, not what it trained: free to differ between any two runs.
NOT_COMPARED = frozenset(
    {
        "seed",
        "out_dir",
        "resume",
        "runs_root",
        "model_path",
        "device",
        "compile",
        "keep_last",
        "keep_state",
        "data.num_proc",
        "data.batch_mb",
        "data.data_dir",
        "data.hf_cache_dir",
        "data.keep_hf_cache",
        "data.verify",
    }
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
    return {
        key: value
        for key, value in flatten(described).items()
        if key not in NOT_COMPARED and not key.startswith(NOT_COMPARED_PREFIXES)
    }


def differences(run: Run, other: Run, ignored: tuple[str, ...] = ()) -> dict[str, tuple[Any, Any]]:
    """The settings whose values differ between the two runs: key -> (run's value, other's).
    A setting one of them does not record (it predates the setting) is not compared."""
    mine, theirs = settings(run), settings(other)
    return {
        key: (mine[key], theirs[key])
        for key in sorted(mine.keys() & theirs.keys())
        if key not in ignored and mine[key] != theirs[key]
    }


def check_same_data(runs: list[Run]) -> None:
    """Refuse a sweep whose runs trained on other data or with another tokenizer."""
    first = runs[0]
    for run in runs[1:]:
        differ = {k: v for k, v in differences(run, first).items() if k.startswith(DATA_PREFIXES)}
        if differ:
            raise UserError(
                f"{run.path} trained on other data than {first.path}: {_listed(differ)}; a loss on other "
                "text or tokens is not comparable: move one of them out of the sweep directory"
            )


def check_seeds_alike(arm: Arm) -> None:
    """Refuse an arm whose runs differ in anything but their seed."""
    first = arm.runs[0]
    for run in arm.runs[1:]:
        differ = differences(run, first)
        if differ:
            raise UserError(
                f"{run.path} and {first.path}, two seeds of arm {arm.name}, differ in {_listed(differ)}: "
                "the runs of an arm may differ in their seed only; give the run's settings an arm of their "
                "own (arm=NAME), or move it out of the sweep directory"
            )


def check_against_baseline(arm: Arm, baseline: Arm) -> None:
    """Refuse an arm under its default name kv<n> that differs from a baseline under its
    default name in more than the attention layout and the budget."""
    if not (_default_name(arm) and _default_name(baseline)):
        return
    differ = differences(arm.runs[0], baseline.runs[0], ARM_SETTINGS)
    if differ:
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
    for run in arm.runs:
        twin = twins.get(run.seed)
        if (
            twin is not None
            and not differences(run, twin, ("arm",))
            and all(run.settings.get(key) == twin.settings.get(key) for key in NUMERICS)
        ):
            free = max(arm.seeds + baseline.seeds) + 1
            raise UserError(
                f"{run.path} (arm {arm.name}, seed {run.seed}) is the baseline's run {twin.path} again: the same "
                f"settings under the same seed train the same model, so it is no independent sample; move it out of "
                f"the sweep directory and run arm {arm.name} under seeds the baseline did not run (seed={free})"
            )


def changes(arm: Arm, baseline: Arm) -> str:
    """What an arm changes besides its layout and budget, e.g. 'optim.learning_rate 0.001 (baseline 0.002)'."""
    differ = differences(arm.runs[0], baseline.runs[0], ARM_SETTINGS)
    return ", ".join(
        f"{key} {_shown(key, mine)} (baseline {_shown(key, theirs)})" for key, (mine, theirs) in differ.items()
    )


def _default_name(arm: Arm) -> bool:
    return arm.name == f"kv{arm.config.n_kv_head}"


def _listed(differ: dict[str, tuple[Any, Any]]) -> str:
    return ", ".join(f"{key} ({_shown(key, mine)} and {_shown(key, theirs)})" for key, (mine, theirs) in differ.items())


def _shown(key: str, value: Any) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text[:SHOWN_CHARS] + "..." if key.startswith("tokenizer.") and len(text) > SHOWN_CHARS else text
