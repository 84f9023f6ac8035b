"""Writing train.bin and val.bin: the token stream in blocks, each shuffled and split.

The stream (every document's tokens in reading order, no separators yet) is cut
into blocks of `block_tokens` tokens: block k holds the stream's tokens
[k * block_tokens, (k + 1) * block_tokens). Within a block the documents (or the parts
of them that fall in it) are shuffled with a generator seeded by (seed, k); then the
block's first (1 - val_fraction) of tokens, the separator placed before each document
but the first one written, are appended to train.bin and the rest to val.bin. So
val.bin samples every part of the corpus, a stream included, and memory holds one block
whatever the corpus size. A document that runs over a block's end stays last in it and
continues first in the next, so its text is never reordered.

Shards are written as <split>.bin.partial. After each block, progress.json records
their sizes and where the next block starts in the source, so a prepare that is
killed resumes at its last complete block.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from data.errors import DataError
from data.meta import SPLITS, shard_path, write_json_atomic

PROGRESS_FILE = "progress.json"
PARTIAL_SUFFIX = ".partial"


class WriteError(DataError):
    """Writing the shards failed (a full disk, say): what was written is kept, to resume from."""


def partial_path(data_dir: Path, split: str) -> Path:
    final = shard_path(data_dir, split)
    return final.with_name(final.name + PARTIAL_SUFFIX)


@dataclass
class _DocumentSpan:
    """Consecutive tokens of one document within a block: the unit the block shuffles."""

    document: int  # index of the document these tokens belong to
    starts: bool  # whether they open it (else they continue it from the last block)
    parts: list = field(default_factory=list)  # arrays of its tokens, in order


class ShardWriter:
    """Appends the stream's tokens to the partial shards, one block at a time."""

    def __init__(
        self,
        data_dir: Path,
        dtype: np.dtype,
        eot_id: int | None,
        settings: tuple[int, float, int],
        progress: dict,
        resumed: bool,
    ):
        """`settings` are (block_tokens, val_fraction, seed); `progress` is what progress.json
        holds (new or read back); `resumed` continues its partial shards."""
        self.data_dir, self.dtype, self.eot_id = data_dir, dtype, eot_id
        self.block_tokens, self.val_fraction, self.seed = settings
        self.progress = progress
        self.spans: list[_DocumentSpan] = []
        self.filled = 0
        self.files = {split: self._open(split, progress["bytes"][split] if resumed else None) for split in SPLITS}

    def _open(self, split: str, size: int | None):
        path = partial_path(self.data_dir, split)
        try:
            if size is None:
                return open(path, "wb")
            f = open(path, "r+b")
            f.seek(size)  # a block written after the last one recorded is written again, the same
            return f
        except OSError as err:
            raise self._write_error(path, err) from err

    def add(self, tokens: np.ndarray, document: int, new_document: bool, position: dict, counters: dict) -> None:
        """Add one piece's tokens (`new_document`: it opens a document, perhaps an empty one,
        which still takes its place in the shuffle); `position` and `counters` are where
        reading the piece began."""
        if new_document:
            self.spans.append(_DocumentSpan(document, starts=True))
        consumed = 0
        while consumed < len(tokens):
            if not self.spans:  # the document runs on from the last block
                self.spans.append(_DocumentSpan(document, starts=False))
            part = tokens[consumed : consumed + self.block_tokens - self.filled]
            self.spans[-1].parts.append(part.astype(self.dtype))
            self.filled += len(part)
            consumed += len(part)
            if self.filled == self.block_tokens:
                self._write_block(final=False)
                self._record(position, consumed, counters)

    def finish(self) -> dict[str, int]:
        """Write the last (short) block, close the shards; their token counts."""
        if self.filled:
            self._write_block(final=True)
        for split, f in self.files.items():
            self._guarded(split, f.close)
        return {split: size // self.dtype.itemsize for split, size in self.progress["bytes"].items()}

    def close(self) -> None:
        for f in self.files.values():
            f.close()

    def _write_block(self, final: bool) -> None:
        tokens = np.concatenate(self._with_separators(self._shuffled_spans(final)))
        n_train = int(len(tokens) * (1 - self.val_fraction))
        for split, chunk in zip(SPLITS, (tokens[:n_train], tokens[n_train:])):
            f = self.files[split]
            self._guarded(split, lambda: (f.write(chunk.data), f.flush(), os.fsync(f.fileno())))
            self.progress["bytes"][split] += chunk.nbytes
        self.progress["blocks"] += 1
        self.spans, self.filled = [], 0

    def _shuffled_spans(self, final: bool) -> list[_DocumentSpan]:
        """The block's spans in shuffled order. One continuing the last block stays first; the
        last stays last unless the block is the corpus's last (it may run on into the next).
        default_rng([seed, 0]) is default_rng(seed) (a trailing zero adds nothing to a seed
        sequence), so a corpus of one block is shuffled as a whole by default_rng(seed), as
        format 2 shuffled every corpus."""
        spans, blocks = self.spans, self.progress["blocks"]
        first = 0 if spans[0].starts else 1
        last = len(spans) if final else max(first, len(spans) - 1)
        middle = spans[first:last]
        generator = np.random.default_rng([self.seed, blocks])
        return spans[:first] + [middle[i] for i in generator.permutation(len(middle))] + spans[last:]

    def _with_separators(self, spans: list[_DocumentSpan]) -> list[np.ndarray]:
        """The spans' tokens, the separator before each document but the first one written."""
        parts = []
        for index, span in enumerate(spans):
            opens_corpus = self.progress["blocks"] == 0 and index == 0
            if span.starts and span.parts and self.eot_id is not None and not opens_corpus:
                parts.append(np.array([self.eot_id], dtype=self.dtype))
            parts += span.parts
        return parts

    def _record(self, position: dict, consumed: int, counters: dict) -> None:
        self.progress["resume"] = {"position": position, "skip_tokens": consumed, "counters": counters}
        path = self.data_dir / PROGRESS_FILE
        self._guarded(None, lambda: write_json_atomic(path, self.progress), path)

    def _guarded(self, split: str | None, action, path: Path | None = None) -> None:
        try:
            action()
        except OSError as err:
            raise self._write_error(path or partial_path(self.data_dir, split), err) from err

    def _write_error(self, path: Path, err: OSError) -> WriteError:
        done = self.progress["blocks"]
        resume = (
            f"run the same command again: it resumes after the {done} block(s) already written"
            if done
            else "run the same command again"
        )
        if err.errno == errno.ENOSPC:
            return WriteError(f"no space left on device writing {path}: free some space and {resume}")
        return WriteError(f"cannot write {path} ({err.strerror}): {resume}")
