"""ablation/decode.py: KV-cache bytes, decode speed on a synthetic cache, GPT-2-sized layouts."""

import math

import pytest
import torch

from ablation.decode import (
    DecodeSpeed,
    decode_tokens_per_second,
    gpt2_sized,
    kv_cache_bytes,
    kv_cache_bytes_per_token,
    measure_layout,
)
from model import GPT, GPTConfig, KVCache

LAYOUTS = {"MHA": 4, "GQA": 2, "MQA": 1}  # n_kv_head of a 4-head model


def tiny_config(n_kv_head=4, **overrides):
    return GPTConfig(vocab_size=64, block_size=64, n_layer=2, n_head=4, n_embd=32, n_kv_head=n_kv_head, **overrides)


def tiny_model(n_kv_head=4):
    torch.manual_seed(0)
    return GPT(tiny_config(n_kv_head))


@pytest.mark.parametrize("kind", LAYOUTS)
def test_kv_cache_bytes_match_the_cache(kind):
    config = tiny_config(LAYOUTS[kind])
    assert config.attention_kind == kind
    assert kv_cache_bytes_per_token(config) == 2 * 2 * LAYOUTS[kind] * 8 * 4
    for tokens in (1, 37):
        assert kv_cache_bytes(config, tokens) == KVCache(config, batch_size=1, max_len=tokens).nbytes
    assert kv_cache_bytes(config, 37, bytes_per_value=2) == KVCache(config, 1, 37, dtype=torch.bfloat16).nbytes
    assert kv_cache_bytes(config, 5 * 37) == KVCache(config, batch_size=5, max_len=37).nbytes


@pytest.mark.parametrize("train_mode", [False, True])
def test_decode_speed_is_positive_and_leaves_the_model_as_it_was(train_mode):
    model = tiny_model(2).train(train_mode)
    before = {name: p.detach().clone() for name, p in model.state_dict().items()}
    rng_before = torch.get_rng_state()
    speed = decode_tokens_per_second(model, batch=3, context=40, steps=4, repeats=2)
    assert math.isfinite(speed) and speed > 0
    assert model.training is train_mode
    assert all(m.training is train_mode for m in model.modules())
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[name], before[name]) for name in before)
    assert torch.equal(torch.get_rng_state(), rng_before)


def test_decode_speed_fills_the_cache_to_block_size_but_not_past_it():
    model = tiny_model(1).eval()
    assert decode_tokens_per_second(model, batch=1, context=60, steps=4, repeats=1) > 0  # 60 + 4 == block_size
    assert decode_tokens_per_second(model, batch=1, context=0, steps=2, repeats=1) > 0  # an empty cache too
    with pytest.raises(ValueError, match=r"exceeds the model's block_size 64: pick context <= 60"):
        decode_tokens_per_second(model, batch=1, context=61, steps=4)
    with pytest.raises(AssertionError):  # the caller's invariant
        decode_tokens_per_second(model, batch=1, context=8, steps=0)
    assert model.training is False


def test_measure_layout_covers_every_batch_and_context():
    model = tiny_model(2).eval()
    speeds = measure_layout(model, batches=(1, 2), contexts=(8, 56), steps=2, repeats=1)
    assert [(s.batch, s.context) for s in speeds] == [(1, 8), (1, 56), (2, 8), (2, 56)]
    assert all(isinstance(s, DecodeSpeed) and s.tokens_per_s > 0 for s in speeds)
    default = measure_layout(model, batches=(1,), steps=2, repeats=1)
    assert [s.context for s in default] == [4, 62]  # block_size // 16, block_size - steps


@pytest.mark.parametrize(
    "n_head, n_kv_head, kind, gpt2_kv_heads",
    [
        (4, 4, "MHA", 12),
        (4, 2, "GQA", 6),
        (4, 1, "MQA", 1),
        (8, 2, "GQA", 3),
        (12, 4, "GQA", 4),
        (8, 1, "MQA", 1),
        (16, 2, "GQA", 2),
    ],  # 16 heads, 2 shared: 1.5 of 12 rounds to 2, which keeps it GQA
)
def test_gpt2_sized_keeps_the_attention_layout(n_head, n_kv_head, kind, gpt2_kv_heads):
    config = GPTConfig(
        vocab_size=64, block_size=64, n_layer=2, n_head=n_head, n_embd=4 * n_head, n_kv_head=n_kv_head, bias=False
    )
    big = gpt2_sized(config)
    assert (big.vocab_size, big.block_size, big.n_layer, big.n_head, big.n_embd) == (50304, 1024, 12, 12, 768)
    assert big.bias is True
    assert big.n_kv_head == gpt2_kv_heads
    assert big.attention_kind == config.attention_kind == kind
