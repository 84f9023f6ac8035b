"""DataConfig: where the text comes from, how it is tokenised, where the shards go."""

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rules import NOT_EMPTY, above, at_least, between, check_rules, matching, one_of, setting

SOURCES = ("stdlib", "files", "hub")
TOKENIZERS = ("gpt2", "char", "bpe")
MIN_BPE_VOCAB = 257  # the 256 bytes and <|endoftext|>
# A trained BPE learns from the corpus's first BPE_SAMPLE_BYTES, each merge a pair seen BPE_MIN_PAIR_COUNT
# times or more there: no sample holds more ids than MAX_BPE_VOCAB, and asking for more makes tokenizers
# reserve memory it cannot use (10^9 ids: a 70 GB allocation that aborts the process).
BPE_SAMPLE_BYTES = 64 << 20
BPE_MIN_PAIR_COUNT = 2
MAX_BPE_VOCAB = MIN_BPE_VOCAB + BPE_SAMPLE_BYTES // BPE_MIN_PAIR_COUNT
VERIFY_MODES = ("sha256", "size")
DEFAULT_DATA_ROOT = "data_cache"  # relative to the directory a command is started from
NAME = matching(r"[A-Za-z0-9][A-Za-z0-9_.-]*", "letters, digits, '_', '.' or '-' (it names a directory)")


@dataclass
class DataConfig:
    """Where the text comes from, how it is tokenised, and where the shards go."""

    name: str = setting("stdlib", NAME)
    """Names the data directory, data_cache/<name>, unless data_dir is set; it holds one set of token settings."""
    source: str = setting("stdlib", one_of(*SOURCES))
    """stdlib (this Python's own sources, offline), files (path or url) or hub (a Hugging Face dataset)."""
    tokenizer: str = setting("gpt2", one_of(*TOKENIZERS))
    """gpt2 (tiktoken's BPE), char (one token per character of the corpus) or bpe (a byte-level BPE trained on it)."""
    vocab_size: int | None = setting(None, between(MIN_BPE_VOCAB, MAX_BPE_VOCAB))
    """tokenizer=bpe (and only then): its ids, the 256 bytes and <|endoftext|> included; a multiple of 64 pads nothing."""
    path: str | None = setting(None, NOT_EMPTY)
    """source=files: a text, jsonl or parquet file, a directory of them, or a glob ("docs/**/*.md")."""
    url: str | None = setting(None, NOT_EMPTY)
    """source=files: a file fetched into <data_dir>/download/ when path is not set."""
    dataset: str | None = setting(None, NOT_EMPTY)
    """source=hub: a dataset id on the Hugging Face Hub, or a local dataset directory."""
    subset: str | None = setting(None, NOT_EMPTY)
    """source=hub: the dataset's configuration name, e.g. sample-10BT."""
    split: str = setting("train", NOT_EMPTY)
    """source=hub: which split to read."""
    revision: str | None = setting(None, NOT_EMPTY)
    """source=hub: a commit or tag, to pin what "the same source" means."""
    streaming: bool = False
    """source=hub: read as a stream instead of downloading everything first."""
    text_column: str = setting("text", NOT_EMPTY)
    """jsonl, parquet and hub: the column holding each document's text."""
    document_separator: str | None = setting(None, NOT_EMPTY)
    """source=files: text files are one document each, or one per part between these separators (not tokenised)."""
    max_documents: int | None = setting(None, at_least(1))
    """Read only the first N documents (every source); null: all."""
    val_fraction: float = setting(0.1, between(0, 1, "()"))
    """Share of each shuffle block's tokens held out for val.bin."""
    split_seed: int = setting(1337, at_least(0))
    """Seeds the shuffle of documents within each block."""
    shuffle_block_tokens: int = setting(1 << 24, at_least(1))
    """Tokens per block: shuffled in memory, then split into train and val."""
    num_proc: int | None = setting(None, at_least(1))
    """Tokenising threads; null: every core this process may use."""
    batch_mb: float = setting(32, above(0))
    """Megabytes of text tokenised at once: the main lever on prepare's memory."""
    data_dir: str | None = setting(None, NOT_EMPTY)
    """Where train.bin, val.bin and meta.json go; null: data_cache/<name>."""
    hf_cache_dir: str | None = setting(None, NOT_EMPTY)
    """The datasets library's cache; null: <data_dir>/hf_cache."""
    keep_hf_cache: bool = False
    """Keep the default hf_cache (a Hub download) after preparing."""
    verify: str = setting("sha256", one_of(*VERIFY_MODES))
    """How prepare checks shards it would reuse: their sha256 digests and the local source files', or only sizes (corpora too large to hash)."""

    def __post_init__(self) -> None:
        check_rules(self, "data.", self._conflicts)

    def _conflicts(self) -> Iterator[str]:
        # A setting another source reads would be ignored, yet change the fingerprint (a rebuild).
        for source, used in (
            ("files", {"path": None, "url": None, "document_separator": None}),
            ("hub", {"dataset": None, "subset": None, "revision": None, "streaming": False, "split": "train"}),
        ):
            for field, unset in used.items():
                if self.source != source and getattr(self, field) != unset:
                    rule = f"is read only when source is '{source}', and this source is '{self.source}'"
                    hint = f"choose a data= preset of source {source}, or leave it {json.dumps(unset)}"
                    yield _problem(field, f"{rule} ({hint})", getattr(self, field))
        if self.source == "files" and self.path is None and self.url is None:
            yield _problem("path", "must name a file, directory or glob when source is 'files'", None)
        if self.source == "hub" and self.dataset is None:
            yield _problem("dataset", "must name a Hub dataset or a local dataset directory when source is 'hub'", None)
        if self.tokenizer == "bpe" and self.vocab_size is None:
            yield _problem("vocab_size", "must be set when tokenizer is 'bpe' (e.g. data.vocab_size=8192)", None)
        if self.tokenizer != "bpe" and self.vocab_size is not None:
            rule = f"is read only when tokenizer is 'bpe', and this tokenizer is '{self.tokenizer}'"
            yield _problem("vocab_size", f"{rule} (set data.tokenizer=bpe, or leave it null)", self.vocab_size)

    def resolved_data_dir(self) -> Path:
        return Path(self.data_dir or Path(DEFAULT_DATA_ROOT) / self.name).expanduser()

    def resolved_num_proc(self) -> int:
        """num_proc, or the cores this process may run on (a job's CPU mask, not the machine's core count)."""
        try:
            return self.num_proc or len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            return os.cpu_count() or 1

    def resolved_hf_cache_dir(self) -> Path:
        return Path(self.hf_cache_dir).expanduser() if self.hf_cache_dir else self.resolved_data_dir() / "hf_cache"


def _problem(field: str, rule: str, value: object) -> str:
    return f"data.{field} {rule}, got {value!r}"
