"""The runs of a sweep (run directories at any depth; one without a checkpoint is named and
left out), grouped into Arms: runs sharing a model shape (layers, width, query heads and the
block) and an `arm` setting (for runs that predate it, the directory name less `_seed<N>`).
Within a shape the arms are compared with a baseline; runs of two blocks never are."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

import model.config
from model import GPT, GPTConfig
from run.checkpoints import CHECKPOINTS, Checkpoint, CheckpointError, find_checkpoint, has_checkpoint, load_checkpoint
from run.load import load_model
from run.metrics import METRICS, read_metrics
from run.run_dir import RUN_CONFIG, RUN_GROUPS, logged_a_save, read_run_yaml


@dataclass
class Run:
    path: Path
    checkpoint: Checkpoint
    settings: dict[str, Any]  # the run's config.yaml
    metrics: list[dict]
    groups: dict[str, Any] = field(default_factory=dict)  # its groups.yaml: recipe, model, data... (empty if none)

    @property
    def seed(self) -> int:
        return int(self.settings["seed"])

    @property
    def arm(self) -> str:
        return self.settings.get("arm") or re.sub(r"_seed\d+$", "", self.path.name)

    @property
    def evals(self) -> list[dict]:
        return [r for r in self.metrics if r["kind"] == "eval"]

    @property
    def final(self) -> dict:
        return self.evals[-1]

    @property
    def uptrained_from(self) -> str | None:  # the run an uptraining run started from (init_from=checkpoint)
        return self.settings.get("model_path") if self.settings.get("init_from") == "checkpoint" else None

    def model(self, device: torch.device) -> GPT:  # for inference on device, in fp32
        return load_model(self.checkpoint, None, device, torch.float32)[0]


@dataclass
class Arm:
    name: str
    runs: list[Run]  # sorted by seed
    pretraining_tokens: int = 0  # an uptrained arm's source-run tokens, counted into its total

    @property
    def config(self) -> GPTConfig:
        return self.runs[0].checkpoint.model_config

    @property
    def seeds(self) -> list[int]:
        return [r.seed for r in self.runs]

    @property
    def shape(self) -> Shape:
        return shape_of(self.config)

    @property
    def uptrained(self) -> bool:
        return self.runs[0].uptrained_from is not None

    @property
    def matched_flops(self) -> bool:  # trained with match_mha_flops: as many training FLOPs as the MHA model
        return all(r.settings.get("match_mha_flops") for r in self.runs)

    @property
    def label(self) -> str:
        layout = layout_name(self.config)
        return layout if self.name == f"kv{self.config.n_kv_head}" else f"{self.name}: {layout}"

    @cached_property
    def params(self) -> int:
        return GPT.shapes_only(self.config).num_params()

    @cached_property
    def non_embedding_params(self) -> int:
        return GPT.shapes_only(self.config).num_params(exclude_embeddings=True)

    @cached_property
    def flops_per_token(self) -> float:
        return GPT.shapes_only(self.config).flops_per_token()

    def finals(self, metric: str = "val_loss") -> list[float]:
        return [r.final[metric] for r in self.runs]

    def at_tokens(self, tokens: int, metric: str = "val_loss") -> list[float] | None:
        """Each seed's evaluation at `tokens` total training tokens, or None if a run has none there."""
        values = []
        for run in self.runs:
            match = [r[metric] for r in run.evals if r["tokens"] + self.pretraining_tokens == tokens]
            if not match:
                return None
            values.append(match[0])
        return values


def layout_name(config: GPTConfig) -> str:
    return f"{config.attention_kind} ({config.n_kv_head} kv heads)"


Shape = tuple[int, int, int, str]  # layers, width, query heads, block
GPT2_BLOCK, LLAMA_BLOCK = "GPT-2 block", "Llama block"
BLOCK_NAMES = {"gpt2": GPT2_BLOCK, "llama": LLAMA_BLOCK}  # model.config.BLOCKS' presets ("<name> block" for others)


def shape_of(config: GPTConfig) -> Shape:
    return config.n_layer, config.n_embd, config.n_head, block_name(config)


def block_name(config: GPTConfig) -> str:
    """'GPT-2 block', 'Llama block', '<name> block' for another preset of BLOCKS, or a block of no preset
    by its settings ('position=rope, norm=layernorm, ...')."""
    for preset, wanted in model.config.BLOCKS.items():
        if all(getattr(config, key) == value for key, value in wanted.items()):
            return BLOCK_NAMES.get(preset, f"{preset} block")
    named = dict.fromkeys(key for block in model.config.BLOCKS.values() for key in block)  # every block setting, once
    return ", ".join(f"{key}={getattr(config, key)}" for key in named)


