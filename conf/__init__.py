"""Typed schemas for the YAML files in this directory.

Hydra merges every YAML file into these dataclasses, so a misspelt key or a
value of the wrong type fails at composition time with Hydra's own message.
The model's values are then checked again, against its rules, when
`GPTConfig(**cfg.model)` is built, before anything heavy happens.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TypeVar
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


T = TypeVar("T")


def build_section(cfg: DictConfig, section: str, cls: type[T]) -> T:
    """cfg.<section> as a validated `cls` instance.

    Raises ValueError naming the field: for a key `cls` does not have (Hydra lets
    `+section.key=...` through the schema) and for any rule `cls` checks itself.
    """
    values = OmegaConf.to_container(cfg[section], resolve=True)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(
            f"{section}.{unknown[0]} is not a setting of {cls.__name__}; known: {', '.join(sorted(known))}"
        )
    return cls(**values)


def build_model_config(cfg: DictConfig) -> GPTConfig:
    """The validated GPTConfig of a composed config."""
    return build_section(cfg, "model", GPTConfig)


def model_preset(name: str, *overrides: str) -> GPTConfig:
    """A model preset from conf/model/ as a GPTConfig, without running an app.

    `model_preset("gpt2", "model/attention=mqa")` or `model_preset("nano", "model.n_kv_head=2")`:
    overrides use the same syntax as the command line.
    """
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="train", overrides=[f"model={name}", *overrides])
    return build_model_config(cfg)


register_configs()
