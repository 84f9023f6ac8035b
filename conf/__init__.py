"""Typed schemas for the YAML files in this directory, and the one place each setting lives.

A field holds a setting's type, its default, its rule (`setting(default, rule)`, see rules.py) and, in the docstring
under it, its one-line documentation, from which `python -m conf` writes docs/configuration.md. train.yaml only
chooses presets, and a preset only sets what it changes. Hydra merges the YAML files and command-line overrides
(conf/cli.py has refused those Hydra would) into these dataclasses; `load_config` builds them, each checking its
rules, and raises one ValueError (a SettingsError) naming every bad setting, a line each, before any work starts.
"""

from __future__ import annotations

import contextlib
import typing
from collections.abc import Iterator
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from data.config import DataConfig
from model import GPTConfig
from rules import NOT_EMPTY, SEED, above, all_problems, at_least, between, check_rules, matching, one_of, setting

CONF_DIR = Path(__file__).resolve().parent
HYDRA_DETAILS = ("full_key:", "object_type=", "reference_type=")  # lines of Hydra's errors one_line_errors leaves out
WHOLE_VAL = ("never", "final", "always")
MUON_TORCH = "2.9"  # the first torch release with torch.optim.Muon
# The precisions train.py, sample.py and downstream.py compute in, and the torch dtype each names; auto is resolved
# for the device when it is known (run/runtime.py resolve_precision).
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PRECISIONS = ("auto", *DTYPES)
PRECISION = one_of(*PRECISIONS)
# A device as it may be spelt; whether it is there is checked where it is used (run/runtime.py resolve_device).
DEVICE = matching(r"auto|cpu|cuda(:(0|[1-9][0-9]*))?", "auto, cpu, cuda or cuda:N")


@dataclass
class OptimConfig:
    """AdamW, or Muon for the blocks' hidden matrices with AdamW for the rest (`name`), with linear
    warmup and a cosine or warmup-stable-decay schedule: every learning rate follows it, scaled to its own peak."""

    name: str = setting("adamw", one_of("adamw", "muon"))
    """adamw: AdamW for every parameter; muon: Muon for the blocks' linear weights, AdamW for embeddings, head, norms, biases."""
    learning_rate: float = setting(2e-3, above(0))
    """AdamW's peak learning rate, reached after warmup_iters."""
    min_lr: float = setting(2e-4, at_least(0))
    """AdamW's learning rate at the end of the decay (at most learning_rate); Muon's ends at the same fraction of muon_lr."""
    warmup_iters: int = setting(100, at_least(0))
    """Optimizer steps of linear warmup from 0."""
    decay_iters: int | None = setting(None, at_least(1))
    """The step where min_lr is reached; null: max_iters."""
    cooldown_frac: float | None = setting(None, between(0, 1, "(]"))
    """null: cosine decay from the peak to min_lr; a fraction: warmup-stable-decay, the peak held, then a straight line to min_lr over this last share of decay_iters."""
    weight_decay: float = setting(0.1, at_least(0))
    """AdamW's decoupled weight decay, on matrices and embeddings (not biases or norms)."""
    beta1: float = setting(0.9, between(0, 1, "[)"))
    """AdamW's first-moment decay."""
    beta2: float = setting(0.95, between(0, 1, "[)"))
    """AdamW's second-moment decay."""
    grad_clip: float = setting(1.0, at_least(0))
    """Largest global gradient norm; 0 turns clipping off."""
    muon_lr: float = setting(0.01, above(0))
    """name=muon: Muon's peak learning rate (before muon_adjust_lr's factor); 0.01 was best for the mini model (docs/training.md)."""
    muon_momentum: float = setting(0.95, between(0, 1, "[)"))
    """name=muon: Muon's momentum (Nesterov)."""
    muon_weight_decay: float = setting(0.0, at_least(0))
    """name=muon: Muon's decoupled weight decay on the hidden matrices (each step multiplies them by 1 - lr * this)."""
    muon_adjust_lr: str = setting("original", one_of("original", "match_rms_adamw"))
    """name=muon: the update's per-shape scale: original (sqrt(max(1, rows/cols))) or match_rms_adamw (0.2 sqrt(max(rows, cols)))."""

    def __post_init__(self) -> None:
        check_rules(self, "optim.", self._conflicts)

    def _conflicts(self) -> Iterator[str]:
        if self.min_lr > self.learning_rate:
            yield f"optim.min_lr ({self.min_lr}) must not exceed optim.learning_rate ({self.learning_rate})"
        if self.name == "muon" and not hasattr(torch.optim, "Muon"):
            yield (
                f"optim.name=muon needs torch >= {MUON_TORCH} (torch.optim.Muon); this is torch "
                f"{torch.__version__}: upgrade torch, or use optim.name=adamw"
            )


