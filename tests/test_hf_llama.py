"""The Llama block in and out of transformers' LlamaForCausalLM: the same logits on the
same weights (MHA, GQA, MQA), lossless round trips, transformers' greedy generate gives
our tokens, and blocks no transformers class computes are refused."""

import json
import re
from dataclasses import asdict

import huggingface_hub
import pytest
import torch
from hydra import compose, initialize_config_dir
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

import export
from conf import CONF_DIR, load_config
from data import load_tokenizer
from data.bpe import train_bpe
from hf.files import HFError, load_hf_pretrained, save_hf
from hf_reference import assert_same_logits, build, edit_config, hf_gpt2, randomized
from model import GPT, GPTConfig, Sampling, generate
from run import init_from
from run.checkpoints import CheckpointError, Checkpoints
from run.init_from import initial_model

# No power of two anywhere: 3 layers, 6 query heads of 10 dims, a 160-wide SwiGLU (2/3 of 240).
SHAPE = dict(vocab_size=997, block_size=48, n_layer=3, n_head=6, n_embd=60)
LLAMA_BLOCK = dict(position="rope", norm="rmsnorm", mlp="swiglu", bias=False, rope_base=500.0)
KV_HEADS = pytest.mark.parametrize("n_kv_head", [6, 3, 2, 1], ids=["MHA", "GQA3", "GQA2", "MQA"])


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def hf_llama(n_kv_head: int, seed: int = 0, **overrides) -> LlamaForCausalLM:
    settings = dict(
        vocab_size=997,
        max_position_embeddings=48,
        hidden_size=60,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=n_kv_head,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        bos_token_id=None,
        eos_token_id=None,
    )
    return randomized(LlamaForCausalLM(LlamaConfig(**{**settings, **overrides})), seed)


def ours(seed: int = 0, **config) -> GPT:
    torch.manual_seed(seed)
    return randomized(GPT(GPTConfig(dropout=0.0, **{**SHAPE, **LLAMA_BLOCK, **config})), seed)


def save_run(run_dir, model: GPT, tokenizer: dict) -> None:
    Checkpoints(run_dir).save(1, model, {"model": asdict(model.config), "data": {}, "tokenizer": tokenizer}, state={})


@KV_HEADS
def test_imported_llama_computes_transformers_logits(tmp_path, n_kv_head):
    reference = hf_llama(n_kv_head)
    reference.save_pretrained(tmp_path / "hf")
    config, state = load_hf_pretrained(tmp_path / "hf")
    assert (config.kv_heads, config.position, config.norm, config.mlp, config.bias) == (
        n_kv_head,
        "rope",
        "rmsnorm",
        "swiglu",
        False,
    )
    assert config.rope_base == 500.0 and config.mlp_hidden == 160
    assert_same_logits(build(config, state), reference, length=48)


@KV_HEADS
def test_exported_llama_block_loads_in_transformers_with_our_logits(tmp_path, capsys, n_kv_head):
    model = ours(n_kv_head=n_kv_head)
    save_run(tmp_path / "run", model, {"name": "char", "chars": "abcdefgh", "eot": True})
    export.main([str(tmp_path / "run"), str(tmp_path / "hf")])
    assert "LlamaForCausalLM" in capsys.readouterr().out
    reference = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(reference) is LlamaForCausalLM and reference.config.num_key_value_heads == n_kv_head
    assert_same_logits(model.eval(), reference, length=48)


@pytest.mark.parametrize("n_kv_head", [3, 1], ids=["GQA", "MQA"])
def test_transformers_import_export_round_trip_is_lossless(tmp_path, n_kv_head):
    hf_llama(n_kv_head).save_pretrained(tmp_path / "original")
    config, state = load_hf_pretrained(tmp_path / "original")
    save_hf(tmp_path / "exported", config, state)
    config_again, state_again = load_hf_pretrained(tmp_path / "exported")
    assert config_again == config and state_again.keys() == state.keys()
    assert all(torch.equal(state_again[name], state[name]) for name in state)
    original, exported = (load_file(tmp_path / d / "model.safetensors") for d in ("original", "exported"))
    exported.pop("lm_head.weight", None), original.pop("lm_head.weight", None)  # tied: either may store it
    assert exported.keys() == original.keys()
    assert all(torch.equal(exported[name], original[name]) for name in original)


