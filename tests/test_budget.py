"""Derived training budgets: equal tokens per shape (tokens_per_param), equal compute (match_mha_flops)."""

import math
from dataclasses import replace

import pytest
from hydra import compose, initialize_config_dir

import train
from conf import CONF_DIR, Config
from conftest import tiny_config, training_overrides
from model import GPT
from run.checkpoints import find_checkpoint, load_checkpoint
from run.metrics import read_metrics
from training.budget import training_budget

MHA = tiny_config(n_layer=3, n_embd=64)


def budget(config, **settings):
    return training_budget(
        **{
            "max_iters": 100,
            "tokens_per_param": None,
            "match_mha_flops": False,
            "model_config": config,
            "tokens_per_step": 512,
            **settings,
        }
    )


def test_without_derived_settings_max_iters_is_the_setting():
    assert budget(MHA) == budget(replace(MHA, n_kv_head=1)) and budget(MHA).max_iters == 100
    assert budget(MHA).reason == ""


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_tokens_per_param_gives_every_layout_of_a_shape_the_mha_models_tokens(kv_heads):
    non_embedding = GPT(MHA).num_params(exclude_embeddings=True)
    result = budget(replace(MHA, n_kv_head=kv_heads, match_mha_params=kv_heads == 1), tokens_per_param=20)
    assert result.max_iters == math.ceil(20 * non_embedding / 512)
    assert f"({non_embedding:,})" in result.reason


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_match_mha_flops_spends_the_mha_models_training_compute(kv_heads):
    variant = replace(MHA, n_kv_head=kv_heads)
    steps = budget(variant, match_mha_flops=True).max_iters
    mha_flops = 100 * GPT(MHA).flops_per_token()
    assert steps > 100
    assert (steps - 1) * GPT(variant).flops_per_token() < mha_flops <= steps * GPT(variant).flops_per_token()
    assert budget(MHA, match_mha_flops=True).max_iters == 100


def test_tokens_per_param_must_be_positive():
    with pytest.raises(ValueError, match="tokens_per_param must be > 0, got 0"):
        Config(tokens_per_param=0)


def test_a_run_trains_for_its_derived_budget_and_says_so(tmp_path, capsys):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(
            config_name="train",
            overrides=[
                *training_overrides(tmp_path),
                "model.n_kv_head=1",
                "tokens_per_param=0.05",
                "match_mha_flops=true",
            ],
        )
    run_dir = train.train(cfg)
    built = load_checkpoint(find_checkpoint(run_dir, tmp_path)).model_config
    expected = budget(built, max_iters=30, tokens_per_param=0.05, match_mha_flops=True, tokens_per_step=4 * 32)
    assert expected.max_iters != 30
    assert max(r["step"] for r in read_metrics(run_dir)) == expected.max_iters
    assert expected.reason in capsys.readouterr().out
