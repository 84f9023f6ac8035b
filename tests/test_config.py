"""Hydra composition of the model presets and the attention switch."""

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

from conf import CONF_DIR, build_model_config, model_preset
from model import GPT

PRESETS = ["nano", "mini", "small", "gpt2"]


def compose_train(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose(config_name="train", overrides=list(overrides))


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("attention, expected_kind", [("mha", "MHA"), ("mqa", "MQA")])
def test_every_preset_composes_with_every_attention_alias(preset, attention, expected_kind):
    config = build_model_config(compose_train(f"model={preset}", f"model/attention={attention}"))
    assert config.attention_kind == expected_kind
    with torch.device("meta"):
        GPT(config)


def test_gqa_is_one_override():
    config = model_preset("gpt2", "model.n_kv_head=4")
    assert (config.n_head, config.n_kv_head, config.attention_kind) == (12, 4, "GQA")


def test_gpt2_preset_is_gpt2_small():
    config = model_preset("gpt2")
    assert (config.n_layer, config.n_head, config.n_embd, config.block_size) == (12, 12, 768, 1024)
    assert config.vocab_size == 50304 and config.vocab_size % 64 == 0


def test_misspelt_key_is_rejected_by_the_schema():
    with pytest.raises(ConfigCompositionException) as err:
        compose_train("model.n_heads=4")
    assert "Key 'n_heads' not in 'GPTConfig'" in str(err.value.__cause__)


def test_appended_unknown_key_is_rejected_when_the_model_config_is_built():
    cfg = compose_train("+model.n_heads=4")  # `+` opens Hydra's schema on purpose
    with pytest.raises(ValueError, match="model.n_heads is not a setting of GPTConfig"):
        build_model_config(cfg)


def test_wrong_type_is_rejected_by_the_schema():
    with pytest.raises(ConfigCompositionException) as err:
        compose_train("model.n_layer=many")
    assert isinstance(err.value.__cause__, ValidationError)
    assert "n_layer" in str(err.value.__cause__)


def test_rule_violations_are_rejected_when_the_model_config_is_built():
    cfg = compose_train("model=nano", "model.n_kv_head=3")
    with pytest.raises(ValueError, match=r"n_kv_head \(3\) must divide n_head \(4\)"):
        build_model_config(cfg)


def test_the_committed_reference_is_the_generated_one():
    from conf.__main__ import REFERENCE, reference

    assert REFERENCE.read_text() == reference(), "docs/configuration.md is out of date: run python -m conf"
