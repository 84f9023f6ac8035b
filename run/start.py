"""Starting a run, new or resumed, in the order train.py needs it; the data is prepared inside start_run, so a
new run claims its directory before a long prepare, and a rank lost during it says what the run leaves behind:

    spec = resolve_run(cfg)                   the config (a resume's own), checked once
    with start_run(spec, ranks, device) as run:   the run directory, made or reopened, and held
        ... prepare the data ...
        model, origin = build_model(...)      fresh, from init_from's weights, or a checkpoint's shape
        ... build the optimizer ...
        step, best, note = run.restore(...)   a resume's training state; then config.yaml, with the model built
"""

import contextlib
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from conf import Config, load_config
from data import Gpt2Tokenizer, Tokenizer
from data.tokenizer import GPT2_VOCAB_SIZE
from model import GPT
from run.checkpoints import Checkpoint, Checkpoints, has_checkpoint, load_weights
from run.distributed import Ranks, main_decides, peers_watched
from run.init_from import initial_model, refuse_contradictions, scratch_config
from run.run_dir import left_behind, new_run_dir, resolve_resume, run_lock, save_run_config
from system import Interrupted


@dataclass(frozen=True)
class RunSpec:
    config: Config
    settings: dict  # the same settings as plain values: what config.yaml and wandb record
    resume_from: Checkpoint | None  # the checkpoint a resume continues

    @property
    def block_size(self) -> int:
        """The context of the model about to be built (a new run's from init_from is cropped to it)."""
        return self.resume_from.model_config.block_size if self.resume_from else self.config.model.block_size


def resolve_run(cfg: DictConfig) -> RunSpec:
    """The run a composed config asks for (a resume's own config and checkpoint), its rules checked before any work."""
    cfg, resume_from = resolve_resume(cfg)
    return RunSpec(load_config(cfg), OmegaConf.to_container(cfg, resolve=True), resume_from)


@dataclass
class StartedRun:
    """A run whose directory this process holds (rank 0 as its one writer)."""

    spec: RunSpec
    run_dir: Path
    checkpoints: Checkpoints
    takeover: str  # a line when a new run took over a directory whose run stopped before its first checkpoint
    ranks: Ranks
    device: torch.device
    settings: dict = field(default_factory=dict)  # what config.yaml and wandb record: restore sets the model built

    def restore(
        self, model: GPT, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, config: Config
    ) -> tuple[int, float, str]:
        """The step, best val loss and a line to print: a resume's, restored before anything draws from the random
        streams, or a new run's (0, inf, ''). Rank 0 then records config.yaml, its model section the model built."""
        restored = (0, math.inf, "")
        if resume_from := self.spec.resume_from:
            restored = self.checkpoints.restore(resume_from, model, optimizer, scaler, config, self.ranks, self.device)
        self.settings = {**self.spec.settings, "model": asdict(model.config)}
        if self.ranks.is_main:
            save_run_config(self.run_dir, self.settings)
        return restored


@contextlib.contextmanager
def start_run(spec: RunSpec, ranks: Ranks, device: torch.device) -> Iterator[StartedRun]:
    """The run's directory, made (a new run's) or reopened (a resume's) and locked while the run writes; a rank
    that loses a peer, or a signal that stops the run at once, says what the run leaves behind."""
    resume_from = spec.resume_from
    # Only rank 0 chooses (a timestamp read on each rank could differ) and locks: one writer.
    run_dir = resume_from.run_dir if resume_from else main_decides(ranks, lambda: new_run_dir(spec.config))
    with contextlib.ExitStack() as held:
        takeover = main_decides(ranks, lambda: held.enter_context(run_lock(run_dir, new_run=resume_from is None)))
        held.enter_context(peers_watched(ranks, lambda: left_behind(run_dir)))
        checkpoints = Checkpoints(run_dir, keep_last=spec.config.keep_last, keep_state=spec.config.keep_state)
        try:
            yield StartedRun(spec, run_dir, checkpoints, takeover, ranks, device)
        except Interrupted as stop:  # what stopping at once leaves behind, and how to go on
            at_once = "stopped at once, without saving; " if has_checkpoint(run_dir) else ""
            stop.detail = f"{stop.signal}: {at_once}{left_behind(run_dir)}"
            raise


def build_model(
    config: Config, resume_from: Checkpoint | None, tokenizer: Tokenizer, device: torch.device
) -> tuple[GPT, str]:
    """The run's model and where its weights come from ('' for a fresh one, and a resume's: restore loads it)."""
    if resume_from and config.init_from != "scratch":
        model_config, initial_state = resume_from.model_config, None  # the imported shape, as saved
        refuse_contradictions(config.model, model_config, f"the checkpoint {resume_from.path}")
    else:
        model_config, initial_state = initial_model(config, tokenizer)
    model = GPT(model_config).to(device)
    if initial_state is None or resume_from:
        return model, ""
    load_weights(model, initial_state)
    return model, f"weights: init_from={config.init_from} {config.model_path} at context {model_config.block_size}"


def model_without_corpus(config: Config, device: torch.device) -> tuple[GPT, int] | None:
    """A new run's model and vocabulary size where both are known before the corpus is prepared (estimate=true):
    GPT-2's, and a trained BPE's data.vocab_size; None for characters and for a checkpoint's model on a BPE."""
    if config.data.tokenizer == "gpt2":
        return build_model(config, None, Gpt2Tokenizer(), device)[0], GPT2_VOCAB_SIZE
    if config.data.tokenizer == "bpe" and config.init_from == "scratch":
        vocab_size = config.data.vocab_size  # a trained BPE's <|endoftext|> is its last id (data/bpe.py)
        return GPT(scratch_config(config, vocab_size, vocab_size - 1)).to(device), vocab_size
    return None