@pytest.mark.parametrize("match_mha_params", [False, True])  # True widens a GQA model's SwiGLU
def test_our_export_imports_back_as_itself(tmp_path, match_mha_params):
    model = ours(n_kv_head=2, match_mha_params=match_mha_params)
    save_hf(tmp_path / "hf", model.config, model.state_dict())
    config, state = load_hf_pretrained(tmp_path / "hf")
    assert config == model.config
    assert all(torch.equal(state[name], tensor) for name, tensor in model.state_dict().items() if name in state)


@pytest.mark.parametrize("n_kv_head", [2, 1], ids=["GQA", "MQA"])
def test_auto_classes_load_the_export_and_generate_our_greedy_tokens(tmp_path, n_kv_head):
    model = ours(n_kv_head=n_kv_head, vocab_size=50257, n_layer=1).eval()
    save_run(tmp_path / "run", model, {"name": "gpt2"})
    export.main([str(tmp_path / "run"), str(tmp_path / "hf")])
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf")
    reference = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    prompt = tokenizer("Hello world, it's", return_tensors="pt")
    theirs = reference.generate(**prompt, max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    [mine] = generate(model, [prompt["input_ids"][0].tolist()], 12, Sampling(temperature=0))
    assert theirs[0, prompt["input_ids"].shape[1] :].tolist() == mine


@pytest.mark.parametrize(
    "mixed, named",
    [
        (
            dict(position="rope", norm="layernorm", mlp="swiglu", bias=False),
            "model.norm='layernorm' with model.position='rope'",
        ),
        (dict(position="rope", norm="rmsnorm", mlp="gelu", bias=True), "model.mlp='gelu', model.bias=True"),
        (
            dict(position="learned", norm="rmsnorm", mlp="gelu", bias=True),
            "model.norm='rmsnorm' with model.position='learned'",
        ),
        ({**LLAMA_BLOCK, "mlp": "relu2"}, "model.mlp='relu2' with model.position='rope'"),  # Llama's MLP is gated only
        (
            dict(qk_norm=True),
            "model.qk_norm=True with model.position='learned' is a block no transformers class "
            "computes: GPT2LMHeadModel needs qk_norm=False (model/block=gpt2); the blocks that export",
        ),
        (
            {**LLAMA_BLOCK, "logit_softcap": 30.0},
            "model.logit_softcap=30.0 with model.position='rope' is a block no "
            "transformers class computes: LlamaForCausalLM needs logit_softcap=None",
        ),
    ],
)
def test_a_block_no_transformers_class_computes_is_refused_in_one_line(tmp_path, mixed, named):
    model = randomized(GPT(GPTConfig(**SHAPE, **mixed)), 0)
    save_run(tmp_path / "run", model, {"name": "char", "chars": "ab", "eot": True})
    with pytest.raises(SystemExit, match="cannot export: " + re.escape(named)) as raised:
        export.main([str(tmp_path / "run"), str(tmp_path / "hf")])
    assert "\n" not in str(raised.value)
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize(
    "change, reason",
    [
        (
            {
                "rope_parameters": {
                    "rope_type": "llama3",
                    "rope_theta": 500.0,
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 16,
                }
            },
            "rope_type='llama3'",
        ),
        ({"rms_norm_eps": 1e-6}, r"rms_norm_eps=1e-06 \(supported: 1e-05\)"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
        ({"intermediate_size": 150}, "intermediate_size=150: gptlab's swiglu MLP is 160 wide"),
    ],
)
def test_llama_configs_gptlab_cannot_reproduce_are_refused(tmp_path, change, reason):
    hf_llama(2).save_pretrained(tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with pytest.raises(HFError, match=reason):
        load_hf_pretrained(tmp_path / "hf")


def test_an_untied_head_imports_with_transformers_logits_and_exports_back_as_it_was(tmp_path):
    reference = hf_llama(2, tie_word_embeddings=False)
    reference.save_pretrained(tmp_path / "original")
    path = tmp_path / "original" / "config.json"
    path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != "tie_word_embeddings"}))
    config, state = load_hf_pretrained(tmp_path / "original")  # left out: LlamaConfig's default, untied
    assert not config.tie_embeddings and torch.equal(state["lm_head.weight"], reference.lm_head.weight)
    assert_same_logits(build(config, state), reference, length=48)
    save_hf(tmp_path / "exported", config, state)
    assert json.loads((tmp_path / "exported" / "config.json").read_text())["tie_word_embeddings"] is False
    original, exported = (load_file(tmp_path / d / "model.safetensors") for d in ("original", "exported"))
    assert exported.keys() == original.keys()
    assert all(torch.equal(exported[name], original[name]) for name in original)


