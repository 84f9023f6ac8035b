"""The modern (modded-nanogpt) model settings: qk_norm, mlp=relu2, zero_init_proj,
tie_embeddings=false and logit_softcap, each against a formula written out here, in
GPT-2's block, Llama's and nanochat's; and the defaults still build GPT-2's model."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attention_variants import BLOCKS
from model import KVCache, Sampling, generate, to_weight_format
from model.config import NORM_EPS
from model.rotary import apply_rotary, rotary_angles
from run.checkpoints import Checkpoints, load_checkpoint, load_weights
from test_generate import reference_sampled

MODERN = dict(qk_norm=True, mlp="relu2", tie_embeddings=False, logit_softcap=5.0)  # zero_init_proj: its own test
TOL = dict(rtol=1e-5, atol=1e-5)


def tokens(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 97, shape, generator=torch.Generator().manual_seed(seed))


def rms(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + NORM_EPS)


@pytest.mark.parametrize("block", BLOCKS)
def test_qk_norm_attention_equals_rms_normed_heads_then_attention(make_model, block):
    attn = make_model(n_kv_head=2, **{**block, "qk_norm": True}).transformer.h[0].attn  # 4 query heads, 2 kv heads of 8
    x = torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(1))
    qkv = x @ attn.c_attn.weight.T + (attn.c_attn.bias if attn.c_attn.bias is not None else 0)
    q = qkv[..., :32].view(2, 6, 4, 8).transpose(1, 2)
    k, v = (qkv[..., start : start + 16].view(2, 6, 2, 8).transpose(1, 2) for start in (32, 48))
    q, k = rms(q), rms(k)
    if block:  # Llama's and nanochat's blocks: rotary after the norm
        cos, sin = rotary_angles(torch.arange(6), 8, attn.rope_base)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 6, 32)
    with torch.no_grad():
        torch.testing.assert_close(attn(x), attn.c_proj(y), **TOL)


def test_qk_norm_uses_the_documented_eps_where_it_shows(make_model):
    """At activations near 1e-3 (mean square 1e-6) the eps is most of the denominator: 1e-5,
    as model.qk_norm's documentation and Llama's rms_norm_eps say, not 1e-6 nor none."""
    attn = make_model(qk_norm=True).transformer.h[0].attn
    x = 1e-3 * torch.randn(1, 3, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        q, k, _ = attn.heads(x)
        qkv = attn.c_attn(x)
    raw_q = qkv[..., :32].view(1, 3, 4, 8).transpose(1, 2)
    documented = raw_q / torch.sqrt(raw_q.pow(2).mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(q, documented, rtol=1e-4, atol=1e-6)
    assert q.pow(2).mean() < 0.5  # the eps shows: an eps-free norm would give mean square 1


@pytest.mark.parametrize("n_kv_head", [1, 2])
@pytest.mark.parametrize("block", BLOCKS)
def test_cached_decoding_equals_the_full_forward_with_every_modern_piece(make_model, block, n_kv_head):
    model = make_model(n_kv_head=n_kv_head, **{**block, **MODERN})
    idx = tokens(2, 12)
    cache = KVCache(model.config, batch_size=2)
    with torch.no_grad():
        full, _ = model(idx)
        prefill, _ = model(idx[:, :7], kv_cache=cache)
        steps = [model(idx[:, t : t + 1], kv_cache=cache, last_only=True)[0] for t in range(7, 12)]
    torch.testing.assert_close(torch.cat([prefill, *steps], dim=1), full, **TOL)


@pytest.mark.parametrize("block", BLOCKS)
def test_sampling_with_every_modern_piece_equals_the_uncached_reference(make_model, block):
    settings = {**block, **MODERN, "logit_softcap": 1.0}
    model = make_model(n_kv_head=2, zero_init_proj=True, **settings).double()  # float64: as in test_generate
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():  # as if trained: zero projections would leave attention out of the logits, and
        for layer in model.transformer.h:  # logits of std ~2 meet the cap (sampling sees it; argmax would not)
            for proj in (layer.attn.c_proj, layer.mlp.c_proj):
                proj.weight.normal_(0, 0.02, generator=generator)
        model.lm_head.weight.normal_(0, 0.4, generator=generator)
    prompts = [tokens(n, seed=n).tolist() for n in (3, 9, 14)]  # left padded by 11, 5 and 0
    sampling = Sampling(temperature=1.0, seed=5)
    out = generate(model, prompts, 24, sampling)  # every row slides past block_size (16)
    assert out == reference_sampled(model, prompts, 24, sampling)
    assert len({tuple(row) for row in out}) == 3


@pytest.mark.parametrize("block", BLOCKS)
def test_relu2_mlp_is_c_proj_of_squared_relu_of_c_fc(make_model, block):
    mlp = make_model(**{**block, "mlp": "relu2"}).transformer.h[0].mlp
    assert mlp.c_fc.out_features == 4 * 32  # GPT-2's width
    x = torch.randn(3, 5, 32)
    bias = dict(fc=mlp.c_fc.bias, proj=mlp.c_proj.bias) if mlp.c_fc.bias is not None else dict(fc=0, proj=0)
    hidden = torch.clamp(x @ mlp.c_fc.weight.T + bias["fc"], min=0) ** 2
    with torch.no_grad():
        torch.testing.assert_close(mlp(x), hidden @ mlp.c_proj.weight.T + bias["proj"], **TOL)


def test_softcap_is_c_tanh_of_the_uncapped_logits_and_bounds_them(make_model):
    cap = 0.5  # below the logits' spread, so the cap acts
    capped, plain = make_model(logit_softcap=cap), make_model()  # same seed: the same weights
    idx, targets = tokens(2, 8), tokens(2, 8, seed=1)
    with torch.no_grad():
        logits, loss = capped(idx, targets)
        z, _ = plain(idx)
    assert z.abs().max() > cap
    torch.testing.assert_close(logits, cap * torch.tanh(z / cap), **TOL)
    assert logits.abs().max() < cap
    torch.testing.assert_close(loss, F.cross_entropy(logits.flatten(0, 1), targets.flatten()), **TOL)


@pytest.mark.parametrize("block", BLOCKS)
def test_zero_init_proj_starts_every_block_as_the_identity_and_moves_no_other_weight(make_model, block):
    zeroed, plain = make_model(zero_init_proj=True, **block), make_model(**block)
    x, idx = torch.randn(2, 6, 32), tokens(2, 6)
    with torch.no_grad():
        for layer in zeroed.transformer.h:
            assert torch.equal(layer(x), x)
        embedded = zeroed.transformer.wte(idx) + (zeroed.transformer.wpe(torch.arange(6)) if not block else 0)
        if zeroed.config.embed_norm:  # nanochat's block
            embedded = zeroed.transformer.ln_e(embedded)
        embedding_path = zeroed.lm_head(zeroed.transformer.ln_f(embedded))  # no block adds anything
        torch.testing.assert_close(zeroed(idx)[0], embedding_path, rtol=0, atol=0)
    for name, tensor in zeroed.state_dict().items():
        expected = torch.zeros_like(tensor) if name.endswith("c_proj.weight") else plain.state_dict()[name]
        assert torch.equal(tensor, expected), name


def test_an_untied_head_has_its_own_weight_and_counts_once_in_the_flops(make_model):
    untied, tied = make_model(tie_embeddings=False), make_model()
    head, table = untied.lm_head.weight, untied.transformer.wte.weight
    assert head.data_ptr() != table.data_ptr() and not torch.equal(head, table)
    assert torch.equal(table, tied.transformer.wte.weight)  # the table's draw is unchanged
    assert abs(head.std().item() - 0.02) < 0.002
    assert untied.num_params() == tied.num_params() + 97 * 32
    # Without the vocabulary's matrices (token table, untied head) both are the same blocks.
    assert untied.num_params(exclude_embeddings=True) == tied.num_params(exclude_embeddings=True)
    # The same matmuls (the head once; a table lookup is no matmul): the same FLOPs.
    assert untied.flops_per_token() == tied.flops_per_token()


def test_an_untied_head_survives_a_checkpoint_round_trip(tmp_path, make_model):
    model = make_model(tie_embeddings=False)
    config = {"model": model.config.__dict__, "data": {"name": "test"}, "tokenizer": {"name": "char"}}
    state = {"step": 1, "best_val_loss": 1.0, "optimizer": {}, "scaler": {}, "rng": []}
    loaded = load_checkpoint(Checkpoints(tmp_path).save(1, model, config, state))
    assert "lm_head.weight" in loaded.model_state
    fresh = make_model(seed=2, tie_embeddings=False)
    load_weights(fresh, loaded.model_state)
    for name, tensor in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], tensor), name


@pytest.mark.parametrize("weights", ["bf16", "int8"])
def test_an_untied_model_converts_to_the_weight_formats(make_model, weights):
    model = make_model(tie_embeddings=False)
    reference = copy.deepcopy(model)
    to_weight_format(model, weights)
    assert isinstance(model.transformer.wte, nn.Embedding)  # the table keeps its own weight
    assert not isinstance(model.lm_head, nn.Linear)
    idx = tokens(2, 8)
    with torch.no_grad():
        torch.testing.assert_close(model(idx)[0], reference(idx)[0], rtol=0.05, atol=0.05)


def test_the_default_model_keeps_gpt2s_parameter_names(make_model):
    layer = [
        "ln_1.weight",
        "ln_1.bias",
        "attn.c_attn.weight",
        "attn.c_attn.bias",
        "attn.c_proj.weight",
        "attn.c_proj.bias",
        "ln_2.weight",
        "ln_2.bias",
        "mlp.c_fc.weight",
        "mlp.c_fc.bias",
        "mlp.c_proj.weight",
        "mlp.c_proj.bias",
    ]
    expected = [
        "transformer.wte.weight",
        "transformer.wpe.weight",
        *(f"transformer.h.0.{name}" for name in layer),
        "transformer.ln_f.weight",
        "transformer.ln_f.bias",
        "lm_head.weight",
    ]
    model = make_model(n_layer=1)
    assert list(model.state_dict()) == expected
    assert model.lm_head.weight is model.transformer.wte.weight
