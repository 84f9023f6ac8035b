"""Text -> tokens -> batches. Knows nothing about models.

prepared = prepare(DataConfig(...))          # tokenise once: train.bin, val.bin, meta.json
tokenizer = load_tokenizer(prepared.data_dir) # the tokenizer those shards were made with
loader = BatchLoader(prepared.data_dir, "train", block_size, batch_size, seed)
x, y = loader.get_batch(step)                 # int64 (batch_size, block_size)
"""

import importlib
from typing import TYPE_CHECKING

from data.bpe import load_tokenizer
from data.config import DataConfig
from data.errors import DataError
from data.loader import BatchLoader
from data.tokenizer import CharTokenizer, Gpt2Tokenizer, Tokenizer

_PREPARATION = {"PreparedData", "prepare"}
if TYPE_CHECKING:
    from data.preparation import PreparedData, prepare


def __getattr__(name: str):
    # data.preparation's imports are slow, and sample.py, which reads a tokenizer, needs none of them
    if name in _PREPARATION:
        return getattr(importlib.import_module("data.preparation"), name)
    raise AttributeError(f"module 'data' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(globals().keys() | _PREPARATION)


__all__ = [
    "BatchLoader",
    "CharTokenizer",
    "DataConfig",
    "DataError",
    "Gpt2Tokenizer",
    "PreparedData",
    "Tokenizer",
    "load_tokenizer",
    "prepare",
]
