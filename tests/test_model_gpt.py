"""The GPT model's contract: shapes, loss, sizes, validation, and that it learns."""

import math

import pytest
import torch
import torch.nn.functional as F

from attention_variants import BLOCKS
from conf import OptimConfig
from conftest import tiny_config
from model import GPT, IGNORE_INDEX, GPTConfig
from training.optim import build_optimizer

# GPT-2 small, counted by hand (vocab 50257, tied head, biases everywhere):
#   embeddings 50257*768 + 1024*768                      = 39,383,808
#   per layer: c_attn 768*2304+2304, c_proj 768*768+768,
#              c_fc 768*3072+3072, mlp c_proj 3072*768+768,
#              ln_1 and ln_2 2*768 each                  =  7,087,872
#   ln_f 2*768                                            =      1,536
#   total 39,383,808 + 12 * 7,087,872 + 1,536             = 124,439,808
GPT2_PARAMS = 124_439_808
# Fewer kv heads shrink only c_attn: each dropped kv head removes, for both K and V,
# a 768x64 weight block and 64 biases, i.e. 2 * 64 * 769 = 98,432 parameters per layer.
PARAMS_PER_DROPPED_KV_HEAD = 12 * 2 * 64 * 769  # over 12 layers: 1,181,184


@pytest.fixture(scope="module")
def gpt2_sizes():
    sizes = {}
    for n_kv_head in (12, 4, 1):
        with torch.device("meta"):  # shapes only: no memory, no initialisation cost
            model = GPT(GPTConfig(vocab_size=50257, n_kv_head=n_kv_head))
        sizes[n_kv_head] = (model.num_params(), model.num_params(exclude_embeddings=True))
    return sizes


def test_gpt2_preset_has_gpt2_small_parameter_count(gpt2_sizes):
    total, non_embedding = gpt2_sizes[12]
    assert total == GPT2_PARAMS
    assert non_embedding == GPT2_PARAMS - 50257 * 768 - 1024 * 768  # 85,056,000


@pytest.mark.parametrize("n_kv_head", [4, 1])
def test_fewer_kv_heads_remove_exactly_the_kv_projection_weights(gpt2_sizes, n_kv_head):
    assert gpt2_sizes[n_kv_head][0] == GPT2_PARAMS - (12 - n_kv_head) * PARAMS_PER_DROPPED_KV_HEAD


def test_mqa_gpt2_parameter_count(gpt2_sizes):
    assert gpt2_sizes[1][0] == 111_446_784  # 12,993,024 fewer than MHA


@pytest.mark.parametrize(
    "preset", [dict(n_layer=4, n_head=4, n_embd=128, bias=False), dict(n_layer=12, n_head=12, n_embd=768, bias=True)]
)
@pytest.mark.parametrize("n_kv_head_divisor", [2, 4])
def test_matched_parameter_count_widens_the_mlp_to_within_one_percent(preset, n_kv_head_divisor):
    n_kv_head = preset["n_head"] // n_kv_head_divisor
    with torch.device("meta"):
        mha = GPT(GPTConfig(vocab_size=50304, **preset)).num_params()
        smaller = GPT(GPTConfig(vocab_size=50304, n_kv_head=n_kv_head, **preset)).num_params()
        matched = GPT(GPTConfig(vocab_size=50304, n_kv_head=n_kv_head, match_mha_params=True, **preset)).num_params()
    non_embedding = mha - 50304 * preset["n_embd"]
    assert smaller < mha
    assert abs(matched - mha) < 0.01 * non_embedding  # 1% of what attention and MLPs hold
    assert GPTConfig(match_mha_params=True).mlp_hidden == 4 * 768  # MHA: nothing to make up


def test_forward_shapes_and_loss_matches_cross_entropy(make_model):
    model = make_model()
    idx = torch.randint(0, 97, (3, 16))
    targets = torch.randint(0, 97, (3, 16))
    logits, loss = model(idx, targets)
    assert logits.shape == (3, 16, 97)
    torch.testing.assert_close(loss, F.cross_entropy(logits.view(-1, 97), targets.view(-1)))
    assert model(idx)[1] is None


def test_ignored_targets_do_not_count(make_model):
    model = make_model()
    idx = torch.randint(0, 97, (2, 16))
    targets = torch.randint(0, 97, (2, 16))
    masked = targets.clone()
    masked[:, :8] = IGNORE_INDEX
    logits, loss = model(idx, masked)
    expected = F.cross_entropy(logits[:, 8:].reshape(-1, 97), targets[:, 8:].reshape(-1))
    torch.testing.assert_close(loss, expected)


def test_last_only_gives_the_last_position_logits(make_model):
    model = make_model()
    idx = torch.randint(0, 97, (2, 11))
    full, _ = model(idx)
    last, _ = model(idx, last_only=True)
    assert last.shape == (2, 1, 97)
    torch.testing.assert_close(last, full[:, -1:])


def test_sequence_longer_than_block_size_is_rejected(make_model):
    with pytest.raises(ValueError, match="sequence length 17 exceeds the model's block_size 16"):
        make_model()(torch.zeros(1, 17, dtype=torch.long))


def test_lm_head_is_tied_to_token_embedding(make_model):
    model = make_model()
    assert model.lm_head.weight is model.transformer.wte.weight
    assert "lm_head.weight" in model.state_dict() and "transformer.wte.weight" in model.state_dict()


def test_gpt2_initialisation(make_model):
    model = GPT(tiny_config(n_layer=8, n_embd=256, vocab_size=2000))
    assert model.transformer.wte.weight.std().item() == pytest.approx(0.02, rel=0.05)
    resid = model.transformer.h[0].mlp.c_proj.weight.std().item()
    assert resid == pytest.approx(0.02 / math.sqrt(2 * 8), rel=0.05)
    assert torch.all(model.transformer.h[0].attn.c_attn.bias == 0)