def test_init_from_hf_starts_a_run_from_llama_weights_pooled_to_fewer_kv_heads(tmp_path):
    model = ours(n_kv_head=6, vocab_size=50257, n_layer=1)
    save_hf(tmp_path / "hf", model.config, model.state_dict(), load_tokenizer({"name": "gpt2"}))
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(
            config_name="train",
            overrides=[
                "init_from=hf",
                f"model_path={tmp_path / 'hf'}",
                "model.n_kv_head=3",
                "model.block_size=32",
                "model.n_head=6",
                "model.n_embd=60",
            ],
        )  # the shape comes from the weights; these only validate
    config, state = initial_model(load_config(cfg), load_tokenizer({"name": "gpt2"}))
    assert (config.kv_heads, config.block_size, config.position, config.mlp, config.rope_base) == (
        3,
        32,
        "rope",
        "swiglu",
        500.0,
    )
    k_proj = load_file(tmp_path / "hf" / "model.safetensors")["model.layers.0.self_attn.k_proj.weight"]
    pooled_k = state["transformer.h.0.attn.c_attn.weight"][60:90]  # after the 60 query rows, 3 heads of 10
    expected = torch.cat([(k_proj[20 * g : 20 * g + 10] + k_proj[20 * g + 10 : 20 * g + 20]) / 2 for g in range(3)])
    torch.testing.assert_close(pooled_k, expected)
    build(config, state)(torch.zeros(1, 32, dtype=torch.long))  # the pooled, shorter model runs


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_theta": 500.0},
        {"rope_theta": 500.0, "rope_parameters": {"rope_type": "default"}},
    ],
    ids=["transformers-4", "theta-outside-rope_parameters"],
)
def test_a_rope_theta_outside_rope_parameters_imports_with_transformers_logits(tmp_path, rope):
    hf_llama(2).save_pretrained(tmp_path / "hf")
    edit_config(tmp_path / "hf", dropped=("rope_parameters",), **rope)
    reference = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    config, state = load_hf_pretrained(tmp_path / "hf")
    assert config.rope_base == reference.config.rope_parameters["rope_theta"] == 500.0
    assert_same_logits(build(config, state), reference, length=48)


LINEAR_X4 = {"factor": 4.0}
DEFAULT_500 = {"rope_type": "default", "rope_theta": 500.0}


