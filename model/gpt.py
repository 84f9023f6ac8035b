"""The GPT-2 architecture: embeddings, pre-norm blocks, an LM head (tied to the token table
by default); the block's position encoding, norm and MLP are GPT-2's by default and Llama's
or modded-nanogpt's as chosen (GPTConfig)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import CausalSelfAttention, Rope
from .blocks import make_mlp, make_norm
from .config import GPTConfig
from .documents import FLEX_DEVICES, BlockMask, document_ids, document_mask, document_positions
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
        self.mlp = make_mlp(config)
        self.branch_scale = config.branch_scale

    def forward(
        self,
        x: Tensor,
        kv_cache: KVCache | None = None,
        mask: Tensor | BlockMask | None = None,
        rope: Rope | None = None,
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
        # Rotary positions (applied in attention) need no position table.
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
        # Holds no value: it follows the model's .to() and tells its activation dtype and device,
        # which weightless norms (norm_weight false) cannot. Not saved (persistent=False).
        self.register_buffer("anchor", torch.empty(0), persistent=False)
        if config.tie_embeddings:  # the output projection reuses the token embedding matrix
            self.transformer.wte.weight = self.lm_head.weight
        init_weights(self, init_seed)

    @classmethod
    def shapes_only(cls, config: GPTConfig) -> GPT:
        """The model on the meta device: parameter names, shapes, counts and FLOPs, with no
        memory, no initialisation cost and no draw from the random streams."""
        with torch.device("meta"):
            return cls(config)

    @property
    def activation_dtype(self) -> torch.dtype:
        """The dtype of the activations (residual stream, logits, KV cache): the anchor's, which
        every weight format keeps (weight_formats.py stores only the Linear weights, and a tied
        token table, in bf16 or int8)."""
        return self.anchor.dtype

    @property
    def device(self) -> torch.device:
        """Where the model computes: its anchor's device, which every weight shares."""
        return self.anchor.device

    def forward(
        self,
        idx: Tensor,
        targets: Tensor | None = None,
        *,
        last_only: bool = False,
        kv_cache: KVCache | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """idx, targets: (B, T) token ids. Returns logits (B, T, vocab) and the mean
        cross-entropy over targets that are not IGNORE_INDEX (None without targets).
        last_only=True computes logits for the final position only: (B, 1, vocab).

        With a kv_cache, idx continues the sequences held in the cache: its positions
        start at kv_cache.length, its keys and values are appended to the cache, and
        the cache's padding is respected (see KVCache)."""
        T = idx.size(1)
        docs = document_ids(idx, self.config.eot_id) if self.config.document_masks and kv_cache is None else None
        pos = self._positions(idx, kv_cache) if docs is None else document_positions(docs)
        x = self._embed(idx, pos)
        mask = kv_cache.attention_mask(T) if kv_cache is not None else None
        if docs is not None:  # FlexAttention has no dropout
            mask = document_mask(docs, flex=idx.device.type in FLEX_DEVICES and not self.config.dropout)
        x = self._blocks(x, kv_cache, mask, self._rope(pos))
        if kv_cache is not None:
            kv_cache.advance(T)
        x = self.transformer.ln_f(x)
        if last_only:
            x = x[:, -1:, :]
        logits = self.lm_head(x)
        if self.config.logit_softcap is not None:
            cap = self.config.logit_softcap
            logits = cap * torch.tanh(logits / cap)
        loss = None
        if targets is not None:
            if last_only:
                raise ValueError("targets need logits for every position; drop last_only")
            # Loss in fp32 even under autocast: log-softmax over 50k classes is sensitive.
            loss = F.cross_entropy(logits.float().flatten(0, 1), targets.reshape(-1), ignore_index=IGNORE_INDEX)
        return logits, loss

    def _blocks(
        self, x: Tensor, kv_cache: KVCache | None, mask: Tensor | BlockMask | None, rope: Rope | None
    ) -> Tensor:
        """The residual stream through every block; with unet_skips, the first half's outputs
        are added (weighted) to the second half's inputs, the last block taking the first's."""
        skips, n_layer = [], self.config.n_layer
        for i, block in enumerate(self.transformer.h):
            if self.config.unet_skips and i >= n_layer - n_layer // 2:
                x = x + self.skip_weights[n_layer - 1 - i] * skips.pop()
            x = block(x, kv_cache=kv_cache, mask=mask, rope=rope)
            if i < n_layer // 2:
                skips.append(x)
        return x

    def _positions(self, idx: Tensor, kv_cache: KVCache | None) -> Tensor:
        """Position ids of idx's tokens: (T,), or (B, T) for a cache holding padded rows."""
        T = idx.size(1)
        past = kv_cache.length if kv_cache is not None else 0
        if past + T > self.config.block_size:
            raise ValueError(f"sequence length {past + T} exceeds the model's block_size {self.config.block_size}")
        return kv_cache.positions(T) if kv_cache is not None else torch.arange(T, device=idx.device)

    def _embed(self, idx: Tensor, pos: Tensor) -> Tensor:
        # A token table stored in another format (weight_formats.py) joins the activations' dtype.
        x = self.transformer.wte(idx).to(self.activation_dtype)
        if self.config.position == "learned":
            x = x + self.transformer.wpe(pos)
        if self.config.embed_norm:
            x = self.transformer.ln_e(x)
        return self.transformer.drop(x)

    def _rope(self, pos: Tensor) -> Rope | None:
        """Rotary's angles at positions pos, computed once for every layer; None without rotary."""
        if self.config.position != "rope":
            return None
        cos, sin = rotary_angles(pos, self.config.head_dim, self.config.rope_base)
        return cos.to(self.activation_dtype), sin.to(self.activation_dtype)  # cast once, not per layer

    def num_params(self, exclude_embeddings: bool = False) -> int:
        """Distinct parameters (a tied head counted once). exclude_embeddings drops
        the position table (if any), the token table and an untied head, leaving what
        scales with depth (untying the head leaves this count as it is)."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            vocab_matrices = 1 if self.config.tie_embeddings else 2
            n -= self._position_params() + vocab_matrices * self.config.vocab_size * self.config.n_embd
        return n

    def _position_params(self) -> int:
        """The learned position table's size; 0 with rotary positions."""
        return self.transformer.wpe.weight.numel() if "wpe" in self.transformer else 0

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs (forward + backward) per token at sequence length seq_len.

        Every weight of a matmul costs 2 FLOPs per token forward and 4 backward
        (the head counts, and SwiGLU's three matrices; the position lookup and an untied
        token table's lookup do not, nor do rotary's and the norms' elementwise products). Attention adds
        QK^T and AV: 2 * 2 * T * n_embd forward per layer, times 3 with backward.
        """
        T = seq_len or self.config.block_size
        matmul_params = self.num_params() - self._position_params()
        if not self.config.tie_embeddings:
            matmul_params -= self.transformer.wte.weight.numel()
        attention = 12 * self.config.n_layer * self.config.n_embd * T
        return 6 * matmul_params + attention
