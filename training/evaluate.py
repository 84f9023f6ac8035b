"""Evaluation on every rank: the same windows of each split in every run on the same data, whatever its
seed (differences between runs are the models'), batch i on rank i mod world_size (the result does not
depend on the number of processes), in pieces of the run's micro-batch; eval_whole_val covers the val
split whole, by every non-overlapping window, at the final evaluation or at every one. Besides the loss
(nats per token, the mean over windows) and its standard error: bits per byte, the targets' total loss
over the UTF-8 bytes they stand for (the tokenizer's token_bytes), comparable across tokenizers.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from conf import Config
from data import BatchLoader, DataError, PreparedData
from run.distributed import Ranks, all_reduce_sum
from run.runtime import Precision

EVAL_SEED = 1_000_003  # the evaluation windows' own draw, the same for every run
SPLITS = ("train", "val")


class Evaluator:
    def __init__(
        self,
        data_dir: Path,
        *,
        block_size: int,
        batch_size: int,
        eval_iters: int,
        whole_val: str,
        token_bytes: list[int],
        precision: Precision,
        ranks: Ranks,
        device: torch.device,
        micro_batch: int | None = None,
    ) -> None:
        self.loaders = {
            split: BatchLoader(data_dir, split, block_size, batch_size, EVAL_SEED, device=device) for split in SPLITS
        }
        self.eval_iters, self.whole_val, self.precision, self.ranks = eval_iters, whole_val, precision, ranks
        self.device = device
        self.micro_batch = micro_batch or batch_size  # a batch's windows go through the model this many at a time
        self.token_bytes = torch.tensor(token_bytes, dtype=torch.float64, device=device)  # (tokenizer vocab,)

    @classmethod
    def for_run(
        cls,
        config: Config,
        data: PreparedData,
        block_size: int,
        precision: Precision,
        ranks: Ranks,
        device: torch.device,
    ) -> Evaluator:
        micro_batch = config.eval_batch_size if config.batch_size == "auto" else config.batch_size  # auto: max_iters=0
        return cls(
            data.data_dir,
            block_size=block_size,
            batch_size=config.eval_batch_size or micro_batch,
            micro_batch=micro_batch,
            eval_iters=config.eval_iters,
            whole_val=config.eval_whole_val,
            token_bytes=data.tokenizer().token_bytes(),
            precision=precision,
            ranks=ranks,
            device=device,
        )

    @torch.no_grad()
    def __call__(self, model: nn.Module, *, final: bool = False) -> dict[str, float]:
        """{train,val}_loss (the mean over windows), {train,val}_loss_se (its standard error over the windows),
        {train,val}_windows, _ppl and _bpb. final: the run's last evaluation (eval_whole_val=final covers it whole)."""
        model.eval()
        whole = self.whole_val == "always" or (final and self.whole_val == "final")
        sums = []  # per split: [sum of window losses, sum of their squares, windows, bytes], on this rank
        for split, loader in self.loaders.items():
            split_sums = torch.zeros(4, dtype=torch.float64, device=self.device)
            batches = self._whole(loader) if whole and split == "val" else self._sampled(loader)
            for x_batch, y_batch in batches:
                for x, y in zip(x_batch.split(self.micro_batch), y_batch.split(self.micro_batch)):
                    with self.precision.autocast():
                        logits = model(x)[0]
                    losses = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), reduction="none")
                    window = losses.view(y.shape).double().mean(1)  # (B,)
                    split_sums += torch.stack(
                        [window.sum(), window.square().sum(), window.new_tensor(len(window)), self.token_bytes[y].sum()]
                    )
            sums.append(split_sums)
        model.train()
        values = all_reduce_sum(self.ranks, torch.stack(sums)).tolist()  # the one host read
        block_size = self.loaders["val"].block_size
        metrics = {}
        for split, (total, squares, windows, n_bytes) in zip(self.loaders, values):
            mean = total / windows
            variance = max(squares - windows * mean * mean, 0.0) / (windows - 1) if windows > 1 else math.nan
            metrics[f"{split}_loss"] = mean
            metrics[f"{split}_loss_se"] = math.sqrt(variance / windows)
            metrics[f"{split}_windows"] = int(windows)
            metrics[f"{split}_ppl"] = math.exp(min(mean, 50.0))
            metrics[f"{split}_bpb"] = total * block_size / (math.log(2) * n_bytes) if n_bytes else None
        return metrics

    def _sampled(self, loader: BatchLoader) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for i in range(self.ranks.rank, self.eval_iters, self.ranks.world_size):
            yield loader.get_batch(i)

    def _whole(self, loader: BatchLoader) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Every non-overlapping window of the split, in batches (the last partial window left out)."""
        t, b = loader.block_size, loader.batch_size
        starts = np.arange(0, len(loader.tokens) - t, t)
        for i in range(self.ranks.rank, math.ceil(len(starts) / b), self.ranks.world_size):
            windows = np.stack([loader.tokens[s : s + t + 1] for s in starts[i * b : (i + 1) * b]]).astype(np.int64)
            if windows.max() >= loader.vocab_size:
                raise DataError(
                    f"{loader.shard} holds token id {windows.max()} but the vocabulary has "
                    f"{loader.vocab_size} ids: the shard is corrupt; prepare the data again"
                )
            windows = torch.from_numpy(windows).to(self.device)
            yield windows[:, :-1], windows[:, 1:]
