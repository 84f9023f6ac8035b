"""The KV cache computes exactly what a full forward pass computes, on every device present
(tests/devices.py: the CPU always, CUDA when there is one), for MHA, GQA and MQA at
realistic head counts on both attention paths, in GPT-2's block and in Llama's, whose
rotary positions must be applied at each token's absolute position (tests/attention_variants.py).

Reference: the model's own uncached forward over the whole (unpadded) sequence, on the
same device in the same dtype. Tolerances: tests/devices.py. The cached path only
changes the order of floating-point work (one query row at a time against the stored
keys), so results agree to a few ulps; a wrong position, mask or head mapping is off by
~1e-1.
"""

import pytest
import torch

from attention_variants import BLOCKS, IMPLS, LAYOUTS, heads
from devices import DEVICES, tolerance, true_fp32  # noqa: F401 (a fixture)
from model import KVCache

TOL = dict(rtol=1e-5, atol=1e-5)
pytestmark = pytest.mark.usefixtures("true_fp32")


def tokens(*shape: int, seed: int = 0, device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.randint(0, 97, shape, generator=torch.Generator().manual_seed(seed)).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("attn_impl", IMPLS)
@pytest.mark.parametrize("n_head, n_kv_head", LAYOUTS)
@pytest.mark.parametrize("block", BLOCKS)
def test_prefill_then_one_token_at_a_time_equals_full_forward(make_model, device, n_head, n_kv_head, attn_impl, block):
    model = make_model(**heads(n_head, n_kv_head), attn_impl=attn_impl, **block).to(device)
    idx = tokens(3, 16, device=device)
    full, _ = model(idx)
    cache = KVCache(model.config, batch_size=3, device=device)
    prefill, _ = model(idx[:, :6], kv_cache=cache)
    torch.testing.assert_close(prefill, full[:, :6], **tolerance(device))
    for t in range(6, 16):
        step, _ = model(idx[:, t : t + 1], kv_cache=cache, last_only=True)
        torch.testing.assert_close(step[:, 0], full[:, t], **tolerance(device))
    assert cache.length == 16


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("attn_impl", IMPLS)
@pytest.mark.parametrize("n_head, n_kv_head", LAYOUTS)
@pytest.mark.parametrize("block", BLOCKS)
def test_chunks_on_a_filled_cache_equal_full_forward(make_model, device, n_head, n_kv_head, attn_impl, block):
    """A multi-token chunk after cached positions needs a bottom-right causal mask."""
    model = make_model(**heads(n_head, n_kv_head), attn_impl=attn_impl, **block).to(device)
    idx = tokens(2, 16, seed=1, device=device)
    full, _ = model(idx)
    cache = KVCache(model.config, batch_size=2, device=device)
    pieces = [model(idx[:, a:b], kv_cache=cache)[0] for a, b in [(0, 5), (5, 9), (9, 10), (10, 16)]]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, **tolerance(device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("attn_impl", IMPLS)
@pytest.mark.parametrize("n_head, n_kv_head", LAYOUTS)
@pytest.mark.parametrize("block", BLOCKS)
def test_left_padded_batch_equals_each_sequence_alone(make_model, device, dtype, n_head, n_kv_head, attn_impl, block):
    model = make_model(**heads(n_head, n_kv_head), attn_impl=attn_impl, **block).to(device, dtype)
    lengths = [16, 9, 3]  # prompt lengths 11, 4, 0 (the last rows padded), then 5 decoded tokens
    rows = [tokens(1, n, seed=10 + i, device=device)[0] for i, n in enumerate(lengths)]
    pad = [16 - n for n in lengths]  # 0, 7, 13: row 2's padding runs past the 11-wide prefill
    batch = torch.stack([torch.cat([torch.zeros(p, dtype=torch.long, device=device), r]) for p, r in zip(pad, rows)])
    cache = KVCache(model.config, batch_size=3, device=device, dtype=dtype)
    cache.reset(torch.tensor(pad, device=device))
    with torch.inference_mode():
        prefill, _ = model(batch[:, :11], kv_cache=cache)
        steps = [model(batch[:, t : t + 1], kv_cache=cache, last_only=True)[0] for t in range(11, 16)]
        cached = torch.cat([prefill, *steps], dim=1)  # (3, 16, vocab), padding columns included
        assert torch.isfinite(cached).all()
        for i, row in enumerate(rows):
            alone, _ = model(row[None])  # the row without padding, uncached
            assert cached[i, pad[i] :].shape == alone[0].shape
            torch.testing.assert_close(cached[i, pad[i] :].float(), alone[0].float(), **tolerance(device, dtype))


@pytest.mark.parametrize("device", DEVICES)
def test_padding_changes_nothing_when_masked_but_would_if_attended(make_model, device):
    """Guards the test above: padding tokens are attended to unless the cache masks them."""
    model = make_model().to(device)
    row = tokens(1, 6, seed=3, device=device)
    padded = torch.cat([torch.full((1, 4), 7, device=device), row], dim=1)
    alone, _ = model(row, last_only=True)
    masked = KVCache(model.config, 1, device=device)
    masked.reset(torch.tensor([4], device=device))
    torch.testing.assert_close(model(padded, kv_cache=masked, last_only=True)[0], alone, **tolerance(device))
    unmasked = KVCache(model.config, 1, device=device)
    assert not torch.allclose(model(padded, kv_cache=unmasked, last_only=True)[0], alone, atol=1e-3)


@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
def test_cache_shape_and_size_follow_n_kv_head(make_model, n_kv_head):
    config = make_model(n_kv_head=n_kv_head).config
    cache = KVCache(config, batch_size=3, max_len=10)
    assert len(cache.keys) == len(cache.values) == config.n_layer
    assert all(t.shape == (3, n_kv_head, 10, 8) for t in cache.keys + cache.values)
    # keys and values, 2 layers, batch 3, n_kv_head heads, 10 positions, head_dim 8, fp32
    assert cache.nbytes == 2 * 2 * 3 * n_kv_head * 10 * 8 * 4
    assert cache.megabytes == cache.nbytes / 2**20


def test_mqa_cache_is_n_head_times_smaller_than_mha(make_model):
    mha = KVCache(make_model(n_kv_head=4).config, batch_size=2)
    mqa = KVCache(make_model(n_kv_head=1).config, batch_size=2)
    assert mha.nbytes == 4 * mqa.nbytes


def test_cache_takes_the_requested_dtype(make_model):
    cache = KVCache(make_model().config, 1, dtype=torch.bfloat16)
    assert cache.keys[0].dtype == torch.bfloat16 and cache.nbytes == 2 * 2 * 4 * 16 * 8 * 2


def test_positions_past_block_size_are_rejected(make_model):
    model = make_model()
    cache = KVCache(model.config, 1)
    model(tokens(1, 12), kv_cache=cache)
    with pytest.raises(ValueError, match="sequence length 17 exceeds the model's block_size 16"):
        model(tokens(1, 5), kv_cache=cache)


def test_writing_past_max_len_is_rejected(make_model):
    model = make_model()
    cache = KVCache(model.config, 1, max_len=8)
    model(tokens(1, 8), kv_cache=cache)
    with pytest.raises(ValueError, match="KV cache holds 8 positions; 9 were asked for"):
        model(tokens(1, 1), kv_cache=cache)


def test_reset_empties_the_cache_for_new_sequences(make_model):
    model = make_model()
    cache = KVCache(model.config, 1)
    model(tokens(1, 10, seed=4), kv_cache=cache)
    cache.reset()
    idx = tokens(1, 7, seed=5)
    torch.testing.assert_close(model(idx, kv_cache=cache)[0], model(idx)[0], **TOL)
