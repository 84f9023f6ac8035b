"""bf16 and int8 weight formats against float references.

Tolerances, from how the products round: given the same bf16-rounded input, a product
sums in fp32 and rounds its output to bf16 (relative error 2^-9), so it agrees with the
fp32 product of the same weights to 2^-8 of sum_k |x_k w_k| (room for the output
rounding and for fp32 sums in another order). An int8 weight differs from the float
weight by at most half its row's scale, so output i moves by at most scale_i / 2 *
sum_k |x_k| on top of that.
"""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attention_variants import BLOCKS
from model import KVCache, Sampling, generate, to_decode_layout
from model.weight_formats import (
    BF16Linear,
    Int8Linear,
    dequantize_per_channel,
    quantize_per_channel,
    to_weight_format,
    weight_format,
)

GREEDY = Sampling(temperature=0)
# The fp32 lanes of one vector of torch's CPU int8 kernel, by CPU (aten/src/ATen/native/cpu/
# int8mm_kernel.cpp): it steps through a row in whole vectors, with aligned loads.
KERNEL_LANES = {"AVX-512": 16, "AVX2": 8, "ARM NEON": 8}


def random_linear(in_features=96, out_features=160, bias=True, seed=0) -> nn.Linear:
    torch.manual_seed(seed)
    linear = nn.Linear(in_features, out_features, bias=bias)
    with torch.no_grad():  # rows of very different sizes, as trained weights have
        linear.weight.mul_(torch.logspace(-2, 1, out_features)[:, None])
    return linear


def rounded(x: torch.Tensor) -> torch.Tensor:
    return x.bfloat16().float()


