"""Weights in fewer bytes for decoding: bf16, or int8 with one scale per output channel.

A batch-1 decode step reads every weight once, so it runs as fast as the weights arrive from memory: bf16 halves
the bytes of fp32 and int8 quarters them. Only the Linear weights change format (and a tied token table, the LM
head's weight; an untied one stays, a lookup reading only its rows); norms, biases, the position table, the residual
stream and the KV cache keep the activation dtype. Each product rounds its input to bf16 and accumulates in fp32, as
torch's CPU kernels for these formats do. The stored weights are integer tensors (int8 values, bf16 bit patterns as
int16), so a later .to(dtype) or .half() changes the activations but never the format.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .gpt import GPT
from .memory import huge_page_zeros

WEIGHT_FORMATS = ("fp32", "bf16", "int8")
INT8_MAX = 127  # symmetric: -127..127, so a channel's scale is its largest |weight| / 127
# torch's CPU int8 kernel (_weight_int8pack_mm) steps through a row one vector of fp32 lanes at a time, with
# aligned loads, and so reads past the end of a row that is not a whole number of vectors: wrong products or a
# segfault, with no error. Int8Linear pads rows (and inputs) with zeros to a multiple of every CPU's lanes, so one
# layout is right on any CPU: GPT-2's widths need none; an n_embd of 40 (to 48) or mini's SwiGLU 344 (to 352) do.
INT8_KERNEL_LANES = {"AVX512": 16, "AVX2": 8, "NEON": 8}
INT8_ROW_MULTIPLE = math.lcm(*INT8_KERNEL_LANES.values())


def to_weight_format(model: GPT, weights: str) -> GPT:
    """The model with every Linear weight (a tied token table with them) stored as `weights`: fp32 leaves it as it
    is; bf16 and int8 replace each nn.Linear by a BF16Linear or Int8Linear. Converts in place, for inference, after
    the move to the model's device (int8: the CPU, where torch's int8 kernel runs; run/load.py refuses it elsewhere)."""
    assert weights in WEIGHT_FORMATS, weights
    if weights == "fp32":
        return model
    if weight_format(model) != "fp32":
        raise ValueError(f"the model's weights are already {weight_format(model)}: convert the fp32 model")
    packed = BF16Linear if weights == "bf16" else Int8Linear
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, packed(child))
    if model.config.tie_embeddings:
        model.transformer.wte = TiedEmbedding(model.lm_head)
    return model


def weight_format(model: GPT) -> str:
    """Which of WEIGHT_FORMATS the model's LM head is stored in (fp32: a plain Linear)."""
    head = model.lm_head
    return "int8" if isinstance(head, Int8Linear) else "bf16" if isinstance(head, BF16Linear) else "fp32"


def quantize_per_channel(weight: Tensor) -> tuple[Tensor, Tensor]:
    """weight (out, in) as int8 values and one bf16 scale per output row, weight ~ values * scale. Each scale is the
    row's largest |weight| / 127 rounded to the nearest bf16, which moves that weight within 0.25 of 127 * scale: it
    becomes exactly -127 or 127, and nothing is clipped, so values * scale quantizes again to the same values and
    scales. A row of zeros gets scale 1."""
    amax = weight.detach().float().abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax)).to(torch.bfloat16)
    values = (weight.detach().float() / scale.float()[:, None]).round().clamp(-INT8_MAX, INT8_MAX)
    return values.to(torch.int8), scale


def dequantize_per_channel(values: Tensor, scale: Tensor) -> Tensor:
    """The fp32 weights that int8 values (..., in) and bf16 scales (...,) stand for."""
    return values.float() * scale.float()[..., None]


def _stored(tensor: Tensor) -> Tensor:
    """A copy of tensor in huge pages on a CPU (a decode step streams it whole); elsewhere tensor itself."""
    if tensor.device.type != "cpu":
        return tensor.contiguous()
    return huge_page_zeros(tensor.shape, tensor.dtype).copy_(tensor)


