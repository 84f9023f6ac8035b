"""Hydra composition of the model presets and the attention switch."""

import itertools
import math
import re
from dataclasses import asdict, fields, replace

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from conf import CONF_DIR, DEVICE, DTYPES, PRECISION, Config, OptimConfig, load_config, model_preset
from conf.downstream_config import DownstreamConfig
from conf.sample_config import SampleConfig
from data import DataConfig
from model import GPT, GPTConfig
from model.config import BLOCKS, GPT2_BLOCK, LLAMA_BLOCK
from rules import NOT_EMPTY, SettingsError, above, at_least, between, one_of, rule_of

PRESETS = ["nano", "mini", "small", "gpt2"]


def compose_train(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose(config_name="train", overrides=list(overrides))


def build_model_config(cfg):
    return load_config(cfg.model, GPTConfig, prefix="model.")


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


def test_a_vocab_size_train_py_would_overwrite_is_refused():
    with pytest.raises(ValueError, match=r"^model.vocab_size=1000: train.py sets it from the tokenizer"):
        load_config(compose_train("model.vocab_size=1000"))


def test_rule_violations_are_rejected_when_the_model_config_is_built():
    cfg = compose_train("model=nano", "model.n_kv_head=3")
    with pytest.raises(ValueError, match=r"n_kv_head \(3\) must divide n_head \(4\)"):
        build_model_config(cfg)


def test_every_bad_setting_is_reported_at_once():
    cfg = compose_train("model.n_head=0", "optim.learning_rate=-1", "data.val_fraction=2")
    with pytest.raises(SettingsError) as err:  # a ValueError, which the commands print as one error
        load_config(cfg)
    assert str(err.value).splitlines() == [
        "3 settings are wrong:",
        "  model.n_head must be >= 1, got 0",  # n_embd % n_head is not tried: it assumes n_head valid
        "  data.val_fraction must be in (0, 1), got 2.0",
        "  optim.learning_rate must be > 0, got -1.0",
    ]


def test_a_bad_device_and_precision_are_refused_with_the_other_problems():
    cfg = compose_train("precision=fp8", "device=cuda:x", "max_iters=-1")
    with pytest.raises(SettingsError) as err:  # before train.py starts processes or takes the run's lock
        load_config(cfg)
    assert err.value.problems == [
        "max_iters must be >= 0, got -1",
        "device must be auto, cpu, cuda or cuda:N, got 'cuda:x'",
        "precision must be one of ('auto', 'fp32', 'bf16', 'fp16'), got 'fp8'",
    ]


@pytest.mark.parametrize(
    "device, allowed",
    [
        ("auto", True),
        ("cpu", True),
        ("cuda", True),
        ("cuda:0", True),
        ("cuda:12", True),  # whether it exists: later
        ("tpu", False),
        ("cuda:x", False),
        ("cuda:", False),
        ("cuda:01", False),
        ("cpu:0", False),
        ("CUDA", False),
    ],
)
def test_the_device_rule_checks_the_spelling_only(device, allowed):
    assert DEVICE.allows(device) is allowed


def test_every_config_names_the_precision_alike():
    for schema in (Config, SampleConfig, DownstreamConfig):
        known = {f.name: rule_of(f) for f in fields(schema)}
        assert "dtype" not in known and known["precision"] == PRECISION and known["device"] == DEVICE
    assert PRECISION.choices == ("auto", *DTYPES) and set(DTYPES.values()) == {
        torch.float32,
        torch.bfloat16,
        torch.float16,
    }


def test_rules_come_first_and_cross_field_checks_run_where_the_rules_held():
    cfg = compose_train("model.n_head=3", "optim.min_lr=1", "data.val_fraction=2", "max_iters=-1")
    with pytest.raises(SettingsError) as err:
        load_config(cfg)
    assert err.value.problems == [
        "data.val_fraction must be in (0, 1), got 2.0",
        "max_iters must be >= 0, got -1",
        "model.n_embd (128) must be divisible by n_head (3)",
        "optim.min_lr (1.0) must not exceed optim.learning_rate (0.003)",
    ]
    with pytest.raises(SettingsError, match=r"^2 settings are wrong:\n  model.n_layer .*\n  model.n_head "):
        GPTConfig(n_layer=0, n_head=0)  # built in code, it says every problem too


def test_the_committed_reference_is_the_generated_one():
    from conf.__main__ import REFERENCE, reference

    assert REFERENCE.read_text() == reference(), "docs/configuration.md is out of date: run python -m conf"


def test_the_default_run_is_the_dataclasses_defaults_with_the_chosen_presets():
    config = load_config(compose_train())
    speedrun = OptimConfig(learning_rate=3e-3, min_lr=3e-4, cooldown_frac=0.5)  # the modern recipe's schedule
    assert config == Config(
        model=model_preset("mini", "recipe=modern"),
        data=DataConfig(tokenizer="bpe", vocab_size=4096),
        optim=speedrun,
        max_iters=500,
    )
    assert model_preset("mini", "recipe=modern") == replace(
        model_preset("mini"), position="rope", mlp="relu2", qk_norm=True, zero_init_proj=True
    )
    # what train.yaml ran with before the dataclasses held its values (GPT-2's recipe still does)
    assert (Config().max_iters, config.batch_size, config.eval_interval, config.eval_iters) == (600, 8, 200, 10)
    assert (Config().optim.learning_rate, Config().optim.min_lr) == (2e-3, 2e-4)


@pytest.mark.parametrize("root", ["train", "sample"])
def test_a_root_config_holds_only_its_defaults_list_and_hydras_settings(root):
    assert set(OmegaConf.load(CONF_DIR / f"{root}.yaml")) == {"defaults", "hydra"}


@pytest.mark.parametrize("group, schema", [("model", GPTConfig), ("data", DataConfig)])
def test_a_preset_sets_only_what_it_changes(group, schema):
    defaults = asdict(schema())
    for path in sorted((CONF_DIR / group).glob("*.yaml")):
        restated = {
            key for key, value in (OmegaConf.to_container(OmegaConf.load(path)) or {}).items() if defaults[key] == value
        }
        assert not restated, f"{path.name} restates the defaults of {sorted(restated)}"


def test_the_block_presets_are_model_configs_blocks():
    files = {
        path.stem: OmegaConf.to_container(OmegaConf.load(path))
        for path in (CONF_DIR / "model" / "block").glob("*.yaml")
    }
    assert files == BLOCKS and (BLOCKS["gpt2"], BLOCKS["llama"]) == (GPT2_BLOCK, LLAMA_BLOCK)
    for name, settings in BLOCKS.items():  # and the command line's model/block=<name> composes to them
        for recipe in ("recipe=gpt2", "recipe=modern"):
            model = model_preset("nano", f"model/block={name}", recipe)
            assert {key: getattr(model, key) for key in settings} == settings


POINTS = [-2, -1, -0.5, 0, 0.25, 1, 1.5, 2, math.inf]


def test_an_interval_allows_exactly_its_members():  # every interval and value of a grid, both ends' kinds
    for low, high, ends, value in itertools.product(POINTS, POINTS, ["[]", "[)", "(]", "()"], POINTS):
        outside = (
            value < low
            or value > high
            or (value == low and ends[0] == "(")
            or (value == high and ends[1] == ")")
            or not math.isfinite(value)
        )  # inf: never a setting
        assert between(low, high, ends).allows(value) is not outside, (low, high, ends, value)
        finite = math.isfinite(value)
        assert at_least(low).allows(value) is (finite and value >= low) and above(low).allows(value) is (
            finite and value > low
        )


@pytest.mark.parametrize("override", ["optim.muon_lr=inf", "model.logit_softcap=inf", "optim.learning_rate=nan"])
def test_a_non_finite_number_is_refused_by_its_rule(override):
    name, value = override.split("=")
    with pytest.raises(SettingsError, match=rf"{re.escape(name)} must be a finite number > 0, got {value}"):
        load_config(compose_train(override))


def test_rules_read_as_they_are_checked():
    assert [
        str(r) for r in (at_least(1), above(0), between(0, 1, "[)"), between(0, math.inf, "[)"), one_of("a", "b"))
    ] == [">= 1", "> 0", "in [0, 1)", "in [0, inf)", "one of ('a', 'b')"]
    assert NOT_EMPTY.allows("x") and not NOT_EMPTY.allows("") and NOT_EMPTY.allows(None)  # None: the type says
    assert NOT_EMPTY.allows(["a", "b"]) and not NOT_EMPTY.allows(["a", ""])  # a list: each item


def test_python_m_conf_help_prints_help_and_writes_nothing(capsys, monkeypatch, tmp_path):
    from conf import __main__ as reference_command

    target = tmp_path / "configuration.md"
    monkeypatch.setattr(reference_command, "REFERENCE", target)
    with pytest.raises(SystemExit) as exit_:
        reference_command.main(["--help"])
    assert exit_.value.code == 0 and "--check" in capsys.readouterr().out and not target.exists()
    reference_command.main([])
    assert target.read_text() == reference_command.reference()
