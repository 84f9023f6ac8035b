"""Importing Hugging Face GPT-2 / GPTBigCode weights: transformers' own logits and
greedy tokens, both weight formats, K/V head pooling, and clear errors."""

import argparse

import huggingface_hub
import pytest
import torch
from safetensors.torch import save_file
from transformers import GPT2Config, GPTBigCodeConfig, LlamaConfig

import hf.gpt2
import hf.llama
from conftest import tiny_config
from hf.files import HFError, load_hf_pretrained
from hf.gpt2 import config_from_hf, pool_kv_heads
from hf_reference import TINY, assert_same_logits, build, edit_config, hf_bigcode, hf_gpt2, random_tokens
from model import GPT, GPTConfig, Sampling, generate


@pytest.fixture(scope="module")
def reference():
    return hf_gpt2(seed=0)


@pytest.fixture
def gpt2_dir(tmp_path, reference):
    reference.save_pretrained(tmp_path / "gpt2")
    return tmp_path / "gpt2"


def test_imported_gpt2_computes_transformers_logits(gpt2_dir, reference):
    config, state = load_hf_pretrained(gpt2_dir)
    assert config == GPTConfig(vocab_size=1000, block_size=64, n_layer=2, n_head=4, n_kv_head=4, n_embd=64, dropout=0.0)
    assert_same_logits(build(config, state), reference)


def test_pytorch_model_bin_imports_like_safetensors(tmp_path, reference):
    # transformers 5 writes safetensors even when asked not to; older versions pickled the
    # state dict (tied head included) with torch.save, which is what this reproduces.
    directory = tmp_path / "bin"
    reference.config.save_pretrained(directory)
    torch.save(reference.state_dict(), directory / "pytorch_model.bin")
    assert_same_logits(build(*load_hf_pretrained(directory)), reference)


def test_original_gpt2_file_layout_imports(tmp_path, reference):
    """OpenAI's gpt2 files on the Hub name parameters without "transformer." and carry
    each layer's causal-mask buffers."""
    state = {k.removeprefix("transformer."): v for k, v in reference.state_dict().items() if k != "lm_head.weight"}
    for layer in range(TINY["n_layer"]):
        state[f"h.{layer}.attn.bias"] = torch.ones(64, 64).tril().view(1, 1, 64, 64)
        state[f"h.{layer}.attn.masked_bias"] = torch.tensor(-1e4)
    directory = tmp_path / "openai"
    reference.config.save_pretrained(directory)
    save_file(state, directory / "model.safetensors")
    assert_same_logits(build(*load_hf_pretrained(directory)), reference)


def test_greedy_generation_matches_transformers_token_for_token(gpt2_dir, reference):
    model = build(*load_hf_pretrained(gpt2_dir))
    prompt = random_tokens(TINY["vocab_size"], length=8)[:1]  # (1, 8)
    expected = reference.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=40, do_sample=False)[
        0, 8:
    ].tolist()
    assert generate(model, [prompt[0].tolist()], 40, Sampling(temperature=0.0))[0] == expected


def test_imported_gpt_bigcode_is_multi_query_with_transformers_logits(tmp_path):
    reference = hf_bigcode(seed=1)
    reference.save_pretrained(tmp_path / "bigcode")
    config, state = load_hf_pretrained(tmp_path / "bigcode")
    assert (config.n_head, config.n_kv_head) == (4, 1)
    assert_same_logits(build(config, state), reference)


def test_import_crops_the_context(gpt2_dir, reference):
    config, state = load_hf_pretrained(gpt2_dir, block_size=16)
    assert config.block_size == 16
    assert_same_logits(build(config, state), reference, length=16)


def kv_rows(fused: torch.Tensor, config: GPTConfig, which: int) -> torch.Tensor:
    """The K (which=1) or V (which=2) rows of c_attn's weight or bias, as (n_kv_head, head_dim, ...)."""
    kv_dim = config.kv_heads * config.head_dim
    rows = fused.split((config.n_embd, kv_dim, kv_dim))[which]
    return rows.unflatten(0, (config.kv_heads, config.head_dim))


