"""Properties of causal self-attention across MHA, GQA and MQA, both code paths, and
GPT-2's and Llama's blocks (rotary positions)."""

import itertools

import pytest
import torch

from ablation.attention_plot import attention_maps
from attention_variants import BLOCKS, IMPLS, SHARED_KV, heads
from conftest import tiny_config
from model import GPT

KV_HEADS = [4, 2, 1]  # with n_head=4: MHA, GQA, MQA


@pytest.mark.parametrize("n_kv_head, attn_impl", list(itertools.product(KV_HEADS, IMPLS)))
@pytest.mark.parametrize("block", BLOCKS)
def test_future_tokens_never_change_past_outputs(make_model, n_kv_head, attn_impl, block):
    model = make_model(n_kv_head=n_kv_head, attn_impl=attn_impl, **block)
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(0, 97, (3, 16), generator=gen)
    logits, _ = model(idx)
    for t in (0, 5, 14):
        changed = idx.clone()
        changed[:, t + 1 :] = torch.randint(0, 97, (3, 15 - t), generator=gen)
        changed_logits, _ = model(changed)
        torch.testing.assert_close(changed_logits[:, : t + 1], logits[:, : t + 1])
        # The test would be vacuous if the change did not reach later positions at all.
        assert not torch.allclose(changed_logits[:, t + 1 :], logits[:, t + 1 :])


def replicate_kv_into_mha(grouped: GPT) -> GPT:
    """An MHA model computing the same function as `grouped`, built by copying each
    key/value head to every query head of its group (an independent reference for
    the GQA head-sharing rule: query head h reads kv head h // group)."""
    cfg = grouped.config
    mha = GPT(tiny_config(**{**cfg.__dict__, "n_kv_head": cfg.n_head}))
    state = grouped.state_dict()
    group, hd, C = cfg.n_head // cfg.n_kv_head, cfg.head_dim, cfg.n_embd
    for i in range(cfg.n_layer):
        prefix = f"transformer.h.{i}.attn.c_attn."
        for suffix in ("weight", "bias") if cfg.bias else ("weight",):
            q, k, v = state[prefix + suffix].split([C, cfg.n_kv_head * hd, cfg.n_kv_head * hd])
            # (n_kv_head * hd, ...) -> (n_kv_head, hd, ...) -> each head repeated `group` times.
            k, v = (t.unflatten(0, (cfg.n_kv_head, hd)).repeat_interleave(group, 0).flatten(0, 1) for t in (k, v))
            state[prefix + suffix] = torch.cat([q, k, v])
    mha.load_state_dict(state)
    return mha.eval()


@pytest.mark.parametrize("attn_impl", IMPLS)
@pytest.mark.parametrize("n_head, n_kv_head", SHARED_KV)
@pytest.mark.parametrize("block", BLOCKS)
def test_grouped_attention_equals_mha_with_replicated_kv_heads(make_model, n_head, n_kv_head, attn_impl, block):
    grouped = make_model(**heads(n_head, n_kv_head), attn_impl=attn_impl, **block)
    mha = replicate_kv_into_mha(grouped)
    idx = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(2))
    logits, loss = grouped(idx, idx)
    mha_logits, mha_loss = mha(idx, idx)
    torch.testing.assert_close(mha_logits, logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mha_loss, loss)


def test_grouped_attention_differs_from_mha_with_other_kv_heads(make_model):
    """Guards the test above: MHA with unreplicated (independent) heads is a different function."""
    grouped = make_model(n_kv_head=1)
    other = make_model(seed=0, n_kv_head=4)
    other.load_state_dict({k: v for k, v in grouped.state_dict().items() if "c_attn" not in k}, strict=False)
    idx = torch.randint(0, 97, (2, 16))
    assert not torch.allclose(grouped(idx)[0], other(idx)[0], atol=1e-4)


@pytest.mark.parametrize("n_kv_head", KV_HEADS)
@pytest.mark.parametrize("block", BLOCKS)
def test_sdpa_and_manual_paths_agree(make_model, n_kv_head, block):
    sdpa = make_model(n_kv_head=n_kv_head, attn_impl="sdpa", dropout=0.2, **block)
    manual = make_model(n_kv_head=n_kv_head, attn_impl="manual", dropout=0.2, **block)
    manual.load_state_dict(sdpa.state_dict())
    idx = torch.randint(0, 97, (2, 16))
    torch.testing.assert_close(manual(idx)[0], sdpa(idx)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_kv_head", KV_HEADS)
def test_attention_maps_are_causal_distributions(make_model, n_kv_head):
    model = make_model(n_kv_head=n_kv_head)
    maps = attention_maps(model, torch.randint(0, 97, (2, 10)))
    assert len(maps) == 2
    assert not any(layer.attn._forward_hooks for layer in model.transformer.h)  # the report's hooks are gone
    for weights in maps:
        assert weights.shape == (2, 4, 10, 10)
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 10))
        past = torch.ones(10, 10, dtype=torch.bool).tril()
        assert torch.all(weights[..., ~past] == 0)
        assert torch.all(weights[..., past] > 0)


@pytest.mark.parametrize("n_kv_head", KV_HEADS)
@pytest.mark.parametrize("block", BLOCKS)
def test_attention_maps_are_the_weights_torchs_fused_kernel_applied(make_model, n_kv_head, block):
    """Each map, applied to the layer's values, gives what the layer's SDPA path computed."""
    model = make_model(n_kv_head=n_kv_head, attn_impl="sdpa", **block).eval()
    seen = []
    handles = [
        block.attn.register_forward_hook(lambda layer, inputs, out: seen.append((layer, inputs[0], out)))
        for block in model.transformer.h
    ]
    maps = attention_maps(model, torch.randint(0, 97, (2, 10)))
    for handle in handles:
        handle.remove()
    for weights, (layer, x, out) in zip(maps, seen):
        _, _, v = layer.heads(x)
        y = weights @ v.repeat_interleave(layer.n_head // layer.n_kv_head, dim=1)  # (B, nh, T, hd)
        torch.testing.assert_close(layer.c_proj(y.transpose(1, 2).flatten(2)), out, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attn_impl", IMPLS)
def test_dropout_on_attention_weights_only_in_training(make_model, attn_impl):
    model = make_model(dropout=0.5, attn_impl=attn_impl)
    attn = model.transformer.h[0].attn
    attn.resid_dropout = torch.nn.Identity()  # leave only the dropout on attention weights
    x = torch.randn(2, 16, 32)
    attn.train()
    first, second = attn(x), attn(x)
    assert not torch.allclose(first, second)
    attn.eval()
    torch.testing.assert_close(attn(x), attn(x))


def test_dropout_changes_outputs_in_train_mode_not_eval(make_model):
    model = make_model(dropout=0.1)
    idx = torch.randint(0, 97, (2, 16))
    model.train()
    assert not torch.allclose(model(idx)[0], model(idx)[0])
    model.eval()
    torch.testing.assert_close(model(idx)[0], model(idx)[0])


def test_zero_dropout_is_deterministic_in_train_mode(make_model):
    model = make_model(dropout=0.0).train()
    idx = torch.randint(0, 97, (2, 16))
    torch.testing.assert_close(model(idx)[0], model(idx)[0])
