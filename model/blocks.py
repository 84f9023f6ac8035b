"""The block's interchangeable parts: its norm and its MLP, as GPTConfig chooses them."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from .config import GPTConfig


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, config.mlp_hidden, bias=config.bias)
        self.c_proj = nn.Linear(config.mlp_hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        # GPT-2 used the tanh approximation of GELU; keep it so imported weights agree.
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class ReLU2MLP(MLP):
    """GPT-2's two matrices with relu(x)**2 between them (modded-nanogpt's MLP)."""

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(F.relu(self.c_fc(x)).square()))


class SwiGLU(nn.Module):
    """Llama's gated MLP: c_proj(silu(c_gate(x)) * c_fc(x)) (its gate_proj, up_proj and down_proj)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_gate = nn.Linear(config.n_embd, config.mlp_hidden, bias=config.bias)
        self.c_fc = nn.Linear(config.n_embd, config.mlp_hidden, bias=config.bias)
        self.c_proj = nn.Linear(config.mlp_hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(F.silu(self.c_gate(x)) * self.c_fc(x)))


MLP_CLASSES = {"gelu": MLP, "relu2": ReLU2MLP, "swiglu": SwiGLU}  # by GPTConfig.mlp


def make_norm(config: GPTConfig, gain: bool | None = None) -> nn.Module:
    """GPT-2's LayerNorm (a bias if config.bias) or Llama's RMSNorm; with gain (default: norm_weight) false, either
    without parameters (nanochat's weightless RMSNorm)."""
    gain = config.norm_weight if gain is None else gain
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.n_embd, eps=config.norm_eps, elementwise_affine=gain)
    return nn.LayerNorm(config.n_embd, eps=config.norm_eps, elementwise_affine=gain, bias=config.bias)