@dataclass
class WandbConfig:
    """Weights & Biases logging: off unless asked for, and never prompting for a login."""

    mode: str = setting("disabled", one_of("disabled", "offline", "online"))
    """disabled, offline (a local wandb directory to sync later) or online."""
    project: str = "gptlab"
    """The wandb project."""
    name: str | None = None
    """The wandb run's name; null: the run directory's name."""
    group: str | None = None
    """A wandb group, to see related runs side by side."""

    def __post_init__(self) -> None:
        check_rules(self, "logging.wandb.")


@dataclass
class LoggingConfig:
    """What a run reports while it trains, besides metrics.jsonl."""

    log_interval: int = setting(10, at_least(1))
    """Optimizer steps between train records."""
    progress: bool = True
    """A live progress bar on a terminal (plain lines otherwise)."""
    peak_flops: float | None = setting(None, above(0))
    """FLOP/s the MFU is measured against; null: a known GPU's table value, or measured on a CPU."""
    wandb: WandbConfig = setting(factory=WandbConfig)

    def __post_init__(self) -> None:
        check_rules(self, "logging.")


@dataclass
class CostConfig:
    """What the run's GPUs cost, for the estimate line (docs/training.md#what-a-run-will-cost)."""

    gpu_hour: float | None = setting(None, above(0))
    """The price of one GPU-hour (any currency): the estimate adds processes x hours x this; null: no cost."""

    def __post_init__(self) -> None:
        check_rules(self, "cost.")


