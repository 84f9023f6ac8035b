"""training.optim: which parameters each optimizer takes, AdamW's fused kernel, Muon's update
written out by hand, the schedule of each group, and torch's version."""

import math
from dataclasses import replace

import pytest
import torch
from torch import nn

from attention_variants import BLOCKS
from conf import Config, OptimConfig
from training.optim import build_optimizer, set_learning_rate
from training.step import learning_rate

MUON = OptimConfig(name="muon", learning_rate=1e-2, min_lr=1e-3, muon_lr=0.05, muon_momentum=0.9, muon_weight_decay=0.1)
# The blocks' linear layers, by hand: GPT-2's MLP has c_fc and c_proj, Llama's SwiGLU adds c_gate.
HIDDEN = {
    "gpt2": ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"),
    "llama": ("attn.c_attn", "attn.c_proj", "mlp.c_gate", "mlp.c_fc", "mlp.c_proj"),
}


def test_adamw_decays_only_matrices(make_model):
    model = make_model()
    opt = build_optimizer(model, OptimConfig(weight_decay=0.1), "cpu")
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"])
    assert all(p.dim() < 2 for p in no_decay["params"])
    assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == model.num_params()


def test_fused_cpu_adamw_updates_like_torchs_default(make_model):
    """build_optimizer's fused kernel (chosen on CPU for speed) is the same AdamW as
    torch's default foreach implementation, up to float rounding."""
    # Without biases: the key bias's true gradient is zero (softmax ignores a shift shared
    # by all keys), so Adam would amplify the two kernels' rounding noise there.
    fused_model, default_model = make_model(bias=False).train(), make_model(bias=False).train()
    fused = build_optimizer(fused_model, OptimConfig(weight_decay=0.1, learning_rate=1e-2), "cpu")
    assert fused.defaults["fused"]
    default = torch.optim.AdamW(
        [
            {"params": [p for p in default_model.parameters() if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in default_model.parameters() if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=1e-2,
        betas=(0.9, 0.95),
    )
    assert not default.defaults["fused"]
    idx = torch.randint(0, 97, (4, 16))
    for model, opt in ((fused_model, fused), (default_model, default)):
        for _ in range(5):
            model(idx, idx)[1].backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    for a, b in zip(fused_model.parameters(), default_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def names_in(optimizer, model) -> set[str]:
    ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
    return {name for name, p in model.named_parameters() if id(p) in ids}


@pytest.mark.parametrize("block", BLOCKS)
def test_muon_takes_the_blocks_linear_weights_and_adamw_the_rest(make_model, block):
    model = make_model(**block)
    kind = "llama" if block.get("mlp") == "swiglu" else "gpt2"  # nanochat's block: GPT-2's two MLP matrices
    hidden = {f"transformer.h.{i}.{layer}.weight" for i in range(model.config.n_layer) for layer in HIDDEN[kind]}
    for untied in (False, True):
        if untied:  # an untied head is 2-D like the hidden matrices, and still AdamW's
            model.lm_head.weight = nn.Parameter(model.lm_head.weight.detach().clone())
        optimizer = build_optimizer(model, MUON, "cpu")
        muon, adamw = optimizer.parts["muon"], optimizer.parts["adamw"]
        assert names_in(muon, model) == hidden
        assert names_in(adamw, model) == {name for name, _ in model.named_parameters()} - hidden
        assert ("lm_head.weight" in names_in(adamw, model)) == untied  # tied, it is transformer.wte.weight


def newton_schulz(m: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Jordan's quintic iteration X <- aX + b(XX^T)X + c(XX^T)^2 X from m scaled to norm 1, on
    its wide orientation (https://kellerjordan.github.io/posts/muon/), in float64: torch
    runs it in bf16, 1.5-2% (in norm) away from this on the matrices below."""
    a, b, c = 3.4445, -4.7750, 2.0315
    tall = m.size(0) > m.size(1)
    x = (m.T if tall else m).double()
    x = x / x.norm()
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


# optim.muon_adjust_lr: the update's per-shape scale, for a (rows, cols) matrix.
MUON_SCALES = {
    "original": lambda rows, cols: math.sqrt(max(1.0, rows / cols)),
    "match_rms_adamw": lambda rows, cols: 0.2 * math.sqrt(max(rows, cols)),
}


@pytest.mark.parametrize("adjust", sorted(MUON_SCALES))
def test_two_muon_steps_follow_the_formula(make_model, adjust):
    """Nesterov momentum B = mu B + g, update g + mu B, orthogonalised, decoupled decay,
    and the per-shape scale optim.muon_adjust_lr names; two steps, so that the
    momentum matters. (torch keeps B as a moving average, (1 - mu) times this B: the
    orthogonalisation's normalisation removes the factor.)"""
    # far from torch's defaults (0.95, 0.1)
    config = replace(MUON, muon_momentum=0.5, muon_weight_decay=2.0, muon_adjust_lr=adjust)
    model = make_model(bias=False)
    optimizer = build_optimizer(model, config, "cpu")
    generator = torch.Generator().manual_seed(0)
    params = dict(model.named_parameters())
    hidden = {
        name: params[f"transformer.h.{name}.weight"] for name in ("0.attn.c_attn", "0.attn.c_proj", "1.mlp.c_proj")
    }
    assert [p.shape for p in hidden.values()] == [(96, 32), (32, 32), (32, 128)]  # tall, square, wide
    before = {name: p.detach().double() for name, p in hidden.items()}
    expected = dict(before)
    momentum = {name: 0.0 for name in hidden}
    lr, mu, decay = config.muon_lr, config.muon_momentum, config.muon_weight_decay
    for _ in range(2):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=generator)
        for name, p in hidden.items():
            g = p.grad.double()
            momentum[name] = mu * momentum[name] + g
            scale = MUON_SCALES[adjust](*p.shape)
            expected[name] = expected[name] * (1 - lr * decay) - lr * scale * newton_schulz(g + mu * momentum[name])
        optimizer.step()
    for name, p in hidden.items():
        error = (p.detach().double() - expected[name]).norm() / (expected[name] - before[name]).norm()
        assert error < 0.05, (name, error)  # bf16's 2%; a wrong momentum, decay or scale is 8% or more


def test_the_schedule_scales_each_group_to_its_own_peak(make_model):
    config = Config(optim=MUON, max_iters=100)
    optimizer = build_optimizer(make_model(), MUON, "cpu")
    schedule = dict(min_lr=MUON.min_lr, warmup_iters=MUON.warmup_iters, decay_iters=100)
    for step, ratio in ((0, None), (MUON.warmup_iters - 1, 1.0), (60, None), (100, MUON.min_lr / MUON.learning_rate)):
        adamw_lr = learning_rate(step, max_lr=MUON.learning_rate, **schedule)
        assert set_learning_rate(optimizer, step, config) == adamw_lr
        muon_group, *adamw_groups = optimizer.param_groups
        assert all(group["lr"] == adamw_lr for group in adamw_groups)  # bit for bit, as without Muon
        assert muon_group["lr"] == pytest.approx(adamw_lr * MUON.muon_lr / MUON.learning_rate, rel=1e-12)
        if ratio is not None:  # the peak, and the end of the decay
            assert muon_group["lr"] == pytest.approx(MUON.muon_lr * ratio, rel=1e-12)


def test_muon_on_a_torch_without_it_is_refused_in_one_line(monkeypatch):
    monkeypatch.delattr(torch.optim, "Muon")
    with pytest.raises(
        ValueError,
        match=r"^optim.name=muon needs torch >= 2.9 \(torch.optim.Muon\); this is torch \S+: "
        r"upgrade torch, or use optim.name=adamw$",
    ):
        OptimConfig(name="muon")
    OptimConfig(name="adamw")  # unaffected