def product_tolerance(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """2^-8 of sum_k |x_k w_k| for each output of x @ weight^T."""
    return 2**-8 * F.linear(rounded(x).abs(), weight.detach().float().abs()) + 1e-7


def test_int8_scales_round_trip_and_no_value_is_clipped():
    weight = random_linear().weight.detach()
    values, scale = quantize_per_channel(weight)
    assert values.dtype == torch.int8 and scale.dtype == torch.bfloat16 and scale.shape == (weight.size(0),)
    assert torch.all(values.abs().amax(dim=1) == 127)  # each row's largest weight uses the whole range
    again_values, again_scale = quantize_per_channel(dequantize_per_channel(values, scale))
    assert torch.equal(again_values, values) and torch.equal(again_scale, scale)


def test_int8_error_per_weight_is_at_most_half_a_scale():
    weight = random_linear().weight.detach()
    values, scale = quantize_per_channel(weight)
    error = (dequantize_per_channel(values, scale) - weight).abs()
    assert torch.all(error <= scale.float()[:, None] / 2 + 1e-7)


def test_a_row_of_zeros_quantizes_to_zeros_with_scale_one():
    weight = random_linear().weight.detach().clone()
    weight[3] = 0
    values, scale = quantize_per_channel(weight)
    assert not values[3].any() and scale[3] == 1


@pytest.mark.parametrize("in_features", [8, 40, 96, 100, 344, 768])
def test_int8_rows_are_padded_with_zeros_to_whole_vectors_of_every_cpus_kernel(in_features):
    """The stored width is the least that every CPU's kernel reads as whole vectors, not
    only this CPU's: 16 (AVX-512) is a multiple of 8 (AVX2, NEON)."""
    layer = Int8Linear(random_linear(in_features, 4))
    width = layer.weight.shape[1]
    assert all(width % lanes == 0 for lanes in KERNEL_LANES.values())
    assert width == math.ceil(in_features / 16) * 16
    assert not layer.weight[:, in_features:].any()


@pytest.mark.parametrize("rows", [1, 7])
@pytest.mark.parametrize("in_features", [96, 88, 40, 100])  # 88, 40: part vectors on AVX-512; 100 on AVX2 too
def test_int8_product_equals_the_float_product_of_its_dequantized_weight(rows, in_features):
    linear = random_linear(in_features)
    x = torch.randn(rows, linear.in_features)
    values, scale = quantize_per_channel(linear.weight)
    dequantized = dequantize_per_channel(values, scale)
    reference = F.linear(rounded(x), dequantized, linear.bias)
    assert torch.all((Int8Linear(linear)(x) - reference).abs() <= product_tolerance(x, dequantized))


@pytest.mark.parametrize("tied", [True, False])
def test_int8_with_an_n_embd_of_whole_avx2_but_not_avx512_vectors(make_model, tied):
    """n_embd 40: the head's rows are padded, and the token table (the head's rows when
    tied, else the fp32 table as it was) is n_embd wide."""
    model = make_model(n_embd=40, tie_embeddings=tied)
    reference = copy.deepcopy(model)
    to_weight_format(model, "int8")
    values, scale = quantize_per_channel(reference.lm_head.weight)
    idx = torch.tensor([[1, 5, 96, 0]])
    expected_table = dequantize_per_channel(values, scale)[idx] if tied else reference.transformer.wte(idx)
    assert model.lm_head.weight.shape == (97, 48) and torch.equal(model.transformer.wte(idx), expected_table)
    with torch.no_grad():
        logits, _ = model(idx)
        expected, _ = reference(idx)
    torch.testing.assert_close(logits, expected, rtol=0.05, atol=0.05)


def test_int8_product_stays_within_the_quantization_bound_of_the_float_weight():
    linear = random_linear()
    x = torch.randn(5, linear.in_features)
    _, scale = quantize_per_channel(linear.weight)
    exact = F.linear(rounded(x), linear.weight.detach(), linear.bias)
    bound = scale.float() / 2 * rounded(x).abs().sum(dim=1, keepdim=True) + product_tolerance(x, linear.weight)
    assert torch.all((Int8Linear(linear)(x) - exact).abs() <= bound)


@pytest.mark.parametrize("path", ["onednn", "torch"])
def test_bf16_product_equals_the_float_product_of_the_rounded_weight(path):
    linear = random_linear()
    bf16 = BF16Linear(linear)
    if path == "onednn" and bf16.onednn_weight is None:
        pytest.skip("this CPU's oneDNN does not compute in bf16")
    if path == "torch":
        bf16.onednn_weight = None  # the product every other CPU and device uses
    x = torch.randn(2, 3, linear.in_features)  # leading dimensions pass through
    weight = rounded(linear.weight.detach())
    reference = F.linear(rounded(x), weight, linear.bias)
    assert torch.all((bf16(x) - reference).abs() <= product_tolerance(x, weight))


@pytest.mark.parametrize("weights", ["bf16", "int8"])
@pytest.mark.parametrize("block", BLOCKS)
def test_every_linear_is_converted_and_the_token_table_reads_the_head(make_model, weights, block):
    model = make_model(n_kv_head=2, **block)
    reference = copy.deepcopy(model)
    to_weight_format(model, weights)
    assert weight_format(model) == weights
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    idx = torch.tensor([[1, 5, 96, 0]])
    head = model.lm_head
    stored = head.weight.float() if weights == "bf16" else dequantize_per_channel(head.weight, head.scale)
    assert torch.equal(model.transformer.wte(idx), stored[idx])
    with torch.no_grad():
        logits, _ = model(idx)
        expected, _ = reference(idx)
    torch.testing.assert_close(logits, expected, rtol=0.05, atol=0.05)


@pytest.mark.parametrize("weights", ["bf16", "int8"])
def test_a_tied_token_table_reads_the_head_and_holds_no_second_copy_of_it(make_model, weights):
    model = to_weight_format(make_model(), weights)
    table = model.transformer.wte
    assert list(table.children()) == [] and list(table.buffers()) == []
    assert [name for name, _ in model.named_modules(remove_duplicate=False) if name.endswith("head")] == ["lm_head"]
    idx = torch.tensor([[3, 7]])
    assert table(idx).any()
    stored = model.lm_head.weight if weights == "int8" else model.lm_head.weight_bits
    stored.zero_()
    assert not table(idx).any()


@pytest.mark.parametrize("weights", ["bf16", "int8"])
@pytest.mark.parametrize("block", BLOCKS)
def test_a_converted_model_decodes_with_its_cache_as_without(make_model, weights, block):
    model = to_weight_format(make_model(n_kv_head=1, **block).eval(), weights)
    idx = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(0))
    cache = KVCache(model.config, 2)
    with torch.no_grad():
        full, _ = model(idx)
        prefill, _ = model(idx[:, :8], kv_cache=cache)
        steps = [model(idx[:, t : t + 1], kv_cache=cache)[0] for t in range(8, 12)]
    torch.testing.assert_close(torch.cat([prefill] + steps, dim=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("weights", ["bf16", "int8"])
def test_a_later_dtype_change_keeps_the_stored_format(make_model, weights):
    model = to_weight_format(make_model(), weights)
    stored = {name: b.clone() for name, b in model.named_buffers()}
    start = [5, 17, 3]
    tokens = generate(model.eval(), [start], 8, GREEDY)
    model.double().float()
    assert all(torch.equal(b, stored[name]) for name, b in model.named_buffers())
    assert generate(model, [start], 8, GREEDY) == tokens


@pytest.mark.parametrize("weights", ["bf16", "int8"])
@pytest.mark.parametrize("block", BLOCKS)
def test_a_converted_model_computes_in_bf16_activations_too(make_model, weights, block):
    model = to_weight_format(make_model(**block), weights).to(torch.bfloat16)
    with torch.no_grad():
        logits, _ = model(torch.tensor([[5, 17, 3]]))
    assert logits.dtype == model.activation_dtype == torch.bfloat16
    assert len(generate(model, [[5, 17, 3]], 6, GREEDY)[0]) == 6


def test_fp32_leaves_the_model_as_it_is(make_model):
    model = make_model()
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert to_weight_format(model, "fp32") is model and weight_format(model) == "fp32"
    assert linears == [m for m in model.modules() if isinstance(m, nn.Linear)]


def test_a_converted_model_is_not_converted_again(make_model):  # unknown formats: sample.py's settings refuse them
    with pytest.raises(ValueError, match="the model's weights are already bf16: convert the fp32 model"):
        to_weight_format(to_weight_format(make_model(), "bf16"), "int8")


@pytest.mark.parametrize("change", ["to_bf16", "double"])
def test_a_dtype_change_after_the_decode_layout_keeps_it_but_for_the_shared_buffer(make_model, change):
    """to_decode_layout then .to(dtype) gives the values and strides of the other order (torch
    keeps a dense tensor's strides as it converts it); to_decode_layout again puts the
    converted weights back into one buffer, the layout of the other order."""
    convert = (lambda m: m.to(torch.bfloat16)) if change == "to_bf16" else (lambda m: m.double())
    model = make_model(n_kv_head=2)
    later = convert(to_decode_layout(copy.deepcopy(model)))
    first = to_decode_layout(convert(copy.deepcopy(model)))
    for _ in range(2):
        for (name, a), (_, b) in zip(later.named_parameters(), first.named_parameters()):
            assert a.dtype == b.dtype and a.stride() == b.stride() and torch.equal(a, b), name
        column_major = later.transformer.h[0].mlp.c_fc.weight  # (128, 32): more outputs than inputs
        assert column_major.stride() == (1, column_major.size(0))
        assert later.lm_head.weight is later.transformer.wte.weight
        to_decode_layout(later)
    weights = [m.weight for m in later.modules() if isinstance(m, nn.Linear)]
    assert len({w.untyped_storage().data_ptr() for w in weights}) == 1  # packed again into one buffer


def test_a_model_never_put_in_decode_layout_keeps_plain_row_major_weights(make_model):
    model = make_model().double()
    assert all(m.weight.is_contiguous() for m in model.modules() if isinstance(m, nn.Linear))
