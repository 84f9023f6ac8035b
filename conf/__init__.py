"""Typed schemas for the YAML files in this directory.

Hydra merges every YAML file and command-line override into these dataclasses;
conf/cli.py has already refused, in one line, any command-line override Hydra would
refuse (a misspelt key, a value of the wrong type, a missing preset). `load_config`
then builds the dataclasses, which check their own rules (GPTConfig, DataConfig and
the ones below) and raise a ValueError naming the field, before any data or model
work starts.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from data.config import DataConfig
from model import GPTConfig

CONF_DIR = Path(__file__).resolve().parent
NONFINITE_POLICIES = ("stop", "skip")
WHOLE_VAL = ("never", "final", "always")


@dataclass
class OptimConfig:
    """AdamW with linear warmup and cosine decay to min_lr."""

    learning_rate: float = 6e-4
    min_lr: float = 6e-5
    warmup_iters: int = 100
    decay_iters: Optional[int] = None  # the step where min_lr is reached; None means max_iters
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # max global gradient norm; 0 turns clipping off

    def __post_init__(self) -> None:
        _positive("optim.learning_rate", self.learning_rate)
        _at_least("optim.min_lr", self.min_lr, 0)
        if self.min_lr > self.learning_rate:
            raise ValueError(f"optim.min_lr ({self.min_lr}) must not exceed optim.learning_rate ({self.learning_rate})")
        _at_least("optim.warmup_iters", self.warmup_iters, 0)
        if self.decay_iters is not None:
            _positive("optim.decay_iters", self.decay_iters)
        _at_least("optim.weight_decay", self.weight_decay, 0)
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"optim.{name} must be in [0, 1), got {getattr(self, name)!r}")
        _at_least("optim.grad_clip", self.grad_clip, 0)


@dataclass
class WandbConfig:
    mode: str = "disabled"  # disabled | offline | online; never prompts for a login
    project: str = "gptlab"
    name: Optional[str] = None  # None: the run directory's name
    group: Optional[str] = None

    def __post_init__(self) -> None:
        if self.mode not in ("disabled", "offline", "online"):
            raise ValueError(f"logging.wandb.mode must be disabled, offline or online, got {self.mode!r}")


@dataclass
class LoggingConfig:
    log_interval: int = 10  # optimizer steps between train records
    progress: bool = True  # live progress bar on a terminal (plain lines otherwise)
    peak_flops: Optional[float] = None  # for MFU; None: known GPU table, or measured on CPU
    wandb: WandbConfig = field(default_factory=WandbConfig)

    def __post_init__(self) -> None:
        _positive("logging.log_interval", self.log_interval)
        if self.peak_flops is not None:
            _positive("logging.peak_flops", self.peak_flops)


@dataclass
class Config:
    model: GPTConfig = field(default_factory=GPTConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    seed: int = 1337
    max_iters: int = 2000  # optimizer steps; 0 evaluates the model (init_from or resume) and writes nothing
    # Derived budgets (training/budget.py): steps giving each non-embedding parameter of the
    # MHA model of this shape this many tokens, replacing max_iters; and/or max_iters scaled
    # so that a GQA/MQA model spends the MHA model's training FLOPs.
    tokens_per_param: Optional[float] = None
    match_mha_flops: bool = False
    arm: Optional[str] = None  # this run's name in an ablation: report.py groups runs by it
    batch_size: int = 12  # sequences per micro-batch (per process)
    grad_accum_steps: int = 1  # micro-batches per optimizer step
    # Alternative to grad_accum_steps: tokens per optimizer step over all processes;
    # must be a multiple of batch_size * block_size * world_size.
    tokens_per_step: Optional[int] = None
    eval_interval: int = 250  # optimizer steps between evaluations (and checkpoints)
    eval_iters: int = 20  # batches per split per evaluation, the same windows for every seed
    eval_whole_val: str = "never"  # never | final | always: which evaluations cover the whole val split instead
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    precision: str = "auto"  # auto | fp32 | bf16 | fp16
    tf32: bool = True  # CUDA: fp32 matmuls on TF32 tensor cores; false for true IEEE fp32
    compile: bool = False  # torch.compile the model
    pad_vocab_to: int = 64  # round the tokenizer's vocabulary up to a multiple of this
    on_nonfinite: str = "stop"  # stop | skip: what a step with a NaN/inf loss or gradient does
    out_dir: Optional[str] = None  # the run directory; None: <runs_root>/<date>_<time>
    runs_root: str = "runs"
    resume: Optional[str] = None  # true/latest (newest run), a run directory or a checkpoint
    init_from: str = "scratch"  # scratch | checkpoint | hf: where a new run's weights come from
    model_path: Optional[str] = None  # init_from=checkpoint: a run or checkpoint; hf: a directory or Hub name
    keep_last: int = 3  # step checkpoints kept besides the best one
    keep_state: str = "all"  # all | latest: which checkpoints keep state.pt (optimizer, scaler, RNG) besides weights

    def __post_init__(self) -> None:
        _at_least("max_iters", self.max_iters, 0)
        if isinstance(self.seed, bool) or not 0 <= self.seed < 2**32:  # what numpy's seeding takes
            raise ValueError(f"seed must be an integer in [0, 2**32 - 1], got {self.seed!r}")
        for name in ("runs_root", "out_dir"):  # empty would mean the current directory
            if getattr(self, name) == "":
                raise ValueError(f"{name} is empty: give a directory, or leave it unset")
        for name in ("batch_size", "grad_accum_steps", "eval_interval", "eval_iters", "pad_vocab_to", "keep_last"):
            _positive(name, getattr(self, name))
        for name in ("tokens_per_step", "tokens_per_param"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        if self.init_from not in ("scratch", "checkpoint", "hf"):
            raise ValueError(f"init_from must be scratch, checkpoint or hf, got {self.init_from!r}")
        if self.init_from != "scratch" and not self.model_path:
            raise ValueError(f"init_from={self.init_from} needs model_path (a directory, or a Hub name for hf)")
        if self.init_from == "scratch" and self.model_path:  # it would be ignored without a word
            raise ValueError(f"model_path={self.model_path} is read only with init_from=checkpoint or hf, and "
                             "init_from is scratch: set init_from too, or leave model_path unset")
        if self.keep_state not in ("all", "latest"):
            raise ValueError(f"keep_state must be all or latest, got {self.keep_state!r}")
        if self.eval_whole_val not in WHOLE_VAL:
            raise ValueError(f"eval_whole_val must be one of {WHOLE_VAL}, got {self.eval_whole_val!r}")
        if self.on_nonfinite not in NONFINITE_POLICIES:
            raise ValueError(f"on_nonfinite must be one of {NONFINITE_POLICIES}, got {self.on_nonfinite!r}")


def register_configs() -> None:
    ConfigStore.instance().store(name="config_schema", node=Config)


def load_config(cfg: DictConfig) -> Config:
    """The composed config as validated dataclasses (ValueError naming the field)."""
    _reject_unknown_keys(cfg, Config, prefix="")
    with one_line_errors():
        return OmegaConf.to_object(cfg)


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """Hydra's and OmegaConf's errors (an interpolation that does not resolve, a preset a
    YAML file names that does not exist) as a one-line ValueError: the message and the first
    line of its cause, without the config search path Hydra lists after a missing preset."""
    try:
        yield
    except (HydraException, OmegaConfBaseException) as err:
        lines = [line for line in str(err).split("Config search path:")[0].splitlines()
                 if not line.strip().startswith(("full_key:", "object_type=", "reference_type="))]
        if err.__cause__ is not None:
            lines.append(": " + str(err.__cause__).splitlines()[0])
        where = f" (at {err.full_key})" if getattr(err, "full_key", None) else ""
        raise ValueError(" ".join(" ".join(lines).split()) + where) from err


def build_model_config(cfg: DictConfig) -> GPTConfig:
    """Just the validated GPTConfig of a composed config."""
    _reject_unknown_keys(cfg.model, GPTConfig, prefix="model.")
    return GPTConfig(**OmegaConf.to_container(cfg.model, resolve=True))


def model_preset(name: str, *overrides: str) -> GPTConfig:
    """A model preset from conf/model/ as a GPTConfig, without running an app.

    `model_preset("gpt2", "model/attention=mqa")` or `model_preset("nano", "model.n_kv_head=2")`:
    overrides use the same syntax as the command line.
    """
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="train", overrides=[f"model={name}", *overrides])
    return build_model_config(cfg)


def _reject_unknown_keys(node: Any, schema: type, prefix: str) -> None:
    """Hydra lets `+section.key=...` through the schema on purpose; we do not."""
    known = {f.name: f for f in fields(schema)}
    for key in node:
        if key not in known:
            raise ValueError(f"{prefix}{key} is not a setting of {schema.__name__}; known: {', '.join(known)}")
        field_type = _dataclass_of(known[key])
        if field_type is not None and node[key] is not None:
            _reject_unknown_keys(node[key], field_type, prefix=f"{prefix}{key}.")


def _dataclass_of(f) -> type | None:
    default = f.default_factory() if callable(f.default_factory) else None
    return type(default) if is_dataclass(default) else None


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")


def _at_least(name: str, value: Any, low: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low:
        raise ValueError(f"{name} must be >= {low}, got {value!r}")


register_configs()
