"""The block choices of GPTConfig (position, norm, mlp; model/block=llama sets all three)
against direct computations from their formulas, GPT-2's block unchanged by them, and
Llama's block through training, exact resume, sampling, torch.compile and the heatmaps.

The cached decode of Llama's block (rotary at absolute positions, padded rows, a sliding
window) is checked with GPT-2's, over tests/attention_variants.py's BLOCKS, in
test_generate_cache.py, test_generate.py, test_generate_modes.py and test_weight_formats.py.
"""

import io
import math

import pytest
import torch
from hydra import compose, initialize_config_dir
from hypothesis import given, settings
from hypothesis import strategies as st

import sample
import train
from ablation.attention_plot import attention_maps
from attention_variants import LLAMA
from conf import CONF_DIR
from conf.sample_config import load_sample_config
from conftest import tiny_config, training_overrides
from model import GPT, GPTConfig, Sampling, generate
from model import attention as attention_module
from model.attention import CausalSelfAttention
from model.rotary import apply_rotary, rotary_angles
from run.checkpoints import find_checkpoint, load_checkpoint
from run.load import checkpoint_model
from run.metrics import read_metrics
from test_generate import reference_greedy


def rotated_by_formula(x: torch.Tensor, positions: list[int], base: float) -> torch.Tensor:
    """x (T, d) with row t rotated as RoPE's formula says, one channel pair at a time:
    channels i and i + d/2 turned by the angle positions[t] * base ** (-2i / d)."""
    T, d = x.shape
    out = torch.empty_like(x)
    for t in range(T):
        for i in range(d // 2):
            angle = positions[t] * base ** (-2 * i / d)
            a, b = x[t, i].item(), x[t, i + d // 2].item()
            out[t, i] = a * math.cos(angle) - b * math.sin(angle)
            out[t, i + d // 2] = b * math.cos(angle) + a * math.sin(angle)
    return out


def test_rotary_turns_each_channel_pair_by_its_position_times_its_frequency():
    x = torch.randn(1, 1, 6, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    positions = [0, 1, 5, 17, 100, 1023]
    cos, sin = rotary_angles(torch.tensor(positions), head_dim=10, base=500.0)
    expected = rotated_by_formula(x[0, 0], positions, base=500.0)
    # Angles are computed in fp32, as Llama's are: 1023 * 2^-24 rad off at most.
    torch.testing.assert_close(apply_rotary(x, cos, sin)[0, 0], expected, rtol=0, atol=1e-4)


def test_rotary_angles_of_padded_rows_are_each_rows_own():
    positions = torch.tensor([[0, 0, 1, 2], [0, 1, 2, 3]])  # row 0 left-padded by one
    cos, sin = rotary_angles(positions, head_dim=8, base=10000.0)
    assert cos.shape == sin.shape == (2, 1, 4, 8)  # the 1 broadcasts over heads
    for row in range(2):
        alone = rotary_angles(positions[row], head_dim=8, base=10000.0)
        torch.testing.assert_close(cos[row, 0], alone[0], rtol=0, atol=0)
        torch.testing.assert_close(sin[row, 0], alone[1], rtol=0, atol=0)


def attention_scores(layer: CausalSelfAttention, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """q . k for every head and pair of tokens of x, the tokens sitting at positions."""
    q, k, _ = layer.heads(x, rotary_angles(positions, layer.head_dim, layer.rope_base))
    k = k.repeat_interleave(layer.n_head // layer.n_kv_head, dim=1)
    return q @ k.transpose(-2, -1)


@settings(max_examples=25, deadline=None)
@given(shift=st.integers(1, 2000), seed=st.integers(0, 2**16))
def test_shifting_every_position_leaves_the_attention_scores_unchanged(shift, seed):
    """RoPE's point: q at m and k at n meet through n - m only (GQA: shared kv heads too)."""
    torch.manual_seed(seed)
    layer = CausalSelfAttention(tiny_config(n_kv_head=2, **LLAMA)).double()
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    positions = torch.arange(7)
    scores = attention_scores(layer, x, positions)
    torch.testing.assert_close(attention_scores(layer, x, positions + shift), scores, rtol=0, atol=1e-4)
    spread = attention_scores(layer, x, positions * 2)  # other distances: other scores
    assert not torch.allclose(spread, scores, atol=1e-2)


def test_rmsnorm_divides_by_the_root_mean_square_and_scales_by_its_weight():
    model = GPT(tiny_config(**LLAMA)).double()
    norm = model.transformer.h[0].ln_1
    assert [name for name, _ in norm.named_parameters()] == ["weight"]
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 2.0, 32))
    x = 3 * torch.randn(3, 5, 32, dtype=torch.float64)
    expected = x / torch.sqrt((x**2).mean(dim=-1, keepdim=True) + 1e-5) * norm.weight
    torch.testing.assert_close(norm(x), expected)


def test_swiglu_multiplies_silu_of_the_gate_by_the_up_projection():
    mlp = GPT(tiny_config(**LLAMA)).double().transformer.h[0].mlp
    x = torch.randn(2, 4, 32, dtype=torch.float64)
    gate, up = x @ mlp.c_gate.weight.T, x @ mlp.c_fc.weight.T
    expected = (gate / (1 + torch.exp(-gate)) * up) @ mlp.c_proj.weight.T
    torch.testing.assert_close(mlp(x), expected)


@settings(max_examples=50, deadline=None)
@given(n_embd=st.integers(1, 4096))
def test_swiglu_width_is_two_thirds_of_gelus_rounded_up_to_a_multiple_of_8(n_embd):
    config = GPTConfig(n_embd=n_embd, n_head=1, mlp="swiglu")
    smallest = next(h for h in range(8, 4 * n_embd + 8, 8) if 3 * h >= 2 * 4 * n_embd)
    assert config.mlp_hidden == smallest  # three matrices at least as large as GELU's two


def test_gpt2_small_swiglu_width_is_2048_and_holds_the_gelu_mlps_parameters():
    config = GPTConfig(mlp="swiglu")
    assert config.mlp_hidden == 2048
    assert 3 * 768 * config.mlp_hidden == 2 * 768 * GPTConfig().mlp_hidden


@pytest.mark.parametrize("n_kv_head", [6, 2, 1])
def test_parameter_count_is_the_documented_sum(n_kv_head):
    """Llama's block: no position table, norms with a weight only, three MLP matrices."""
    V, L, d, hd, T = 97, 3, 48, 8, 16
    model = GPT.shapes_only(
        GPTConfig(vocab_size=V, block_size=T, n_layer=L, n_head=6, n_kv_head=n_kv_head, n_embd=d, **LLAMA)
    )
    h = 128  # 2/3 of 4 * 48, rounded up to a multiple of 8
    block = 2 * d + d * (d + 2 * n_kv_head * hd) + d * d + 3 * d * h
    assert model.num_params() == V * d + L * block + d
    assert model.num_params(exclude_embeddings=True) == L * block + d
    assert model.flops_per_token(T) == 6 * model.num_params() + 12 * L * d * T
    assert not any("wpe" in name or name.endswith("bias") for name in model.state_dict())


@pytest.mark.parametrize("n_kv_head", [2, 1])
def test_match_mha_params_widens_swiglu_to_the_mha_models_size(n_kv_head):
    base = dict(vocab_size=97, n_layer=2, n_head=4, n_embd=64, **LLAMA)
    mha = GPT.shapes_only(GPTConfig(**base)).num_params()
    matched = GPT.shapes_only(GPTConfig(**base, n_kv_head=n_kv_head, match_mha_params=True)).num_params()
    assert abs(matched - mha) <= 2 * 3 * 64 / 2  # within half a hidden unit (3 * n_embd) per layer


def test_init_gives_rmsnorm_gains_of_one_and_draws_the_gate_as_the_up_projection():
    torch.manual_seed(0)
    model = GPT(tiny_config(n_embd=64, **LLAMA))
    norms = [m for m in model.modules() if isinstance(m, torch.nn.RMSNorm)]
    assert len(norms) == 5 and all(torch.equal(n.weight, torch.ones(64)) for n in norms)
    residual_std = 0.02 / math.sqrt(2 * 2)
    for block in model.transformer.h:
        for linear, std in ((block.mlp.c_gate, 0.02), (block.mlp.c_fc, 0.02), (block.mlp.c_proj, residual_std)):
            assert linear.weight.std().item() == pytest.approx(std, rel=0.05)
        assert not torch.equal(block.mlp.c_gate.weight, block.mlp.c_fc.weight)
    torch.manual_seed(0)  # an MQA model widened to MHA's size shares the gate's first units
    widened = GPT(tiny_config(n_embd=64, n_kv_head=1, match_mha_params=True, **LLAMA))
    units = model.config.mlp_hidden
    assert widened.config.mlp_hidden > units
    assert torch.equal(widened.transformer.h[1].mlp.c_gate.weight[:units], model.transformer.h[1].mlp.c_gate.weight)


GPT2_BLOCK_KEYS = [
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


def test_gpt2_block_keeps_its_parameters_initialisation_and_outputs():
    """Figures the default model computed before the block choices existed (commit ab9bff4)."""
    torch.manual_seed(1234)
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=50))
    blocks = [f"transformer.h.{i}.{key}" for i in range(2) for key in GPT2_BLOCK_KEYS]
    assert list(model.state_dict()) == [
        "transformer.wte.weight",
        "transformer.wpe.weight",
        *blocks,
        "transformer.ln_f.weight",
        "transformer.ln_f.bias",
        "lm_head.weight",
    ]
    idx = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(7))
    logits, loss = model(idx, idx)
    assert loss.item() == pytest.approx(3.521634340286255, rel=1e-6)
    expected = torch.tensor([-0.0030219056643545628, -0.02259133942425251, 0.09447461366653442, -0.24938960373401642])
    torch.testing.assert_close(logits[0, 3, :4].detach(), expected, rtol=1e-5, atol=1e-6)


def test_attention_heatmaps_see_the_weights_the_rotary_model_attends_with(monkeypatch):
    model = GPT(tiny_config(n_kv_head=2, attn_impl="manual", **LLAMA)).eval()
    idx = torch.randint(0, 97, (2, 10), generator=torch.Generator().manual_seed(2))
    attended = []

    def recording(*args):
        output, weights = manual_attention(*args)
        attended.append(weights)
        return output, weights

    manual_attention = attention_module.manual_attention
    monkeypatch.setattr(attention_module, "manual_attention", recording)
    with torch.no_grad():
        model(idx)
    monkeypatch.undo()
    maps = attention_maps(model, idx)
    assert len(maps) == len(attended) == 2
    for drawn, used in zip(maps, attended):
        torch.testing.assert_close(drawn, used)


@pytest.mark.parametrize("dynamic", [False, True])  # dynamic: what a recompile for another shape makes
def test_compiled_llama_block_traces_whole_and_computes_what_eager_computes(dynamic):
    """Dynamo captures the block in one graph and AOTAutograd differentiates it; Inductor's
    CPU code is train.py's compile test's (a cold CPU compile takes minutes), its GPU code
    test_compiled_llama_block_on_cuda's."""
    model = GPT(tiny_config(n_kv_head=2, **LLAMA))
    idx = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(3))
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=dynamic)
    _, loss = compiled(idx, idx)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    _, eager_loss = model(idx, idx)
    eager_loss.backward()
    torch.testing.assert_close(loss, eager_loss)
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, msg=name)


