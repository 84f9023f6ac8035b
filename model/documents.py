"""Document masks: attention that stays inside each document of a training window.

The shards put the end-of-text token before every document but the first (data/shards.py), so it opens one. With
GPTConfig.document_masks a query attends only to earlier keys of its own document and positions restart at each
opening, so every document of a window is computed as if alone. On CUDA the mask is a FlexAttention block mask (its
compiled kernel skips the blocks the mask empties); elsewhere, and with dropout, a boolean mask for SDPA or manual
attention. Generation is one document: the KV-cache path never masks documents.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

# Devices whose document masks are FlexAttention block masks (tests add the CPU, to run the
# same mask through FlexAttention's unfused implementation there).
FLEX_DEVICES = ("cuda",)


def document_ids(idx: Tensor, eot_id: int) -> Tensor:
    """(B, T) index of each token's document within its window: 0 until the first end-of-text
    token, which opens document 1, and so on."""
    return (idx == eot_id).cumsum(dim=1)


def document_positions(docs: Tensor) -> Tensor:
    """(B, T) position of each token within its document, 0 at the document's first token."""
    t = torch.arange(docs.size(1), device=docs.device).expand_as(docs)
    opens = torch.ones_like(docs, dtype=torch.bool)
    opens[:, 1:] = docs[:, 1:] != docs[:, :-1]
    return t - torch.where(opens, t, 0).cummax(dim=1).values


def document_mask(docs: Tensor, flex: bool) -> Tensor | BlockMask:
    """Block-causal attention over documents docs (B, T): a FlexAttention BlockMask when flex,
    else a boolean (B, 1, T, T) mask, True where a query may attend."""
    B, T = docs.shape
    if flex:

        def same_document(b: Tensor, h: Tensor, q: Tensor, k: Tensor) -> Tensor:
            return (k <= q) & (docs[b, q] == docs[b, k])

        return create_block_mask(same_document, B, None, T, T, device=docs.device)
    causal = torch.ones(T, T, dtype=torch.bool, device=docs.device).tril()
    return (causal & (docs[:, :, None] == docs[:, None, :]))[:, None]


def flex_attend(q: Tensor, k: Tensor, v: Tensor, block_mask: BlockMask) -> Tensor:
    """Attention under block_mask. q: (B, nh, T, hd); k, v: (B, nkv, T, hd). Compiled on CUDA."""
    attend = _compiled_flex() if q.is_cuda else flex_attention
    return attend(q, k, v, block_mask=block_mask, enable_gqa=q.size(1) != k.size(1))


@functools.cache
def _compiled_flex():
    """FlexAttention fused into a kernel (uncompiled it materialises every score), built on first use."""
    return torch.compile(flex_attention, dynamic=False)
