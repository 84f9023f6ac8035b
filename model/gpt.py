"""The GPT-2 architecture: embeddings, pre-norm blocks, an LM head (tied to the token table by default); the
block's position encoding, norm and MLP are GPT-2's by default and Llama's or modded-nanogpt's as chosen."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import CausalSelfAttention, Mask, Rope
from .blocks import MLP_CLASSES, make_norm
from .config import GPTConfig
from .documents import FLEX_DEVICES, document_ids, document_mask, document_positions
from .init import draw_seed, init_weights
from .kv_cache import KVCache
from .rotary import rotary_angles

IGNORE_INDEX = -1  # targets equal to this contribute nothing to the loss


class Block(nn.Module):
    def __init__(self, config: GPTConfig, layer_idx: int) -> None:
        super().__init__()
        self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.ln_2 = make_norm(config)
        self.mlp = MLP_CLASSES[config.mlp](config)
        self.branch_scale = config.branch_scale

    def forward(
        self, x: Tensor, kv_cache: KVCache | None = None, mask: Mask = None, rope: Rope | None = None
    ) -> Tensor:
        x = x + self._scaled(self.attn(self.ln_1(x), kv_cache, mask, rope))
        return x + self._scaled(self.mlp(self.ln_2(x)))

    def _scaled(self, branch: Tensor) -> Tensor:
        # at 1.0 (every preset) no multiply: a tensor-wide op per branch on every step, for nothing
        return branch if self.branch_scale == 1.0 else self.branch_scale * branch


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        init_seed = draw_seed()
        # A learned position table (rotary needs none), and a norm of the embeddings.
        table = {"wpe": nn.Embedding(config.block_size, config.n_embd)} if config.position == "learned" else {}
        table |= {"ln_e": make_norm(config, gain=False)} if config.embed_norm else {}
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                **table,
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList(Block(config, i) for i in range(config.n_layer)),
                ln_f=make_norm(config),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.unet_skips:  # one weight per skip: block i's output into block n_layer - 1 - i's input
            self.skip_weights = nn.Parameter(torch.ones(config.n_layer // 2))
        if config.document_masks and config.eot_id is None:
            raise ValueError("model.document_masks needs model.eot_id, the token that opens each document")
        # Holds no value: it follows .to() and tells the activation dtype and device (weightless norms cannot).
        self.register_buffer("anchor", torch.empty(0), persistent=False)
        if config.tie_embeddings:  # the output projection reuses the token embedding matrix
            self.transformer.wte.weight = self.lm_head.weight
        init_weights(self, init_seed)

    @classmethod
    def shapes_only(cls, config: GPTConfig) -> GPT:
        """The model on the meta device: names, shapes, counts and FLOPs, at no cost and no random draw."""
        with torch.device("meta"):
            return cls(config)

    @property
    def activation_dtype(self) -> torch.dtype:
        """The activations' dtype (residual stream, logits, KV cache), which every weight format keeps."""
        return self.anchor.dtype

    @property
    def device(self) -> torch.device:
        """Where the model computes (every weight's device)."""
        return self.anchor.device

    def forward(
        self, idx: Tensor, targets: Tensor | None = None, *, last_only: bool = False, kv_cache: KVCache | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """idx, targets: (B, T) token ids. Returns logits (B, T, vocab) and the mean cross-entropy over targets
        that are not IGNORE_INDEX (None without targets); last_only: logits for the final position only (B, 1, vocab).
        With a kv_cache, idx continues the sequences held in it: its positions start at kv_cache.length, its keys
        and values are appended, and the cache's padding is respected (see KVCache)."""
        config, T = self.config, idx.size(1)
        docs = document_ids(idx, config.eot_id) if config.document_masks and kv_cache is None else None
        past = kv_cache.length if kv_cache is not None else 0
        if docs is None and past + T > config.block_size:
            raise ValueError(f"sequence length {past + T} exceeds the model's block_size {config.block_size}")
        if docs is not None:  # positions restart at each document: (B, T); FlexAttention has no dropout
            pos = document_positions(docs)
            mask = document_mask(docs, flex=idx.device.type in FLEX_DEVICES and not config.dropout)
        elif kv_cache is not None:  # (T,), or (B, T) for a cache holding padded rows
            pos, mask = kv_cache.positions(T), kv_cache.attention_mask(T)
        else:
            pos, mask = torch.arange(T, device=idx.device), None
        # A token table stored in another format (weight_formats.py) joins the activations' dtype.
        x = self.transformer.wte(idx).to(self.activation_dtype)  # (B, T, C)
        if config.position == "learned":
            x = x + self.transformer.wpe(pos)
        if config.embed_norm:
            x = self.transformer.ln_e(x)
        x = self.transformer.drop(x)
        rope = None
        if config.position == "rope":  # rotary's angles, computed and cast once for every layer
            cos, sin = rotary_angles(pos, config.head_dim, config.rope_base)
            rope = cos.to(self.activation_dtype), sin.to(self.activation_dtype)
        # With unet_skips the first half's outputs are added (weighted) to the second half's inputs, last to first.
        skips, n_layer = [], config.n_layer
        for i, block in enumerate(self.transformer.h):
            if config.unet_skips and i >= n_layer - n_layer // 2:
                x = x + self.skip_weights[n_layer - 1 - i] * skips.pop()
            x = block(x, kv_cache, mask, rope)
            if config.unet_skips and i < n_layer // 2:
                skips.append(x)
        if kv_cache is not None:
            kv_cache.advance(T)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x[:, -1:] if last_only else x)  # (B, T or 1, vocab)
        if config.logit_softcap is not None:
            logits = config.logit_softcap * torch.tanh(logits / config.logit_softcap)
        if targets is None:
            return logits, None
        if last_only:
            raise ValueError("targets need logits for every position; drop last_only")
        # Loss in fp32 even under autocast: log-softmax over 50k classes is sensitive.
        return logits, F.cross_entropy(logits.float().flatten(0, 1), targets.reshape(-1), ignore_index=IGNORE_INDEX)

    def num_params(self, exclude_embeddings: bool = False) -> int:
        """Distinct parameters (a tied head counted once); exclude_embeddings drops the position table (if any), the
        token table and an untied head, leaving what scales with depth (untying the head leaves it as it is)."""
        n = sum(p.numel() for p in self.parameters())
        return n - self._lookup_params() - self.config.vocab_size * self.config.n_embd if exclude_embeddings else n

    def _lookup_params(self) -> int:
        """Parameters read by a lookup, not a matmul: a learned position table, and an untied token table."""
        positions = self.transformer.wpe.weight.numel() if "wpe" in self.transformer else 0
        return positions + (0 if self.config.tie_embeddings else self.config.vocab_size * self.config.n_embd)

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs (forward + backward) per token at sequence length seq_len: each matmul weight costs 2 per
        token forward and 4 backward (the head's and SwiGLU's count; lookups, rotary and norms do not), attention's
        QK^T and AV add 2 * 2 * T * n_embd forward per layer, times 3 with backward."""
        T = seq_len or self.config.block_size
        return 6 * (self.num_params() - self._lookup_params()) + 12 * self.config.n_layer * self.config.n_embd * T
