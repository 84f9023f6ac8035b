"""Evaluation on every rank: the same eval_iters batches of each split every time,
shared out among the ranks and summed by one all-reduce.

Batch i of a split goes to rank i mod world_size, so the batches evaluated, and so
the result, do not depend on the number of processes (up to summation order).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from data import BatchLoader
from training.distributed import Distributed, all_reduce_sum
from training.runtime import Precision

EVAL_SEED_OFFSET = 1_000_003  # evaluation batches come from their own draw
SPLITS = ("train", "val")


class Evaluator:
    def __init__(
        self,
        data_dir: Path,
        *,
        block_size: int,
        batch_size: int,
        seed: int,
        eval_iters: int,
        precision: Precision,
        group: Distributed,
        device: torch.device,
    ) -> None:
        self.loaders = {
            split: BatchLoader(data_dir, split, block_size, batch_size, seed + EVAL_SEED_OFFSET, device=device)
            for split in SPLITS
        }
        self.eval_iters, self.precision, self.group, self.device = eval_iters, precision, group, device

    @torch.no_grad()
    def __call__(self, model: nn.Module) -> dict[str, float]:
        """{train,val}_loss (mean over the batches) and {train,val}_ppl."""
        model.eval()
        sums = []  # per split: (sum of batch losses, number of batches), on this rank
        for loader in self.loaders.values():
            total = torch.zeros((), dtype=torch.float64, device=self.device)
            mine = range(self.group.rank, self.eval_iters, self.group.world_size)
            for i in mine:
                x, y = loader.get_batch(i)
                with self.precision.autocast():
                    total += model(x, y)[1].double()
            sums += [total, torch.full((), float(len(mine)), dtype=torch.float64, device=self.device)]
        model.train()
        values = all_reduce_sum(self.group, torch.stack(sums)).tolist()  # the one host read
        metrics = {}
        for k, split in enumerate(self.loaders):
            mean = values[2 * k] / values[2 * k + 1]
            metrics[f"{split}_loss"] = mean
            metrics[f"{split}_ppl"] = math.exp(min(mean, 50.0))
        return metrics