@dataclass
class Config:
    """train.py's settings. `model` and `data` start from the presets train.yaml chooses."""

    model: GPTConfig = setting(factory=GPTConfig)
    data: DataConfig = setting(factory=DataConfig)
    optim: OptimConfig = setting(factory=OptimConfig)
    logging: LoggingConfig = setting(factory=LoggingConfig)
    cost: CostConfig = setting(factory=CostConfig)
    seed: int = setting(1337, SEED)
    """Seeds the weights, the batches' order and dropout: the same seed and settings give the same run."""
    seed_scope: str = setting("all", one_of("all", "weights", "data"))
    """all, weights or data: what `seed` varies (the other part uses seed 0): weights and dropout, or the batches' order."""
    max_iters: int = setting(600, at_least(0))
    """Optimizer steps; 0 evaluates the model (init_from or resume) and writes nothing."""
    estimate: bool = False
    """Time this run's steps on random tokens (no data prepared where the vocabulary is known), print its tokens, time, cost and peak memory, and exit writing nothing."""
    estimate_steps: int = setting(20, at_least(1))
    """estimate=true: the micro-batches timed, in whole optimizer steps, after 10 untimed ones (compilation, allocator warm-up)."""
    tokens_per_param: float | None = setting(None, above(0))
    """Replaces max_iters: steps giving each non-embedding parameter of the MHA model of this shape this many tokens."""
    match_mha_flops: bool = False
    """Scale max_iters so that a GQA/MQA model spends the training FLOPs of the MHA model of its shape."""
    arm: str | None = None
    """This run's name in an ablation: report.py groups runs by it."""
    batch_size: Any = setting(8, at_least(1).or_words("auto"))
    """Sequences per micro-batch (per process); auto (GPU, with tokens_per_step): the largest that fits, tried on the device."""
    grad_accum_steps: int | None = setting(None, at_least(1))
    """Micro-batches per optimizer step; null: 1, or what tokens_per_step makes (set one of the two, not both)."""
    tokens_per_step: int | None = setting(None, at_least(1))
    """Instead of grad_accum_steps: tokens per optimizer step over all processes, a multiple of batch_size * block_size * processes."""
    eval_interval: int = setting(200, at_least(1))
    """Optimizer steps between evaluations (and checkpoints)."""
    eval_batch_size: int | None = setting(None, at_least(1))
    """Windows per evaluation batch (eval_iters of them per split), run through the model a micro-batch at a time; null: the micro-batch."""
    eval_iters: int = setting(10, at_least(1))
    """Batches per split per evaluation: the same windows for every seed of a sweep."""
    eval_whole_val: str = setting("never", one_of(*WHOLE_VAL))
    """never, final or always: which evaluations cover the whole val split, every non-overlapping window."""
    device: str = setting("auto", DEVICE)
    """auto: CUDA when present, else the CPU."""
    precision: str = setting("auto", PRECISION)
    """What the forward pass computes in (weights and optimizer state stay fp32); auto: bf16 on CUDA that has it, else fp16; on a CPU, bf16 where it computes bf16 natively (avx512_bf16 or amx_bf16 among its flags), else fp32."""
    tf32: bool = True
    """CUDA: fp32 matmuls on TF32 tensor cores; false for true IEEE fp32."""
    compile: bool = False
    """torch.compile the model."""
    pad_vocab_to: int = setting(64, at_least(1))
    """Round the tokenizer's vocabulary up to a multiple of this (model.vocab_size)."""
    on_nonfinite: str = setting("stop", one_of("stop", "skip"))
    """What a step with a NaN or inf loss or gradient does: stop the run, or skip the update."""
    out_dir: str | None = setting(None, NOT_EMPTY)
    """The run directory; null: <runs_root>/<date>_<time>."""
    runs_root: str = setting("runs", NOT_EMPTY)
    """Where new runs' directories go, and where resume=true looks."""
    resume: str | None = None
    """true or latest (the newest run), a run directory or a checkpoint."""
    init_from: str = setting("scratch", one_of("scratch", "checkpoint", "hf"))
    """Where a new run's weights come from: scratch (random), checkpoint or hf (Hugging Face); from weights, the model (its block too) is theirs."""
    model_path: str | None = None
    """init_from=checkpoint: a run or checkpoint; init_from=hf: a directory or a Hub name."""
    keep_last: int = setting(3, at_least(1))
    """Step checkpoints kept besides the best one."""
    keep_state: str = setting("all", one_of("all", "latest"))
    """Which checkpoints keep state.pt (optimizer, scaler, RNG) besides weights: all, or the latest only."""

    def __post_init__(self) -> None:
        check_rules(self, "", self._conflicts)

    def _conflicts(self) -> Iterator[str]:
        if self.model.vocab_size != GPTConfig.vocab_size:  # it would be overwritten without a word
            yield (
                f"model.vocab_size={self.model.vocab_size}: train.py sets it from the tokenizer "
                "(padded to a multiple of pad_vocab_to); leave it unset"
            )
        if self.model.eot_id is not None:  # likewise
            yield f"model.eot_id={self.model.eot_id}: train.py sets it from the tokenizer; leave it unset"
        if self.init_from != "scratch" and not self.model_path:
            yield f"init_from={self.init_from} needs model_path (a directory, or a Hub name for hf)"
        if self.estimate and (self.resume or self.max_iters == 0):
            yield "estimate=true times the steps of a new run: leave resume unset and max_iters above 0"
        if self.tokens_per_step is not None and self.grad_accum_steps is not None:  # one would be ignored
            yield (
                f"grad_accum_steps={self.grad_accum_steps} and tokens_per_step={self.tokens_per_step} both set the "
                "micro-batches per step (tokens_per_step / (batch_size x block_size x processes)): set only one, "
                "grad_accum_steps=null or tokens_per_step=null"
            )
        if self.batch_size == "auto" and self.tokens_per_step is None:
            yield (
                "batch_size=auto keeps the tokens per step through accumulation, so it needs tokens_per_step "
                "(e.g. tokens_per_step=524288); or give batch_size a number"
            )
        if self.batch_size == "auto" and self.max_iters == 0 and self.eval_batch_size is None:
            yield "max_iters=0 only evaluates, so batch_size=auto has no step to try: set eval_batch_size (e.g. 32)"
        if self.init_from == "scratch" and self.model_path:  # it would be ignored without a word
            yield (
                f"model_path={self.model_path} is read only with init_from=checkpoint or hf, and "
                "init_from is scratch: set init_from too, or leave model_path unset"
            )

    @property
    def weights_seed(self) -> int:
        """Seeds the initial weights and dropout."""
        return 0 if self.seed_scope == "data" else self.seed

    @property
    def batches_seed(self) -> int:
        """Seeds the order of the training batches."""
        return 0 if self.seed_scope == "weights" else self.seed


