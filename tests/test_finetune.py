"""experiment=finetune_gpt2: GPT-2's released weights in GPT-2's own block, fine-tuned at a
constant small learning rate after a short warm-up (nanoGPT's finetune_shakespeare.py), on a
tiny random GPT-2 saved by transformers instead of the real one (no network here)."""

import math

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import train
from conf import CONF_DIR, load_config
from conftest import training_overrides
from hf_reference import hf_gpt2
from model.config import BLOCKS
from run.checkpoints import find_checkpoint, load_checkpoint
from run.metrics import read_metrics
from run.run_dir import RUN_CONFIG


def compose_finetune(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose(config_name="train", overrides=["experiment=finetune_gpt2", *overrides])


def test_the_experiment_holds_nanogpts_finetuning_settings_and_a_short_warmup():
    config = load_config(compose_finetune())
    assert (config.init_from, config.model_path, config.data.tokenizer) == ("hf", "gpt2", "gpt2")
    assert config.optim.learning_rate == config.optim.min_lr == 3e-5  # constant after the warm-up
    assert 0 < config.optim.warmup_iters <= 0.1 * config.max_iters
    assert (config.max_iters, config.tokens_per_step, config.model.block_size) == (20, 32768, 1024)
    assert {key: getattr(config.model, key) for key in BLOCKS["gpt2"]} == BLOCKS["gpt2"]
    assert not config.model.qk_norm and not config.model.zero_init_proj  # none of the modern recipe's block


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory):
    """A few CPU-sized steps of the experiment from a tiny random GPT-2 directory."""
    directory = tmp_path_factory.mktemp("finetune")
    hf_gpt2(n_layer=1, n_embd=16, n_head=2, vocab_size=50257, n_positions=32).save_pretrained(directory / "hf")
    kept = [
        o
        for o in training_overrides(directory)
        if not o.startswith(("model=", "recipe=", "data.tokenizer=", "optim.", "max_iters=", "eval_interval="))
    ]
    cfg = compose_finetune(
        *kept,
        f"model_path={directory / 'hf'}",
        "model.block_size=32",
        "tokens_per_step=null",
        "max_iters=6",
        "eval_interval=3",
        "data.name=finetune",
    )
    return train.train(cfg)


def test_a_finetuning_run_holds_the_learning_rate_constant_after_its_warmup(finetuned):
    rates = [r["lr"] for r in read_metrics(finetuned) if r["kind"] == "train"]  # logging.log_interval=1
    assert rates[:2] == pytest.approx([1.5e-5, 3e-5]) and rates[2:] == pytest.approx([3e-5] * 4)


def test_a_finetuning_runs_config_records_gpt2s_block_as_its_checkpoint_holds_it(finetuned):
    recorded = OmegaConf.load(finetuned / RUN_CONFIG).model
    model = load_checkpoint(find_checkpoint(finetuned, runs_root=finetuned.parent)).model_config
    for key in (*BLOCKS["gpt2"], "qk_norm", "zero_init_proj", "tie_embeddings", "bias"):
        assert recorded[key] == getattr(model, key), key
    assert (model.position, model.mlp, model.qk_norm, model.n_layer, model.n_embd) == ("learned", "gelu", False, 1, 16)
    assert math.isfinite([r for r in read_metrics(finetuned) if r["kind"] == "eval"][-1]["val_loss"])
