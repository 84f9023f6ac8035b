"""The nanochat block in and out of transformers' NanoChatForCausalLM: our export computes our
logits there (MHA, GQA, MQA; tied and untied head; with and without a soft-cap) and generates our
greedy tokens, a NanoChat that transformers saved imports with its logits, round trips are lossless,
and what cannot export or import is refused in one line."""

import json
import sys
import types

import huggingface_hub
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, NanoChatConfig, NanoChatForCausalLM

import export
from hf.files import HFError, load_hf_pretrained, save_hf
from hf_reference import LOGITS_ATOL, assert_same_logits, build, edit_config, randomized
from model import GPT, GPTConfig, Sampling, generate
from model.config import NANOCHAT_BLOCK
from model.state import shared_names
from test_hf_llama import save_run

# No power of two anywhere: 3 layers, 6 query heads of 10 dims, relu2's 240-wide MLP.
SHAPE = dict(vocab_size=997, block_size=48, n_layer=3, n_head=6, n_embd=60, rope_base=500.0)
# (key/value heads, tied head, soft-cap): every layout, each head and cap at least twice.
VARIANTS = pytest.mark.parametrize(
    "n_kv_head, tie, cap",
    [
        (6, True, None),
        (3, False, 15.0),
        (2, True, 15.0),
        (1, False, None),
    ],
    ids=["MHA-tied", "GQA3-untied-cap", "GQA2-tied-cap", "MQA-untied"],
)


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def ours(seed: int = 0, **config) -> GPT:
    torch.manual_seed(seed)
    return randomized(GPT(GPTConfig(dropout=0.0, **{**SHAPE, **NANOCHAT_BLOCK, **config})), seed)


def hf_nanochat(n_kv_head: int, seed: int = 0, **overrides) -> NanoChatForCausalLM:
    """A random NanoChat as transformers builds it: its defaults (rms_norm_eps 1e-6, a soft-cap of 15,
    an untied head) unless overridden."""
    settings = dict(
        vocab_size=997,
        max_position_embeddings=48,
        hidden_size=60,
        intermediate_size=240,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=n_kv_head,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
    )
    return randomized(NanoChatForCausalLM(NanoChatConfig(**{**settings, **overrides})), seed)


@VARIANTS
def test_exported_nanochat_block_loads_in_transformers_with_our_logits(tmp_path, capsys, n_kv_head, tie, cap):
    model = ours(n_kv_head=n_kv_head, tie_embeddings=tie, logit_softcap=cap)
    save_run(tmp_path / "run", model, {"name": "char", "chars": "abcdefgh", "eot": True})
    export.main([str(tmp_path / "run"), str(tmp_path / "hf")])
    assert "NanoChatForCausalLM (config.json, model.safetensors)" in capsys.readouterr().out
    reference = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(reference) is NanoChatForCausalLM and reference.config.num_key_value_heads == n_kv_head
    assert (reference.config.tie_word_embeddings, reference.config.final_logit_softcapping) == (tie, cap)
    assert_same_logits(model.eval(), reference, length=48)


@pytest.mark.parametrize(
    "n_kv_head, tie, settings",
    [
        (2, True, dict(norm_weight=True)),
        (3, False, dict(norm_weight=True, branch_scale=50.0)),
        (2, True, dict(norm="layernorm", norm_weight=False)),
        (6, True, dict(norm="layernorm", branch_scale=7.0)),  # the modern recipe's block
    ],
    ids=["gains-tied", "gains-untied-scaled", "layernorm-weightless", "layernorm-gains-scaled"],
)
def test_gains_layernorm_and_branch_scale_fold_into_the_weights(tmp_path, n_kv_head, tie, settings):
    model = ours(n_kv_head=n_kv_head, tie_embeddings=tie, logit_softcap=15.0, **settings)
    gains = [
        param
        for name, param in model.named_parameters()
        if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight"))
    ]
    assert len(gains) == (2 * model.config.n_layer + 1) * model.config.norm_weight
    assert "transformer.ln_e.weight" not in model.state_dict()  # the embedding's norm has no gain
    with torch.no_grad():  # gains far from one, each its own, so a gain folded into the wrong matrix shows
        for gain in gains:
            gain.uniform_(0.3, 3.0)
        model.transformer.wte.weight.add_(0.5)  # rows far from centred, so a missed centring shows
    save_run(tmp_path / "run", model, {"name": "char", "chars": "abcdefgh", "eot": True})
    export.main([str(tmp_path / "run"), str(tmp_path / "hf")])
    reference = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert reference.config.tie_word_embeddings is False  # a gain or the centring gave the head its own matrix
    # LayerNorm's variance and RMSNorm's mean square of the centred vector round apart: 1e-4, the
    # bound the export promises, where RMSNorm to RMSNorm holds 1e-5
    atol = 1e-4 if model.config.norm == "layernorm" else LOGITS_ATOL
    assert_same_logits(model.eval(), reference, length=48, atol=atol)
    config, state = load_hf_pretrained(tmp_path / "hf")  # read back: the same function, weightless RMSNorms
    stored = (config.norm, config.norm_weight, config.branch_scale, config.tie_embeddings)
    assert stored == ("rmsnorm", False, 1.0, False)
    assert_same_logits(build(config, state), reference, length=48)


