"""gptlab's model: pure PyTorch, no files, no Hydra."""

from .attention import CausalSelfAttention
from .config import GPTConfig
from .decode_layout import to_decode_layout
from .engine import DECODE_MODES, Sampling, generate, sample_next, stream
from .gpt import GPT, IGNORE_INDEX
from .kv_cache import KVCache, StaticKVCache
from .memory import huge_page_zeros
from .stop_strings import cut_at_stop, stop_string_check
from .weight_formats import WEIGHT_FORMATS, to_weight_format

__all__ = [
    "GPT",
    "GPTConfig",
    "CausalSelfAttention",
    "IGNORE_INDEX",
    "KVCache",
    "StaticKVCache",
    "Sampling",
    "sample_next",
    "generate",
    "stream",
    "stop_string_check",
    "cut_at_stop",
    "to_decode_layout",
    "to_weight_format",
    "WEIGHT_FORMATS",
    "DECODE_MODES",
    "huge_page_zeros",
]