def run_in_process(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return train.train(compose(config_name="train", overrides=list(overrides)))


def train_losses(run_dir) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in read_metrics(run_dir) if r["kind"] == "train"]


def test_llama_block_with_gqa_trains_resumes_exactly_and_samples(tmp_path):
    overrides = [
        *training_overrides(tmp_path),
        "model/block=llama",
        "model.n_kv_head=2",
        "max_iters=6",
        "eval_interval=3",
    ]
    run_dir = run_in_process(*overrides)
    checkpoint = load_checkpoint(find_checkpoint(run_dir, runs_root=run_dir.parent))
    config = checkpoint.model_config
    assert (config.position, config.norm, config.mlp, config.bias, config.kv_heads) == (
        "rope",
        "rmsnorm",
        "swiglu",
        False,
        2,
    )
    assert "transformer.wpe.weight" not in checkpoint.model_state
    losses = train_losses(run_dir)
    assert losses[-1][1] < losses[0][1]
    run_in_process(*overrides, f"resume={run_dir / 'checkpoints' / 'step_000003'}")  # steps 4 to 6 again
    assert train_losses(run_dir) == losses
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        request = compose(
            config_name="sample",
            overrides=[f"checkpoint={run_dir}", "prompt=First", "temperature=0", "max_new_tokens=20"],
        )
    result = sample.sample(load_sample_config(request), out=io.StringIO())
    tokenizer = checkpoint.tokenizer()
    model = checkpoint_model(checkpoint, torch.device("cpu"), torch.float32)
    expected = tokenizer.decode(reference_greedy(model, tokenizer.encode("First"), 20))
    assert result["samples"][0]["text"] == expected