@pytest.mark.parametrize("n_kv_head, tie, cap", [(2, False, 15.0), (4, True, None)], ids=["GQA-untied-cap", "MHA-tied"])
def test_auto_classes_load_the_export_and_generate_our_greedy_tokens(tmp_path, n_kv_head, tie, cap):
    model = ours(
        n_kv_head=n_kv_head, n_head=4, n_embd=32, vocab_size=50257, n_layer=1, tie_embeddings=tie, logit_softcap=cap
    ).eval()
    save_run(tmp_path / "run", model, {"name": "gpt2"})
    export.main([str(tmp_path / "run"), str(tmp_path / "hf")])
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf")
    reference = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    prompt = tokenizer("Hello world, it's", return_tensors="pt")
    theirs = reference.generate(**prompt, max_new_tokens=12, do_sample=False)
    [mine] = generate(model, [prompt["input_ids"][0].tolist()], 12, Sampling(temperature=0))
    assert theirs[0, prompt["input_ids"].shape[1] :].tolist() == mine


@VARIANTS
def test_a_nanochat_transformers_saved_imports_with_its_logits(tmp_path, n_kv_head, tie, cap):
    reference = hf_nanochat(n_kv_head, tie_word_embeddings=tie, final_logit_softcapping=cap)
    reference.save_pretrained(tmp_path / "hf")
    config, state = load_hf_pretrained(tmp_path / "hf")
    assert {key: getattr(config, key) for key in NANOCHAT_BLOCK} == NANOCHAT_BLOCK
    assert (config.kv_heads, config.tie_embeddings, config.logit_softcap) == (n_kv_head, tie, cap)
    assert (config.norm_eps, config.rope_base, config.mlp_hidden) == (1e-6, 500.0, 240)  # NanoChatConfig's eps
    assert_same_logits(build(config, state), reference, length=48)


def test_transformers_defaults_left_out_of_config_json_are_read_as_transformers_reads_them(tmp_path):
    reference = hf_nanochat(2)  # untied, soft-cap 15, eps 1e-6: NanoChatConfig's defaults
    reference.save_pretrained(tmp_path / "hf")
    edit_config(tmp_path / "hf", dropped=("tie_word_embeddings", "final_logit_softcapping", "rms_norm_eps"))
    config, state = load_hf_pretrained(tmp_path / "hf")
    assert (config.tie_embeddings, config.logit_softcap, config.norm_eps) == (False, 15.0, 1e-6)
    assert_same_logits(build(config, state), reference, length=48)


@pytest.mark.parametrize("tie", [True, False])
def test_transformers_import_export_round_trip_is_lossless(tmp_path, tie):
    hf_nanochat(3, tie_word_embeddings=tie).save_pretrained(tmp_path / "original")
    config, state = load_hf_pretrained(tmp_path / "original")
    save_hf(tmp_path / "exported", config, state)
    assert load_hf_pretrained(tmp_path / "exported")[0] == config
    original, exported = (load_file(tmp_path / d / "model.safetensors") for d in ("original", "exported"))
    if tie:  # either may store the tied head
        exported.pop("lm_head.weight", None), original.pop("lm_head.weight", None)
    assert exported.keys() == original.keys()
    assert all(torch.equal(exported[name], original[name]) for name in original)


