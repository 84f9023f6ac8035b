"""Evaluation on every rank: the same eval_iters batches of each split every time,
shared out among the ranks and summed by one all-reduce.

Batch i of a split goes to rank i mod world_size, so the batches evaluated, and so
the result, do not depend on the number of processes (up to summation order).

Besides the loss in nats per token, bits per byte: the same targets' total loss over
the UTF-8 bytes they stand for (the tokenizer's token_bytes), which compares across
tokenizers, char-level and BPE alike.
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
        token_bytes: list[int],
        precision: Precision,
        group: Distributed,
        device: torch.device,
    ) -> None:
        self.loaders = {
            split: BatchLoader(data_dir, split, block_size, batch_size, seed + EVAL_SEED_OFFSET, device=device)
            for split in SPLITS
        }
        self.eval_iters, self.precision, self.group, self.device = eval_iters, precision, group, device
        self.token_bytes = torch.tensor(token_bytes, dtype=torch.float64, device=device)  # (tokenizer vocab,)

    @torch.no_grad()
    def __call__(self, model: nn.Module) -> dict[str, float]:
        """{train,val}_loss (mean over the batches), {train,val}_ppl and {train,val}_bpb."""
        model.eval()
        sums = []  # per split: [sum of batch losses, batches, nats, bytes], on this rank
        for loader in self.loaders.values():
            split_sums = torch.zeros(4, dtype=torch.float64, device=self.device)
            for i in range(self.group.rank, self.eval_iters, self.group.world_size):
                x, y = loader.get_batch(i)
                with self.precision.autocast():
                    loss = model(x, y)[1].double()
                split_sums += torch.stack([loss, torch.ones_like(loss), loss * y.numel(), self.token_bytes[y].sum()])
            sums.append(split_sums)
        model.train()
        values = all_reduce_sum(self.group, torch.stack(sums)).tolist()  # the one host read
        metrics = {}
        for split, (loss_sum, batches, nats, n_bytes) in zip(self.loaders, values):
            mean = loss_sum / batches
            metrics[f"{split}_loss"] = mean
            metrics[f"{split}_ppl"] = math.exp(min(mean, 50.0))
            metrics[f"{split}_bpb"] = nats / (math.log(2) * n_bytes) if n_bytes else None
        return metrics
