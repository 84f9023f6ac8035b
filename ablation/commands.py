"""The train.py command that adds seeds to an arm of a sweep, rebuilt from its runs' files:
composing a run's config-group choices (groups.yaml) and comparing leaf by leaf with its
resolved settings (config.yaml) gives what it changed on top of them; those, new seeds and
the sweep directory make a command whose runs join the same arm of the same sweep."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from ablation.runs import Arm, flatten
from conf import CONF_DIR
from run.run_dir import group_choices

# What differs from run to run, or would make a run anything but new; and model.vocab_size, recorded from
# the tokenizer (or the weights), which sets it whatever a command says.
NOT_CARRIED = {"seed", "out_dir", "resume", "model.vocab_size"}


def _composed(overrides: list[str]) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """train.yaml plus overrides: the resolved settings and the unresolved ones (flattened
    to dotted keys), and the group choices."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="train", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)  # ${hydra:sweep.dir} resolves as in a sweep's job
    choices = group_choices()
    settings = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    return flatten(OmegaConf.to_container(settings, resolve=True)), flatten(OmegaConf.to_container(settings)), choices


def _value(value: Any) -> str:
    """A value as Hydra's override grammar reads it back."""
    text = "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    return f"'{text}'" if any(c in text for c in " ,=[]{}()'\"$\\") else text


def arm_overrides(arm: Arm, sweep_dir: Path) -> list[str]:
    """The overrides that, with the arm's group choices, give its first run's settings (but NOT_CARRIED),
    less those that follow from the others, the seed and the sweep directory by interpolation
    (arm: kv${model.n_kv_head}, an uptraining run's model_path: ${hydra:sweep.dir}/mha_seed${seed})."""
    run = arm.runs[0]
    groups = run.groups
    base = [f"experiment={groups['experiment']}"] if groups.get("experiment") else []
    chosen = _composed(base)[2]
    wanted = {k: v for k, v in groups.items() if k != "experiment" and v is not None and chosen.get(k) != v}
    base += [f"{'' if k in chosen else '+'}{k}={v}" for k, v in wanted.items()]  # +: a group the defaults lack
    composed, unresolved, _ = _composed(base)
    settings = flatten(run.settings)
    changed = {k: v for k, v in settings.items() if k not in NOT_CARRIED and composed.get(k, object()) != v}
    derived = {k for k in changed if "${" in str(unresolved.get(k, ""))}
    if derived:
        rest = [f"{k}={_value(v)}" for k, v in changed.items() if k not in derived]
        implied = _composed(base + rest + [f"seed={run.seed}", f"hydra.sweep.dir={_value(str(sweep_dir))}"])[0]
        changed = {k: v for k, v in changed.items() if k not in derived or implied.get(k) != v}
    return base + [f"{k}={_value(v)}" for k, v in changed.items()]


def _seeds(first: int, count: int) -> str:
    return ",".join(map(str, range(first, first + count))) if count <= 6 else f"'range({first},{first + count})'"


def add_seeds_commands(targets: list[tuple[Arm, int]], sweep_dir: Path) -> list[str]:
    """Commands that give each arm its target number of seeds (new ones after its highest);
    arms that need the same new seeds and differ in one setting share a command."""
    pending: dict[tuple, list[list[str]]] = {}
    for arm, seeds in targets:
        missing = seeds - len(arm.runs)
        if missing > 0:
            pending.setdefault((max(arm.seeds) + 1, missing), []).append(arm_overrides(arm, sweep_dir))
    return [
        f"python train.py -m {' '.join(overrides)} seed={_seeds(first, count)} hydra.sweep.dir={_value(str(sweep_dir))}"
        for (first, count), override_lists in pending.items()
        for overrides in _merged(override_lists)
    ]


def _merged(override_lists: list[list[str]]) -> list[list[str]]:
    """One sweep over the values of the single override where all the lists differ, if they
    differ in exactly one at the same place; else the lists as they are."""
    if len(override_lists) < 2 or len({len(o) for o in override_lists}) > 1:
        return override_lists
    differing = [i for i, column in enumerate(zip(*override_lists)) if len(set(column)) > 1]
    keys = {o[differing[0]].split("=", 1)[0] for o in override_lists} if len(differing) == 1 else set()
    if len(keys) != 1:
        return override_lists
    i, key = differing[0], keys.pop()
    values = ",".join(o[i].split("=", 1)[1] for o in override_lists)
    return [override_lists[0][:i] + [f"{key}={values}"] + override_lists[0][i + 1 :]]
