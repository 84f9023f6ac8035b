"""Writing train.bin and val.bin: the token stream in blocks, each shuffled and split.

The stream (every document's tokens in reading order) is cut into blocks of `block_tokens`. In block k the documents (or
their parts in it) are shuffled by a generator seeded by (seed, k), a document running over the block's end staying last
(and first in the next); the block's first (1 - val_fraction) of tokens, the separator before each document but the
first one written, go to train.bin, the rest to val.bin: val.bin samples the whole corpus, and memory holds one block.
Shards are written as <split>.bin.partial; after each block, progress.json records their sizes and where the next block
starts in the source, so a killed prepare resumes there.
"""

import errno
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from data.config import DataConfig
from data.errors import DataError
from data.meta import SPLITS, shard_path, write_json_atomic
from system import TEMP_MARK

PROGRESS_FILE = "progress.json"


class WriteError(DataError):
    """Writing the shards failed (a full disk, say): what was written is kept, to resume from."""


def partial_path(data_dir: Path, split: str) -> Path:
    return Path(f"{shard_path(data_dir, split)}.partial")


def remove_temp_files(data_dir: Path) -> None:
    """Delete what an interrupted prepare left behind (never a complete-looking file)."""
    for leftover in Path(data_dir).glob(f"*{TEMP_MARK}*"):
        if leftover.is_dir():
            shutil.rmtree(leftover)
        else:
            leftover.unlink()


@dataclass
class _DocumentSpan:
    """Consecutive tokens of one document within a block: the unit the block shuffles."""

    starts: bool  # whether they open it (else they continue it from the last block)
    parts: list = field(default_factory=list)  # arrays of its tokens, in order


class ShardWriter:
    """Appends the stream's tokens to the partial shards, one block at a time."""

    def __init__(self, data_dir: Path, eot_id: int | None, cfg: DataConfig, progress: dict):
        """`progress` is what progress.json holds, new or read back (then its partial shards are continued)."""
        self.data_dir, self.dtype, self.eot_id, self.progress = data_dir, np.dtype(progress["dtype"]), eot_id, progress
        self.block_tokens, self.val_fraction, self.seed = cfg.shuffle_block_tokens, cfg.val_fraction, cfg.split_seed
        self.spans, self.filled = [], 0
        self.paths, self.files = {split: partial_path(data_dir, split) for split in SPLITS}, {}
        # A resumed prepare continues its partial shards: a block written after the last one recorded, again.
        for split, path in self.paths.items():
            self.files[split] = self._guarded(path, lambda: open(path, "wb" if progress["resume"] is None else "r+b"))
            self.files[split].seek(progress["bytes"][split])

    def add(self, tokens: np.ndarray, new_document: bool, position: dict, counters: dict) -> None:
        """One piece's tokens (`new_document`: it opens a document, an empty one taking its place in the
        shuffle too); `position` and `counters` are where reading the piece began."""
        if new_document:
            self.spans.append(_DocumentSpan(starts=True))
        consumed = 0
        while consumed < len(tokens):
            if not self.spans:  # the document runs on from the last block
                self.spans.append(_DocumentSpan(starts=False))
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
            self._guarded(self.paths[split], f.close)
        return {split: size // self.dtype.itemsize for split, size in self.progress["bytes"].items()}

    def close(self) -> None:
        for f in self.files.values():
            f.close()

    def _write_block(self, final: bool) -> None:
        # The spans shuffled, but for one continuing the last block (first) and the last one unless the block is
        # the corpus's last (it may run on). default_rng([seed, 0]) is default_rng(seed), so a one-block corpus
        # is shuffled as format 2 shuffled every corpus.
        spans, blocks = self.spans, self.progress["blocks"]
        first = 0 if spans[0].starts else 1
        last = len(spans) if final else max(first, len(spans) - 1)
        order = np.random.default_rng([self.seed, blocks]).permutation(last - first)
        parts = []  # the spans' tokens, the separator before each document but the first one written
        for index, span in enumerate(spans[:first] + [spans[first + i] for i in order] + spans[last:]):
            if span.starts and span.parts and self.eot_id is not None and (blocks, index) != (0, 0):
                parts.append(np.array([self.eot_id], dtype=self.dtype))
            parts += span.parts
        tokens = np.concatenate(parts)
        n_train = int(len(tokens) * (1 - self.val_fraction))
        for split, chunk in zip(SPLITS, (tokens[:n_train], tokens[n_train:])):
            f = self.files[split]
            self._guarded(self.paths[split], lambda: (f.write(chunk.data), f.flush(), os.fsync(f.fileno())))
            self.progress["bytes"][split] += chunk.nbytes
        self.progress["blocks"] += 1
        self.spans, self.filled = [], 0

    def _record(self, position: dict, consumed: int, counters: dict) -> None:
        self.progress["resume"] = {"position": position, "skip_tokens": consumed, "counters": counters}
        path = self.data_dir / PROGRESS_FILE
        self._guarded(path, lambda: write_json_atomic(path, self.progress))

    def _guarded(self, path: Path, action):
        """action(); an OSError from it becomes a WriteError naming `path` and how to go on."""
        try:
            return action()
        except OSError as err:
            done = self.progress["blocks"]
            after = f": it resumes after the {done} block(s) already written" if done else ""
            resume = f"run the same command again{after}"
            if err.errno == errno.ENOSPC:
                raise WriteError(f"no space left on device writing {path}: free some space and {resume}") from err
            raise WriteError(f"cannot write {path} ({err.strerror}): {resume}") from err
