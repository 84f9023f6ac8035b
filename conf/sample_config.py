"""SampleConfig: the typed schema of conf/sample.yaml, the settings of sample.py."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from conf import DEVICE, PRECISION, load_config
from model import DECODE_MODES, WEIGHT_FORMATS, Sampling
from model.engine import TEMPERATURE, TOP_K, TOP_P
from rules import NOT_EMPTY, SEED, at_least, check_rules, one_of, setting

DECODE = tuple(mode for mode in DECODE_MODES if mode != "static")  # static is for checking the graph's step


@dataclass
class SampleConfig:
    """sample.py's settings: `python sample.py prompt="To be" num_samples=3 temperature=0.7`."""

    checkpoint: str | None = None
    """A checkpoint or run directory; null: the newest run's latest checkpoint."""
    runs_root: str = setting("runs", NOT_EMPTY)
    """Where the newest run is looked for."""
    init_from: str = setting("checkpoint", one_of("checkpoint", "hf"))
    """Where the model comes from: checkpoint (a gptlab run) or hf (Hugging Face, model_path), as in train.py."""
    model_path: str | None = setting(None, NOT_EMPTY)
    """init_from=hf: a transformers directory or a Hub name (gpt2, gpt2-medium, gpt2-large, gpt2-xl)."""
    prompt: str = ""
    """The text to continue (\\n and \\t mean newline and tab), FILE:path to read it from a file, or - for standard input; empty: start from <|endoftext|> (a newline for a char tokenizer)."""
    num_samples: int = setting(1, at_least(1))
    """Samples generated together, as one batch."""
    max_new_tokens: int = setting(256, at_least(1))
    """Tokens generated per sample at most."""
    temperature: float = setting(0.8, TEMPERATURE)
    """Divides the logits; 0 is greedy."""
    top_k: int | None = setting(200, TOP_K)
    """Sample among the k most likely tokens only; null: no limit."""
    top_p: float = setting(1.0, TOP_P)
    """Nucleus sampling: the most likely tokens holding this much probability; 1.0 keeps every token."""
    seed: int | None = setting(1337, SEED)
    """The same seed, checkpoint and settings give the same text; null: random."""
    stop: list[str] = setting(factory=list, rule=NOT_EMPTY)
    """Stop strings, e.g. 'stop=["\\n\\n"]': a sample ends at the first (left out)."""
    device: str = setting("auto", DEVICE)
    """auto: CUDA when present, else the CPU."""
    precision: str = setting("auto", PRECISION)
    """What the activations are computed in; auto: bf16 on CUDA that has it, else fp16; fp32 on a CPU."""
    weights: str = setting("fp32", one_of(*WEIGHT_FORMATS))
    """fp32 (as trained, held in the activations' precision), bf16, or int8 (CPU only): fewer bytes read per token."""
    decode: str = setting("eager", one_of(*DECODE))
    """eager, or graph: each decode step replayed as a CUDA graph (CUDA only)."""
    json: bool = False
    """Print one JSON object (texts, token counts, why each ended) instead of streaming text."""

    def __post_init__(self) -> None:
        check_rules(self, "", self._conflicts)  # Sampling's four rules among them
        self.sampling = Sampling(self.temperature, self.top_k, self.top_p, self.seed)

    def _conflicts(self) -> Iterator[str]:
        if self.init_from == "hf" and self.checkpoint is not None:
            yield (
                f"checkpoint={self.checkpoint} and init_from=hf name two models: sample a gptlab checkpoint "
                "with checkpoint=PATH, or a Hugging Face model with init_from=hf model_path=..."
            )
        if self.init_from == "hf" and not self.model_path:
            yield "init_from=hf needs model_path: a transformers directory or a Hub name such as gpt2"
        if self.init_from == "checkpoint" and self.model_path:  # it would be ignored without a word
            yield (
                f"model_path={self.model_path} is read only with init_from=hf: set init_from=hf too, "
                "or name a gptlab checkpoint with checkpoint=PATH"
            )


def load_sample_config(cfg: DictConfig) -> SampleConfig:
    """The composed config as a validated SampleConfig (a SettingsError naming every bad setting)."""
    return load_config(cfg, SampleConfig)


ConfigStore.instance().store(name="sample_schema", node=SampleConfig)