@pytest.mark.parametrize("n_kv_head", [2, 1])
def test_pooling_groups_of_identical_heads_is_lossless(n_kv_head):
    torch.manual_seed(0)
    mha = GPT(GPTConfig(vocab_size=97, block_size=16, n_layer=2, n_head=4, n_embd=32, dropout=0.0))
    state = {name: 0.05 * torch.randn_like(t) + t for name, t in mha.state_dict().items()}
    group = mha.config.n_head // n_kv_head
    for name in [n for n in state if "c_attn" in n]:
        for which in (1, 2):
            heads = kv_rows(state[name], mha.config, which)  # a view into state[name]
            for first in range(0, mha.config.n_head, group):
                heads[first + 1 : first + group] = heads[first]  # every head of a group the same
    mha = build(mha.config, state)

    config, pooled = pool_kv_heads(state, mha.config, n_kv_head)
    assert config == GPTConfig(vocab_size=97, block_size=16, n_layer=2, n_head=4, n_kv_head=n_kv_head, n_embd=32)
    tokens = random_tokens(97, length=16)
    torch.testing.assert_close(build(config, pooled)(tokens)[0], mha(tokens)[0], atol=1e-6, rtol=0)


def test_pooling_different_heads_averages_them_into_a_model_of_the_target_shape(make_model):
    mha = make_model(seed=0)  # 4 heads, 4 kv heads
    state = {name: 0.05 * torch.randn_like(t) + t for name, t in mha.state_dict().items()}
    config, pooled = pool_kv_heads(state, mha.config, 2)
    gqa = build(config, pooled)
    assert gqa.num_params() == GPT(config).num_params() < mha.num_params()
    for name in ("transformer.h.1.attn.c_attn.weight", "transformer.h.1.attn.c_attn.bias"):
        for which in (1, 2):
            before, after = kv_rows(state[name], mha.config, which), kv_rows(pooled[name], config, which)
            torch.testing.assert_close(after[0], (before[0] + before[1]) / 2)
            torch.testing.assert_close(after[1], (before[2] + before[3]) / 2)
            assert not torch.equal(after[0], after[1])


def test_import_into_fewer_kv_heads_pools(gpt2_dir):
    config, state = load_hf_pretrained(gpt2_dir, n_kv_head=1)
    assert config.attention_kind == "MQA"
    assert build(config, state)(random_tokens(1000))[0].isfinite().all()


def test_kv_heads_that_do_not_divide_n_head_are_refused(gpt2_dir):
    with pytest.raises(HFError, match="must divide n_head"):
        load_hf_pretrained(gpt2_dir, n_kv_head=3)


@pytest.mark.parametrize(
    "n_kv_head, match_mha_params, n_target, reason",
    [(1, False, 2, "cannot pool 1 key/value heads into 2"), (2, True, 1, "match_mha_params widened")],
)
def test_pooling_refuses_what_it_cannot_do(n_kv_head, match_mha_params, n_target, reason):
    config = tiny_config(n_kv_head=n_kv_head, match_mha_params=match_mha_params)
    with pytest.raises(ValueError, match=reason):
        pool_kv_heads(GPT(config).state_dict(), config, n_target)


@pytest.mark.parametrize(
    "changes, reason",
    [
        ({"model_type": "mistral"}, "model_type 'mistral'"),
        ({"n_head": 4.0, "n_layer": True}, r"config.json's sizes must be integers: n_layer=True, n_head=4.0"),
        ({"n_layer": 4}, r"do not fit config.json: missing transformer\.h\.2\."),
        ({"vocab_size": 2000}, r"transformer\.wte\.weight is \(1000, 64\) in the weights, \(2000, 64\) by config.json"),
        ({"activation_function": "relu"}, "activation_function='relu'"),
        ({"n_inner": 128}, "n_inner=128"),
        ({"tie_word_embeddings": False}, r"missing lm_head\.weight"),  # untied, but the file holds no head
        ({"tie_word_embeddings": "no"}, "tie_word_embeddings='no'"),
    ],
)
def test_configs_that_do_not_describe_these_weights_are_refused(gpt2_dir, changes, reason):
    edit_config(gpt2_dir, **changes)
    with pytest.raises(HFError, match=reason):
        load_hf_pretrained(gpt2_dir)


