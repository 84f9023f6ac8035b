"""Weights laid out for decoding on a CPU.

Decoding one token multiplies every weight matrix by a vector, so a batch-1 decode
step streams all the weights from memory once and its speed is how fast they arrive.
Two choices make CPU BLAS read them faster (bench/decode.py, gpt2 preset):
- orientation: BLAS streams a matrix faster along its longer dimension, so a weight
  with at least as many outputs as inputs is stored column-major (about 1.4x faster
  than PyTorch's row-major default);
- pages: all weights share one buffer of huge pages (see memory.py; 1.01-1.11x faster
  decode in side-by-side runs, and every matrix streams 5-15% faster).
"""

from __future__ import annotations

import torch
from torch import nn

from .gpt import GPT
from .memory import huge_page_zeros

_ALIGN = 64  # bytes: every packed weight starts on a cache line


def to_decode_layout(model: GPT, huge_pages: bool = True) -> GPT:
    """Repack every Linear weight on the CPU for matrix-vector products, keeping its
    shape, values and Parameter (tied weights stay tied): column-major when it has at
    least as many outputs as inputs, row-major otherwise, all in one buffer of huge
    pages (huge_pages=False: ordinary memory, for comparison). Weights on other devices
    are left as they are. Returns the model, repacked in place.

    The last step of preparing a model for inference, after its device, dtype and weight
    format: the layout belongs to the weights' memory, and a later .to(dtype), .half() or
    move puts each converted weight in memory of its own. torch keeps the strides of a
    dense tensor it converts, so the values and the orientation survive and only the
    shared buffer is lost; calling to_decode_layout again restores it. Every weight is a
    view of the shared buffer, so torch.save of a single weight would carry all of them
    (clone it first).
    """
    assert isinstance(model, GPT), type(model)
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
