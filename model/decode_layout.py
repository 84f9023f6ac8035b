"""Weights laid out for decoding on a CPU, where a batch-1 decode step streams every weight once and runs as fast
as they arrive. Two choices make CPU BLAS read them faster (bench/decode.py, gpt2 preset): a weight with at least
as many outputs as inputs stored column-major (BLAS streams along the longer dimension; about 1.4x faster), and all
weights in one buffer of huge pages (memory.py; 1.01-1.11x faster decode, each matrix streaming 5-15% faster).
"""

from __future__ import annotations

import torch
from torch import nn

from .gpt import GPT
from .memory import huge_page_zeros

_ALIGN = 64  # bytes: every packed weight starts on a cache line


def to_decode_layout(model: GPT, huge_pages: bool = True) -> GPT:
    """Repack every Linear weight on the CPU in place, keeping its shape, values and Parameter (tied weights stay
    tied): column-major when it has at least as many outputs as inputs, all in one buffer of huge pages
    (huge_pages=False: ordinary memory). The last step of preparing a model for inference, after device, dtype and
    weight format: a later .to(dtype) or move keeps values and orientation but loses the shared buffer (call this
    again). Every weight is a view of the buffer, so torch.save of one weight would carry all (clone it first)."""
    weights = {id(m.weight): m.weight for m in model.modules() if isinstance(m, nn.Linear)}
    weights = [w for w in weights.values() if w.device.type == "cpu"]
    starts = [0]
    for weight in weights:
        starts.append(starts[-1] + -(-weight.nbytes // _ALIGN) * _ALIGN)
    zeros = huge_page_zeros if huge_pages else torch.zeros
    arena = zeros((starts[-1],), dtype=torch.uint8)
    with torch.no_grad():
        for weight, start in zip(weights, starts):
            out_features, in_features = weight.shape
            column_major = out_features >= in_features
            # Column-major (out, in) is row-major (in, out) memory, seen through .t().
            rows, cols = (in_features, out_features) if column_major else (out_features, in_features)
            packed = arena[start : start + weight.nbytes].view(weight.dtype).view(rows, cols)
            packed.copy_(weight.t() if column_major else weight)
            weight.data = packed.t() if column_major else packed
    return model
