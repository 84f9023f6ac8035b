"""gptlab's model: pure PyTorch, no files, no Hydra."""

from .attention import CausalSelfAttention
from .config import GPTConfig
from .gpt import GPT, IGNORE_INDEX

__all__ = ["GPT", "GPTConfig", "CausalSelfAttention", "IGNORE_INDEX"]
