"""How many optimizer steps a run takes: max_iters as given, or derived for ablations whose arms must be fair:
- tokens_per_param: each non-embedding parameter of the MHA model of this shape gets that many training
  tokens (a size ladder's budget grows with the model; every attention variant of a shape gets the same);
- match_mha_flops: max_iters x the MHA model's training FLOPs per token over this model's (a GQA/MQA arm
  spends the MHA arm's compute)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from conf import Config
from model import GPT, GPTConfig


@dataclass(frozen=True)
class Budget:
    max_iters: int
    reason: str  # '' when max_iters is the setting itself


def training_budget(
    max_iters: int, tokens_per_param: float | None, match_mha_flops: bool, model_config: GPTConfig, tokens_per_step: int
) -> Budget:
    if tokens_per_param is None and not match_mha_flops:
        return Budget(max_iters, "")
    mha = GPT.shapes_only(replace(model_config, n_kv_head=model_config.n_head, match_mha_params=False))
    steps, reasons = float(max_iters), []
    if tokens_per_param is not None:
        non_embedding = mha.num_params(exclude_embeddings=True)
        steps = tokens_per_param * non_embedding / tokens_per_step
        reasons.append(f"{tokens_per_param:g} tokens per non-embedding parameter of the MHA shape ({non_embedding:,})")
    if match_mha_flops:
        ratio = mha.flops_per_token() / GPT.shapes_only(model_config).flops_per_token()
        steps *= ratio
        reasons.append(f"x {ratio:.4f} for the MHA model's training FLOPs per token")
    max_iters = max(1, math.ceil(steps))
    return Budget(max_iters, f"budget: {' '.join(reasons)} = {max_iters:,} steps of {tokens_per_step:,} tokens")


def run_budget(config: Config, model_config: GPTConfig, tokens_per_step: int) -> Budget:
    """The run's steps, of `tokens_per_step` tokens each (all processes together)."""
    return training_budget(
        config.max_iters, config.tokens_per_param, config.match_mha_flops, model_config, tokens_per_step
    )