@pytest.mark.parametrize(
    "settings", [dict(n_kv_head=2, match_mha_params=True), dict(n_kv_head=6, norm_eps=1e-6, logit_softcap=30.0)]
)
def test_our_export_imports_back_as_itself(tmp_path, settings):
    model = ours(**settings)
    save_hf(tmp_path / "hf", model.config, model.state_dict())
    config, state = load_hf_pretrained(tmp_path / "hf")
    assert config == model.config
    saved = {name: tensor for name, tensor in model.state_dict().items() if name not in shared_names(model.config)}
    assert state.keys() == saved.keys() and all(torch.equal(state[name], saved[name]) for name in saved)


def test_a_transformers_without_nanochat_gets_one_line_naming_the_version_needed(tmp_path, capsys, monkeypatch):
    model = ours()
    save_run(tmp_path / "run", model, {"name": "char", "chars": "ab", "eot": True})
    old = types.ModuleType("transformers")  # a release before NanoChatForCausalLM
    old.__version__ = "4.57.1"
    monkeypatch.setitem(sys.modules, "transformers", old)
    export.main([str(tmp_path / "run"), str(tmp_path / "hf")])
    assert capsys.readouterr().out.splitlines()[1] == (
        f"{tmp_path / 'hf'}: transformers 4.57.1 here has no NanoChatForCausalLM: load this directory with "
        "transformers >= 5.0"
    )


def test_the_export_says_which_transformers_loads_it(tmp_path, capsys):
    model = ours()
    save_run(tmp_path / "run", model, {"name": "char", "chars": "ab", "eot": True})
    export.main([str(tmp_path / "run"), str(tmp_path / "hf")])
    assert (
        capsys.readouterr().out.splitlines()[1]
        == f"{tmp_path / 'hf'}: loads with transformers >= 5.0 (NanoChatForCausalLM)"
    )


@pytest.mark.parametrize(
    "mixed, named",
    [
        # the modern recipe's block before nanochat's: GPT-2's norms, no embedding norm
        (
            dict(position="rope", mlp="relu2", qk_norm=True, bias=False),
            "model.embed_norm=False with model.position='rope' "
            "is a block no transformers class computes: NanoChatForCausalLM needs "
            "embed_norm=True (model/block=nanochat); the blocks that export are "
            "model/block=gpt2, model/block=nanochat, model/block=llama, and the default block trained with "
            "model.embed_norm=true model.branch_scale=50 (NanoChatForCausalLM)$",
        ),
        (
            {**NANOCHAT_BLOCK, "qk_norm": False},
            "model.qk_norm=False with model.position='rope' is a block no transformers "
            "class computes: NanoChatForCausalLM needs qk_norm=True",
        ),
        (
            dict(norm_weight=False),
            "model.norm_weight=False with model.position='learned' is a block no transformers "
            "class computes: GPT2LMHeadModel needs norm_weight=True",
        ),
    ],
)
def test_a_block_no_transformers_class_computes_names_the_blocks_that_export(tmp_path, mixed, named):
    model = randomized(GPT(GPTConfig(**{**SHAPE, "rope_base": 10000.0, **mixed})), 0)
    save_run(tmp_path / "run", model, {"name": "char", "chars": "ab", "eot": True})
    with pytest.raises(SystemExit, match="cannot export: " + named.replace("(", r"\(").replace(")", r"\)")) as raised:
        export.main([str(tmp_path / "run"), str(tmp_path / "hf")])
    assert "\n" not in str(raised.value)
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"hidden_act": "gelu"}, r"hidden_act='gelu' \(supported: 'relu2'\)"),
        ({"attention_bias": True}, r"attention_bias=True \(supported: False\)"),
        ({"rms_norm_eps": 0}, r"rms_norm_eps=0 \(supported: a positive number\)"),
        ({"final_logit_softcapping": -1.0}, r"final_logit_softcapping=-1.0 \(supported: a positive number, or null\)"),
        ({"rope_parameters": {"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0}}, "rope_type='linear'"),
        ({"intermediate_size": 200}, "intermediate_size=200: gptlab's relu2 MLP is 240 wide"),
    ],
)
def test_nanochat_configs_gptlab_cannot_reproduce_are_refused_in_one_line(tmp_path, change, reason):
    hf_nanochat(2).save_pretrained(tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with pytest.raises(HFError, match=reason) as raised:
        load_hf_pretrained(tmp_path / "hf")
    assert "\n" not in str(raised.value)
