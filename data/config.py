"""DataConfig: where the text comes from, how it is tokenised, where the shards go."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, Optional

SOURCES = ("stdlib", "files", "hub")
TOKENIZERS = ("gpt2", "char")
VERIFY_MODES = ("sha256", "size")
DEFAULT_DATA_ROOT = "data_cache"  # relative to the directory a command is started from

_NAME_RULE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass
class DataConfig:
    name: str = "stdlib"  # names the data directory: data_cache/<name> unless data_dir is set
    source: str = "stdlib"  # stdlib | files | hub
    tokenizer: str = "gpt2"  # gpt2 | char
    # source=files: a text/jsonl/parquet file, a directory of them, or a glob ("docs/**/*.md").
    path: Optional[str] = None
    # source=files: fetched into <data_dir>/download/ when `path` is not set (tiny Shakespeare).
    url: Optional[str] = None
    # source=hub: a dataset id on the Hugging Face Hub, or a local dataset directory.
    dataset: Optional[str] = None
    subset: Optional[str] = None  # hub: the dataset's configuration name, e.g. "sample-10BT"
    split: str = "train"  # hub: which split to read
    revision: Optional[str] = None  # hub: a commit or tag, to pin what "the same source" means
    streaming: bool = False  # hub: read as a stream instead of downloading everything first
    text_column: str = "text"  # jsonl/parquet/hub: the column holding each document's text
    # files: text files are one document each, or one per part between these separators
    # (e.g. "<|endoftext|>" for TinyStories' .txt files); the separators are not tokenised.
    document_separator: Optional[str] = None
    max_documents: Optional[int] = None  # read only the first N documents (all sources)
    val_fraction: float = 0.1  # share of each shuffle block's tokens held out for val.bin
    split_seed: int = 1337  # seeds the shuffle of documents within each block
    shuffle_block_tokens: int = 1 << 24  # tokens per block: shuffled in memory, then split
    num_proc: Optional[int] = None  # tokenising threads; None means every core this process may use
    batch_mb: float = 32  # megabytes of text tokenised at once: the main lever on prepare's memory
    data_dir: Optional[str] = None  # where train.bin / val.bin / meta.json go
    hf_cache_dir: Optional[str] = None  # datasets' cache; None means <data_dir>/hf_cache
    keep_hf_cache: bool = False  # keep the default hf_cache (a Hub download) after preparing
    # How prepare checks shards it would reuse: their content against meta.json's sha256
    # digests, or only their size (for corpora too large to hash at every start).
    verify: str = "sha256"  # sha256 | size

    def __post_init__(self) -> None:
        self._check_strings()
        self._check_numbers()
        for field in ("streaming", "keep_hf_cache"):
            if not isinstance(getattr(self, field), bool):
                _fail(field, "must be true or false", getattr(self, field))
        self._check_source_needs()

    def _check_strings(self) -> None:
        for field in ("name", "source", "tokenizer", "split", "text_column"):
            if not isinstance(getattr(self, field), str) or not getattr(self, field):
                _fail(field, "must be a non-empty string", getattr(self, field))
        for field in ("path", "url", "dataset", "subset", "revision", "document_separator", "data_dir",
                      "hf_cache_dir"):
            value = getattr(self, field)
            if value is not None and (not isinstance(value, str) or not value):
                _fail(field, "must be a non-empty string or null", value)
        if not _NAME_RULE.fullmatch(self.name):
            _fail("name", "must be letters, digits, '_', '.' or '-' (it names a directory)", self.name)
        if self.source not in SOURCES:
            _fail("source", f"must be one of {SOURCES}", self.source)
        if self.tokenizer not in TOKENIZERS:
            _fail("tokenizer", f"must be one of {TOKENIZERS}", self.tokenizer)
        if self.verify not in VERIFY_MODES:
            _fail("verify", f"must be one of {VERIFY_MODES}", self.verify)

    def _check_numbers(self) -> None:
        for field in ("max_documents", "num_proc"):
            value = getattr(self, field)
            if value is not None and (not _is_int(value) or value < 1):
                _fail(field, "must be a positive integer or null", value)
        if not _is_int(self.shuffle_block_tokens) or self.shuffle_block_tokens < 1:
            _fail("shuffle_block_tokens", "must be a positive integer", self.shuffle_block_tokens)
        if isinstance(self.batch_mb, bool) or not isinstance(self.batch_mb, (int, float)) or not self.batch_mb > 0:
            _fail("batch_mb", "must be a positive number of megabytes", self.batch_mb)
        if not _is_int(self.split_seed) or self.split_seed < 0:
            _fail("split_seed", "must be a non-negative integer", self.split_seed)
        fraction = self.val_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
            _fail("val_fraction", "must be a number strictly between 0 and 1", fraction)

    def _check_source_needs(self) -> None:
        # A setting another source reads would be ignored, yet change the fingerprint (a rebuild).
        for source, used in (("files", {"path": None, "url": None, "document_separator": None}),
                             ("hub", {"dataset": None, "subset": None, "revision": None, "streaming": False,
                                      "split": "train"})):
            for field, unset in used.items():
                if self.source != source and getattr(self, field) != unset:
                    _fail(field, f"is read only when source is '{source}', and this source is '{self.source}' "
                                 f"(choose a data= preset of source {source}, or leave it {json.dumps(unset)})",
                          getattr(self, field))
        if self.source == "files" and self.path is None and self.url is None:
            _fail("path", "must name a file, directory or glob when source is 'files'", None)
        if self.source == "hub" and self.dataset is None:
            _fail("dataset", "must name a Hub dataset or a local dataset directory when source is 'hub'", None)

    def resolved_data_dir(self) -> Path:
        return Path(self.data_dir or Path(DEFAULT_DATA_ROOT) / self.name).expanduser()

    def resolved_num_proc(self) -> int:
        return self.num_proc or _usable_cores()

    def resolved_hf_cache_dir(self) -> Path:
        return Path(self.hf_cache_dir).expanduser() if self.hf_cache_dir else self.resolved_data_dir() / "hf_cache"


def _usable_cores() -> int:
    """The cores this process may run on (a job's CPU mask, not the machine's core count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _fail(field: str, rule: str, value: object) -> NoReturn:
    raise ValueError(f"DataConfig.{field} {rule}, got {value!r}")
