"""Typed schemas for the YAML files in this directory.

Hydra merges every YAML file into these dataclasses, so a misspelt key or a
value of the wrong type fails at composition time with Hydra's own message.
The model's values are then checked again, against its rules, when
`GPTConfig(**cfg.model)` is built, before anything heavy happens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from model import GPTConfig

CONF_DIR = Path(__file__).resolve().parent


@dataclass
class Config:
    model: GPTConfig = field(default_factory=GPTConfig)
    seed: int = 1337


def register_configs() -> None:
    ConfigStore.instance().store(name="config_schema", node=Config)


def build_model_config(cfg: DictConfig) -> GPTConfig:
    """The validated GPTConfig of a composed config (raises ValueError naming the field)."""
    return GPTConfig(**OmegaConf.to_container(cfg.model, resolve=True))


register_configs()
