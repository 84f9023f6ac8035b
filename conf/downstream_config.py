"""DownstreamConfig: the typed schema of conf/downstream.yaml, the settings of downstream.py."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from conf import DEVICE, PRECISION, load_config
from model import WEIGHT_FORMATS
from rules import NOT_EMPTY, at_least, check_rules, one_of, setting


@dataclass
class DownstreamConfig:
    """downstream.py's settings: `python downstream.py checkpoint=runs/<run> 'tasks=[hellaswag,arc_easy]'`."""

    checkpoint: str | None = None
    """A checkpoint or run directory (its latest checkpoint); null: the newest run's latest checkpoint."""
    runs_root: str = setting("runs", NOT_EMPTY)
    """Where the newest run is looked for."""
    tasks: list[str] = setting(factory=lambda: ["hellaswag"], rule=NOT_EMPTY)
    """lm-eval task (or group) names; the harness downloads each task's data once, from the Hub."""
    include_path: str | None = None
    """A directory of task YAML files of your own (lm-eval's local-file format), besides the harness's tasks."""
    num_fewshot: int | None = setting(None, at_least(0))
    """Examples put before each question; null: each task's own default (0 for hellaswag)."""
    limit: int | None = setting(None, at_least(1))
    """Evaluate only the first this many items of each task (a quick look, not a result); null: all."""
    batch_size: int = setting(8, at_least(1))
    """Sequences scored together."""
    device: str = setting("auto", DEVICE)
    """auto: CUDA when present, else the CPU."""
    precision: str = setting("fp32", PRECISION)
    """What the activations are computed in: fp32 (log-likelihoods as the harness's transformers model computes them), bf16 or fp16 (faster on a GPU), or auto (bf16 on CUDA that has it, else fp16; fp32 on a CPU)."""
    weights: str = setting("fp32", one_of(*WEIGHT_FORMATS))
    """fp32 (as trained, held in the activations' precision), bf16, or int8 (CPU only)."""

    def __post_init__(self) -> None:
        check_rules(self, "", self._conflicts)

    def _conflicts(self) -> Iterator[str]:
        if not self.tasks:
            yield "tasks is empty: name at least one lm-eval task, e.g. 'tasks=[hellaswag]'"


def load_downstream_config(cfg: DictConfig) -> DownstreamConfig:
    """The composed config as a validated DownstreamConfig (a SettingsError naming every bad setting)."""
    return load_config(cfg, DownstreamConfig)


ConfigStore.instance().store(name="downstream_schema", node=DownstreamConfig)