@pytest.mark.parametrize("block", BLOCKS)
def test_layouts_built_after_the_same_seed_share_every_weight_their_shapes_allow(block):
    """Ablation arms paired by seed start alike except where the attention layout differs."""

    def build(**overrides):
        torch.manual_seed(7)
        return dict(GPT(tiny_config(**block, **overrides)).named_parameters())

    mha = build()
    C, d = 32, 8  # tiny_config: n_embd 32, 4 heads of 8
    units = tiny_config(**block).mlp_hidden  # 4 * C for GELU, 88 for SwiGLU
    inputs = [name for name in ("c_fc", "c_gate") if f"transformer.h.1.mlp.{name}.weight" in mha]
    for kv_heads, match in ((2, False), (1, True)):
        other = build(n_kv_head=kv_heads, match_mha_params=match)
        for name, weight in mha.items():
            if "c_attn" in name or "mlp.c_" in name and not name.endswith("c_proj.bias"):
                continue
            assert torch.equal(weight, other[name]), name
        attn, attn_mha = other["transformer.h.1.attn.c_attn.weight"], mha["transformer.h.1.attn.c_attn.weight"]
        kv = kv_heads * d
        assert torch.equal(attn[:C], attn_mha[:C])  # queries
        assert torch.equal(attn[C : C + kv], attn_mha[C : C + kv])  # the first key heads
        assert torch.equal(attn[C + kv :], attn_mha[2 * C : 2 * C + kv])  # the first value heads
        for part in inputs:
            fc, fc_mha = other[f"transformer.h.1.mlp.{part}.weight"], mha[f"transformer.h.1.mlp.{part}.weight"]
            assert torch.equal(fc[:units], fc_mha) and fc.shape[0] == (units if not match else fc.shape[0])
        assert torch.equal(
            other["transformer.h.1.mlp.c_proj.weight"][:, :units], mha["transformer.h.1.mlp.c_proj.weight"]
        )
    torch.manual_seed(8)
    assert not torch.equal(GPT(tiny_config()).transformer.wte.weight, mha["transformer.wte.weight"])


def test_flops_per_token_formula():
    model = GPT(tiny_config())
    cfg = model.config
    weights = model.num_params() - cfg.block_size * cfg.n_embd
    assert model.flops_per_token(8) == 6 * weights + 12 * cfg.n_layer * cfg.n_embd * 8
    assert model.flops_per_token() == model.flops_per_token(cfg.block_size)


@pytest.mark.parametrize("n_kv_head", [4, 1])
@pytest.mark.parametrize("block", BLOCKS)
def test_tiny_model_overfits_one_batch(n_kv_head, block):
    torch.manual_seed(0)
    model = GPT(tiny_config(n_kv_head=n_kv_head, **block)).train()
    idx = torch.randint(0, 97, (4, 16))
    x, y = idx[:, :-1], idx[:, 1:]
    opt = build_optimizer(model, OptimConfig(weight_decay=0.0, learning_rate=3e-3), "cpu")
    losses = []
    for _ in range(60):
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(math.log(97), rel=0.1)  # starts near uniform
    assert losses[-1] < 0.2 * losses[0]


@pytest.mark.parametrize("block", BLOCKS)
def test_bf16_autocast_forward_and_backward_on_cpu(make_model, block):
    model = make_model(**block)
    idx = torch.randint(0, 97, (2, 16))
    ref_logits, _ = model(idx)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = model(idx, idx)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    torch.testing.assert_close(logits.float(), ref_logits, rtol=0.05, atol=0.05)
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(n_embd=30), r"n_embd \(30\) must be divisible by n_head \(4\)"),
        (dict(n_kv_head=3), r"n_kv_head \(3\) must divide n_head \(4\)"),
        (dict(n_layer=0), r"^model.n_layer must be >= 1, got 0$"),
        (dict(vocab_size=-5), r"vocab_size must be >= 1, got -5"),
        (dict(n_kv_head=0), r"n_kv_head must be >= 1, got 0"),
        (dict(dropout=1.0), r"dropout must be in \[0, 1\)"),
        (dict(dropout=-0.1), r"dropout must be in \[0, 1\)"),
        (dict(attn_impl="flash"), r"attn_impl must be one of"),
        (dict(position="alibi"), r"^model.position must be one of \('learned', 'rope'\), got 'alibi'$"),
        (dict(norm="batchnorm"), r"^model.norm must be one of \('layernorm', 'rmsnorm'\)"),
        (dict(mlp="relu"), r"^model.mlp must be one of \('gelu', 'swiglu', 'relu2'\)"),
        (dict(position="rope", rope_base=0.0), r"^model.rope_base must be in \(0, inf\), got 0.0$"),
        (
            dict(position="rope", rope_base=float("inf")),
            r"^model.rope_base must be a finite number in \(0, inf\), got inf$",
        ),
        (
            dict(rope_base=500.0),
            r"^model.rope_base \(500\) is read only when position is rope, and position is "
            r"learned: set model.position=rope too, or leave rope_base unset$",
        ),
        (dict(position="rope", n_embd=36), r"position=rope needs an even head_dim \(n_embd / n_head = 9\)"),
    ],
)
def test_invalid_configs_name_the_field_and_rule(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**overrides)


def test_attention_kind_follows_head_counts():
    assert tiny_config().attention_kind == "MHA"
    assert (tiny_config().n_kv_head, tiny_config().kv_heads) == (None, 4)  # None: one kv head per query head
    assert tiny_config(n_kv_head=2).attention_kind == "GQA"
    assert tiny_config(n_kv_head=1).attention_kind == "MQA"
