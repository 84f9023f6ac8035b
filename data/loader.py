"""BatchLoader: random (x, y) windows from a token shard, reproducible by step."""

import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from data.errors import DataError
from data.meta import PREPARE_HINT, check_shard, read_meta


@dataclass(eq=False)
class BatchLoader:
    """Batches of `batch_size` windows of `block_size + 1` tokens from one split's memory-mapped shard.

    A step's batch depends only on (seed, split, step, micro_step, rank), so a resumed run sees the
    batches a straight run would. Each step draws batch_size * world_size * accum_steps distinct
    window starts; micro-step m of rank r takes slice m * world_size + r: ranks never share a window,
    and W ranks see exactly the samples one process sees with accum_steps=W.
    """

    data_dir: str | Path
    split: str
    block_size: int
    batch_size: int
    seed: int
    rank: int = 0
    world_size: int = 1
    device: str | torch.device = "cpu"
    accum_steps: int = 1

    def __post_init__(self) -> None:
        split, block_size = self.split, self.block_size
        needed = self.batch_size * self.world_size * self.accum_steps  # windows a step draws, on all ranks
        assert min(block_size, self.batch_size, self.accum_steps) >= 1 and 0 <= self.rank < self.world_size, self
        assert self.seed >= 0, self  # all checked by train.py's config
        self.device = torch.device(self.device)
        meta = read_meta(Path(self.data_dir))
        self.shard = check_shard(Path(self.data_dir), meta, split)
        self.vocab_size, n_tokens = meta["vocab_size"], meta["tokens"][split]
        self.n_windows = n_tokens - block_size  # window starts 0 .. n_tokens - block_size - 1
        if self.n_windows < 1:
            raise DataError(
                f"the {split} split has {n_tokens} tokens, fewer than block_size + 1 = "
                f"{block_size + 1}: use a smaller block_size or a larger corpus"
            )
        if self.n_windows < needed:
            raise DataError(
                f"the {split} split has {self.n_windows} distinct windows of {block_size + 1} tokens but a step needs "
                f"batch_size * world_size * accum_steps = {needed}: use a smaller batch or a larger corpus"
            )
        try:
            self.tokens = np.memmap(self.shard, dtype=meta["dtype"], mode="r")  # (n_tokens,)
        except OSError as err:
            raise DataError(f"cannot memory-map {self.shard}: {err}") from err
        self._split_key = zlib.crc32(split.encode())  # a number for the split, stable across runs

    def window_starts(self, step: int, micro_step: int = 0) -> np.ndarray:
        """(batch_size,) token offsets of this rank's windows at `step`, `micro_step`."""
        assert step >= 0 and 0 <= micro_step < self.accum_steps, (step, micro_step, self.accum_steps)
        rng = np.random.default_rng([self.seed, self._split_key, int(step)])
        starts = rng.choice(self.n_windows, size=self.batch_size * self.world_size * self.accum_steps, replace=False)
        first = (micro_step * self.world_size + self.rank) * self.batch_size
        return starts[first : first + self.batch_size]

    def get_batch(self, step: int, micro_step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs x and targets y, int64 (batch_size, block_size): y is x shifted left by one token."""
        windows = np.stack([self.tokens[s : s + self.block_size + 1] for s in self.window_starts(step, micro_step)])
        top = int(windows.max())  # only the drawn (B, T + 1) windows: a scan of the shard would cost a pass per run
        if top >= self.vocab_size:
            raise DataError(
                f"{self.shard} holds token id {top} but the vocabulary has {self.vocab_size} ids "
                f"(meta.json's vocab_size): the shard is corrupt; {PREPARE_HINT}"
            )
        windows = torch.from_numpy(windows.astype(np.int64))  # (B, T + 1)
        x, y = windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
        if self.device.type == "cuda":  # page-locked host memory lets the copy overlap compute
            return x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device, non_blocking=True)
        return x.to(self.device), y.to(self.device)
