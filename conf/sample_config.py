"""SampleConfig: the typed schema of conf/sample.yaml, the settings of sample.py."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Optional

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from conf import one_line_errors
from model import WEIGHT_FORMATS, Sampling

DTYPES = ("auto", "fp32", "bf16", "fp16")
DECODE = ("eager", "graph")  # model.DECODE_MODES less "static", which is for checking


@dataclass
class SampleConfig:
    checkpoint: Optional[str] = None  # a checkpoint or run directory; None: the newest run's latest
    runs_root: str = "runs"
    prompt: str = ""  # text, FILE:path, or - for standard input; empty: start from <|endoftext|>
    num_samples: int = 1
    max_new_tokens: int = 256
    temperature: float = 0.8
    top_k: Optional[int] = 200
    top_p: float = 1.0
    seed: Optional[int] = 1337
    stop: list[str] = field(default_factory=list)
    device: str = "auto"
    dtype: str = "auto"
    weights: str = "fp32"
    decode: str = "eager"
    json: bool = False

    def __post_init__(self) -> None:
        if self.runs_root == "":
            raise ValueError("runs_root is empty: give a directory, or leave it unset")
        for name in ("num_samples", "max_new_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.sampling = Sampling(self.temperature, self.top_k, self.top_p, self.seed)  # checks all four
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}")
        for name, allowed in (("dtype", DTYPES), ("weights", WEIGHT_FORMATS), ("decode", DECODE)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")


def load_sample_config(cfg: DictConfig) -> SampleConfig:
    """The composed config as a validated SampleConfig (ValueError naming the setting)."""
    with one_line_errors():
        values = OmegaConf.to_container(cfg, resolve=True)
    known = [f.name for f in fields(SampleConfig)]
    unknown = sorted(set(values) - set(known))
    if unknown:  # Hydra lets `+key=...` past the schema
        raise ValueError(f"{unknown[0]} is not a setting of sample.py; known: {', '.join(known)}")
    return SampleConfig(**values)


ConfigStore.instance().store(name="sample_schema", node=SampleConfig)