class _PackedLinear(nn.Module):
    """A Linear whose weight is stored in fewer bytes: its product takes x in bf16 and returns x's dtype."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.bias = linear.bias

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, self.in_features).to(torch.bfloat16)  # (M, in)
        y = self._product(flat).view(*x.shape[:-1], self.out_features).to(x.dtype)  # (M, out) -> (..., out)
        return y if self.bias is None else y + self.bias


class BF16Linear(_PackedLinear):
    """A Linear whose weight is stored in bf16. Where oneDNN computes in bf16 (CPUs with AVX512 or newer), the product
    runs on a second copy of the weight in oneDNN's blocked layout, which one core streams about twice as fast as
    torch's bf16 matrix-vector kernel (bench/decode.py); elsewhere it is F.linear on the bf16 weight."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__(linear)
        weight = linear.weight.detach().to(torch.bfloat16)
        self.register_buffer("weight_bits", _stored(weight.view(torch.int16)))
        # Not a buffer: .to() must not touch an opaque oneDNN tensor; CPU products only.
        self.onednn_weight = _onednn_packed(weight)

    @property
    def weight(self) -> Tensor:
        return self.weight_bits.view(torch.bfloat16)  # (out, in)

    def _product(self, flat: Tensor) -> Tensor:
        if self.onednn_weight is not None and flat.device.type == "cpu":
            return torch.ops.mkldnn._linear_pointwise(flat, self.onednn_weight, None, "none", [], "")
        return F.linear(flat, self.weight)

    def rows(self, idx: Tensor) -> Tensor:
        """Rows idx of the weight, in bf16: (*idx.shape, in)."""
        return self.weight[idx]


class Int8Linear(_PackedLinear):
    """A Linear whose weight is stored as int8 with one bf16 scale per output channel; the product is torch's int8
    weight-pack matmul (CPU). Rows are stored padded with zeros to a multiple of INT8_ROW_MULTIPLE, inputs likewise."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__(linear)
        self.padding = -self.in_features % INT8_ROW_MULTIPLE
        values, scale = quantize_per_channel(linear.weight)
        self.register_buffer("weight", _stored(F.pad(values, (0, self.padding))))  # (out, in + padding) int8
        self.register_buffer("scale_bits", scale.view(torch.int16))  # (out,)

    @property
    def scale(self) -> Tensor:
        return self.scale_bits.view(torch.bfloat16)

    def _product(self, flat: Tensor) -> Tensor:
        flat = F.pad(flat, (0, self.padding)) if self.padding else flat
        return torch.ops.aten._weight_int8pack_mm(flat, self.weight, self.scale)

    def rows(self, idx: Tensor) -> Tensor:
        """Rows idx of the dequantized weight, in fp32 (exact): (*idx.shape, in)."""
        return dequantize_per_channel(self.weight[idx, : self.in_features], self.scale[idx])


class TiedEmbedding(nn.Module):
    """The token table read from the LM head it is tied to, in the head's format."""

    def __init__(self, head: BF16Linear | Int8Linear) -> None:
        super().__init__()
        # A plain attribute: the head stays the model's submodule (the table has no weights of its own).
        self.head_rows = head.rows

    def forward(self, idx: Tensor) -> Tensor:
        return self.head_rows(idx)  # GPT casts it to its activation_dtype


def _onednn_packed(weight: Tensor) -> Tensor | None:
    """weight (out, in, bf16) in oneDNN's blocked layout for small-batch products, where
    oneDNN computes bf16 and torch dispatches beyond AVX2; None elsewhere."""
    usable = (
        weight.device.type == "cpu"
        and torch.backends.mkldnn.is_available()
        and torch.ops.mkldnn._is_mkldnn_bf16_supported()
        and torch.backends.cpu.get_cpu_capability() not in ("DEFAULT", "AVX2")
    )
    return torch.ops.mkldnn._reorder_linear_weight(weight, 1) if usable else None