def cuda_llama(n_kv_head: int) -> GPT:
    torch.manual_seed(0)
    return GPT(tiny_config(n_kv_head=n_kv_head, **LLAMA)).cuda().eval()


@pytest.mark.cuda
@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
def test_cuda_graph_decode_of_the_llama_block_replays_the_static_steps(n_kv_head):
    """Rotary angles computed inside the graph from the cache's device-side positions:
    padded rows, sampled, past block_size so the window slides between replays."""
    model = cuda_llama(n_kv_head)
    prompts = [[5, 17, 3], [1, 2, 3, 4, 5, 6, 7, 8, 9], [0, 44]]
    sampling = Sampling(temperature=1.0, top_k=30, seed=7)
    assert generate(model, prompts, 30, sampling, decode="graph") == generate(
        model, prompts, 30, sampling, decode="static"
    )
    greedy = Sampling(temperature=0)
    assert generate(model, prompts, 30, greedy, decode="graph") == generate(model, prompts, 30, greedy)


@pytest.mark.cuda
def test_compiled_llama_block_on_cuda():
    model = cuda_llama(2)
    idx = torch.randint(0, 97, (2, 16), device="cuda", generator=torch.Generator("cuda").manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model)(idx)[0], model(idx)[0], rtol=1e-4, atol=1e-4)