def load_config(cfg: DictConfig, schema: type = Config, prefix: str = "") -> Any:
    """The composed config (or its section `prefix`) as validated dataclasses of `schema` (else a SettingsError)."""
    _reject_unknown_keys(cfg, schema, prefix)
    with one_line_errors(), all_problems():
        return OmegaConf.to_object(cfg)


def read_settings(schema: type, values: Any) -> Any:
    """Settings read from a file (a checkpoint's config.yaml) as the validated dataclass `schema`, typed by merging."""
    with one_line_errors(), all_problems():
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), values))


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """Hydra's and OmegaConf's errors (an interpolation that does not resolve, a preset a YAML file names that does
    not exist) as a one-line ValueError: the message and the first line of its cause, without the config search
    path Hydra lists after a missing preset."""
    try:
        yield
    except (HydraException, OmegaConfBaseException) as err:
        text = str(err).split("Config search path:")[0]
        lines = [line for line in text.splitlines() if not line.strip().startswith(HYDRA_DETAILS)]
        if err.__cause__ is not None:
            lines.append(": " + str(err.__cause__).splitlines()[0])
        where = f" (at {err.full_key})" if getattr(err, "full_key", None) else ""
        raise ValueError(" ".join(" ".join(lines).split()) + where) from err


def model_preset(name: str, *overrides: str) -> GPTConfig:
    """A model preset from conf/model/ as a GPTConfig, without an app: `model_preset("nano", "model.n_kv_head=2")`
    (overrides as on the command line), with recipe=gpt2 unless an override chooses another recipe or block."""
    recipe = [] if any(o.startswith("recipe=") for o in overrides) else ["recipe=gpt2"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="train", overrides=[f"model={name}", *recipe, *overrides])
    return load_config(cfg.model, GPTConfig, prefix="model.")


def _reject_unknown_keys(node: Any, schema: type, prefix: str) -> None:
    """Hydra lets `+section.key=...` through the schema on purpose; we do not."""
    known, hints = [f.name for f in fields(schema)], typing.get_type_hints(schema)
    for key in node:
        if key not in known:
            raise ValueError(f"{prefix}{key} is not a setting of {schema.__name__}; known: {', '.join(known)}")
        if is_dataclass(hints[key]) and node[key] is not None:
            _reject_unknown_keys(node[key], hints[key], prefix=f"{prefix}{key}.")


ConfigStore.instance().store(name="config_schema", node=Config)