# Per config class: gptlab's table of defaults, its required sizes, and sizes small enough to build
# a GPTConfig fast that gptlab can reproduce (the class's own value stays for the key under test).
DEFAULTS_OF = {
    GPT2Config: (hf.gpt2.SAME_FUNCTION[hf.gpt2.GPT2], hf.gpt2.SHAPE_KEYS, {**TINY}),
    GPTBigCodeConfig: (hf.gpt2.SAME_FUNCTION[hf.gpt2.BIGCODE], hf.gpt2.SHAPE_KEYS, {**TINY}),
    LlamaConfig: (
        {**hf.llama.SAME_FUNCTION, **{key: (value, None) for key, value in hf.llama.DEFAULTS.items()}},
        hf.llama.SHAPE_KEYS,
        dict(
            vocab_size=97,
            max_position_embeddings=16,
            hidden_size=60,
            num_hidden_layers=1,
            num_attention_heads=6,
            intermediate_size=160,
            rms_norm_eps=1e-5,
        ),
    ),
}


def import_outcome(hf_config: dict) -> GPTConfig | str:
    try:
        return config_from_hf(hf_config)
    except ValueError as err:
        return str(err)


def without(mapping: dict, key: str) -> dict:
    return {k: v for k, v in mapping.items() if k != key}


@pytest.mark.parametrize("config_class", DEFAULTS_OF, ids=lambda c: c.__name__)
def test_every_default_gptlab_assumes_is_the_config_class_own(config_class):
    """A key config.json leaves out means the class's default: gptlab's table of defaults holds
    the class's values, and leaving out any key the class writes (sizes gptlab requires aside)
    imports exactly as writing the class's value does, derived defaults (head_dim) included."""
    table, required, reproducible = DEFAULTS_OF[config_class]
    class_values = config_class().to_dict()
    class_values |= class_values.get("rope_parameters") or {}  # rope_theta, rope_type: Llama's are nested
    assert {key: default for key, (default, _) in table.items()} == {key: class_values[key] for key in table}
    for key in config_class().to_dict().keys() - {*required, "model_type"}:
        written = config_class(**without(reproducible, key)).to_dict()  # the class's own value for key
        assert import_outcome(without(written, key)) == import_outcome(written), key
        for inner in written[key] if key == "rope_parameters" else ():
            assert import_outcome({**written, key: without(written[key], inner)}) == import_outcome(written), inner


def test_multi_head_gpt_bigcode_is_refused(tmp_path):
    hf_bigcode(multi_query=False).save_pretrained(tmp_path)
    with pytest.raises(HFError, match="multi_query=False"):
        load_hf_pretrained(tmp_path)


@pytest.mark.parametrize(
    "remove, reason", [("config.json", "has no config.json"), ("model.safetensors", "has no weights")]
)
def test_missing_files_are_named(gpt2_dir, remove, reason):
    (gpt2_dir / remove).unlink()
    with pytest.raises(HFError, match=reason):
        load_hf_pretrained(gpt2_dir)


def test_a_pickle_with_more_than_tensors_is_not_unpickled(gpt2_dir):
    (gpt2_dir / "model.safetensors").unlink()
    torch.save(
        {"transformer.wte.weight": torch.zeros(2), "extra": argparse.Namespace()}, gpt2_dir / "pytorch_model.bin"
    )
    with pytest.raises(HFError, match="weights_only=True"):
        load_hf_pretrained(gpt2_dir)


def test_hub_name_offline_says_so(monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # never touch the network
    with pytest.raises(HFError, match=r"cannot be reached \(offline\).*pass its local directory"):
        load_hf_pretrained("gptlab-tests/never-downloaded")


def test_a_missing_path_is_not_sent_to_the_hub(tmp_path):
    with pytest.raises(HFError, match="no directory"):
        load_hf_pretrained(str(tmp_path / "nowhere"))