def shape_order(shape: Shape) -> tuple[int, bool, str]:
    """Smallest first; at one size, GPT-2's block first."""
    return shape[0] * shape[1], shape[3] != GPT2_BLOCK, shape[3]


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """Nested settings as one level of dotted keys: {"optim.learning_rate": 0.002, ...}."""
    leaves = {}
    for key, value in tree.items():
        leaves |= flatten(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value}
    return leaves


def shape_name(shape: Shape) -> str:
    return f"{size_name(shape)}, {shape[3]}"


def size_name(shape: Shape) -> str:
    return f"{shape[0]} layers x {shape[1]} dims, {shape[2]} query heads"


@dataclass
class Sweep:
    runs: list[Run]  # the runs with a checkpoint
    left_out: list[str]  # "<run directory>: why", for each one under the sweep that has none


def read_sweep(sweep_dir: Path) -> Sweep:
    """Every run directory under sweep_dir: its run, or a line saying why it is left out (a `latest`
    link that leads nowhere falls back to the newest complete checkpoint, as resume does)."""
    runs, left_out = [], []
    found = {p.parent for name in (RUN_CONFIG, CHECKPOINTS) for p in sweep_dir.glob(f"**/{name}")}
    # not those inside a checkpoints/ (each checkpoint holds a config.yaml) or Hydra's .hydra/
    for run_dir in sorted(d for d in found if not {CHECKPOINTS, ".hydra"} & set(d.relative_to(sweep_dir).parts)):
        if not has_checkpoint(run_dir):
            why = (
                f"its checkpoints are gone (its {METRICS} has evaluations past step 0, each followed by a save)"
                if logged_a_save(run_dir)
                else "it has no checkpoint: the run stopped before its first, or is still running"
            )
            left_out.append(f"{run_dir}: {why}; left out")
            continue
        if not (run_dir / RUN_CONFIG).is_file():
            raise CheckpointError(f"{run_dir} has checkpoints but no {RUN_CONFIG}: it is not a run of train.py")
        try:
            path = find_checkpoint(run_dir, sweep_dir)
        except CheckpointError as err:  # a `latest` that leads nowhere, and no complete checkpoint left
            left_out.append(f"{run_dir}: {err}; left out")
            continue
        runs.append(_read_run(run_dir, load_checkpoint(path)))
    if not runs:
        reasons = "".join(f"; {line}" for line in left_out)
        raise CheckpointError(f"no run directories with checkpoints under {sweep_dir}{reasons}")
    return Sweep(runs, left_out)


def _read_run(run_dir: Path, checkpoint: Checkpoint) -> Run:
    settings = read_run_yaml(run_dir / RUN_CONFIG, run_dir)
    if not (run_dir / METRICS).is_file():
        raise CheckpointError(f"{run_dir} has no {METRICS}: it is needed to compare the run")
    metrics = read_metrics(run_dir)
    if not any(r["kind"] == "eval" for r in metrics):
        raise CheckpointError(f"{run_dir / METRICS} has no evaluation records")
    groups = read_run_yaml(run_dir / RUN_GROUPS, run_dir, may_be_empty=True) if (run_dir / RUN_GROUPS).is_file() else {}
    return Run(run_dir, checkpoint, settings, metrics, groups)


def group_arms(runs: list[Run]) -> list[Arm]:
    """Arms ordered by shape (smallest first, GPT-2's block first), then MHA first and
    fewer key/value heads after, scratch before uptrained, then by name."""
    by_key: dict[tuple, list[Run]] = {}
    for run in runs:
        by_key.setdefault((shape_of(run.checkpoint.model_config), run.arm), []).append(run)
    arms = []
    for (_, name), members in by_key.items():
        members.sort(key=lambda r: r.seed)
        seeds = [r.seed for r in members]
        if len(set(seeds)) != len(seeds):
            raise CheckpointError(f"arm {name} has two runs with one seed: {', '.join(str(r.path) for r in members)}")
        arms.append(Arm(name, members, pretraining_tokens=_source_tokens(members[0], runs)))
    return sorted(arms, key=lambda a: (shape_order(a.shape), -a.config.n_kv_head, a.uptrained, a.name))


def _source_tokens(run: Run, runs: list[Run]) -> int:
    """The tokens of the run an uptraining run started from (it, or one of its checkpoints); 0 for a run
    from scratch, or a source outside the sweep (tokens counted from the conversion on)."""
    source = None if run.uptrained_from is None else Path(run.uptrained_from).resolve()
    return next((o.final["tokens"] for o in runs if source and o.path.resolve() in (source, *source.parents)), 0)