# Each spelling, with how transformers 5 reads it (checked below): 4.x's rope_scaling, when set,
# replaces rope_parameters whole (its rope_theta then comes from the top level or is 10000), and
# "rope_type" is read first, then 4.x's "type".
@pytest.mark.parametrize(
    "rope, their_type, their_theta",
    [
        ({"rope_theta": 500.0, "rope_scaling": {"type": "linear", **LINEAR_X4}}, "linear", 500.0),
        ({"rope_theta": 500.0, "rope_scaling": {"rope_type": "linear", **LINEAR_X4}}, "linear", 500.0),
        ({"rope_parameters": DEFAULT_500, "rope_scaling": {"type": "linear", **LINEAR_X4}}, "linear", 10000.0),
        ({"rope_parameters": {"type": "dynamic", "factor": 2.0, "rope_theta": 500.0}}, "dynamic", 500.0),
        ({"rope_parameters": {**DEFAULT_500, "type": "linear", **LINEAR_X4}}, "default", 500.0),
        ({"rope_theta": 500.0, "rope_scaling": {"type": "default"}}, "default", 500.0),
        ({"rope_theta": 500.0, "rope_scaling": None}, "default", 500.0),
    ],
    ids=["4-type", "4-rope_type", "5-default-4-scaling", "5-type", "rope_type-over-type", "4-type-default", "4-null"],
)
def test_rotary_settings_are_read_as_transformers_reads_them_and_scaling_is_refused(
    tmp_path, rope, their_type, their_theta
):
    hf_llama(2).save_pretrained(tmp_path / "hf")
    edit_config(tmp_path / "hf", dropped=("rope_parameters",), **rope)
    theirs = AutoConfig.from_pretrained(tmp_path / "hf").rope_parameters
    assert (theirs["rope_type"], theirs["rope_theta"]) == (their_type, their_theta)
    if their_type == "default":
        assert load_hf_pretrained(tmp_path / "hf")[0].rope_base == their_theta
    else:
        with pytest.raises(HFError, match=f"rotary scaling rope_type='{their_type}'"):
            load_hf_pretrained(tmp_path / "hf")


def test_a_head_dim_other_than_hidden_over_heads_is_refused_by_name_in_one_line(tmp_path):
    hf_llama(2, head_dim=20).save_pretrained(tmp_path / "hf")  # transformers computes it: 6 heads of 20 dims
    with pytest.raises(HFError, match=r"head_dim=20 \(supported: hidden_size / num_attention_heads = 10\)") as raised:
        load_hf_pretrained(tmp_path / "hf")
    assert "\n" not in str(raised.value)


def saved_with(directory, model: torch.nn.Module, change) -> None:
    """model saved to directory, its stored tensors then passed through change(state)."""
    model.save_pretrained(directory)
    state = load_file(directory / "model.safetensors")
    change(state)
    save_file(state, directory / "model.safetensors")


FAMILIES = pytest.mark.parametrize(
    "make, embedding",
    [
        (lambda: hf_llama(2), "model.embed_tokens.weight"),
        (lambda: hf_gpt2(), "transformer.wte.weight"),
    ],
    ids=["llama", "gpt2"],
)


@FAMILIES
def test_a_tied_file_whose_stored_head_is_another_matrix_is_refused(tmp_path, make, embedding):
    saved_with(tmp_path / "hf", make(), lambda state: state.update({"lm_head.weight": state[embedding] + 0.01}))
    with pytest.raises(HFError, match=f"lm_head.weight differs from {embedding}, but config.json ties them"):
        load_hf_pretrained(tmp_path / "hf")


@FAMILIES
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused_at_import_naming_the_tensor(tmp_path, make, embedding, value):
    saved_with(tmp_path / "hf", make(), lambda state: state[embedding].view(-1)[7].fill_(value))
    with pytest.raises(HFError, match=f"NaN or infinite values, in {embedding}$"):
        load_hf_pretrained(tmp_path / "hf")


def test_init_from_hf_refuses_weights_trained_on_another_tokenizer_before_reading_them(tmp_path, monkeypatch):
    """A run trains on GPT-2's ids; weights whose tokenizer.json is another (a trained BPE) would read
    them as other words."""
    model = ours(vocab_size=512, n_layer=1)
    save_hf(
        tmp_path / "hf", model.config, model.state_dict(), train_bpe(["text to learn a few merges from " * 40], 300)
    )
    monkeypatch.setattr(init_from, "load_hf_pretrained", lambda *args, **kwargs: pytest.fail("the weights were read"))
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="train", overrides=["init_from=hf", f"model_path={tmp_path / 'hf'}"])
    with pytest.raises(
        CheckpointError, match=r"hf's tokenizer.json is not GPT-2's \(bpe, \d+ ids\), and init_from=hf "
    ):
        initial_model(load_config(cfg), load_tokenizer({"name": "gpt2"}))
