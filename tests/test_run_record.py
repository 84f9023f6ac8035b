"""Every run's config.yaml rebuilds exactly the model its checkpoint holds: over every recipe,
every block (the recipe's, or one named on the command line) and every start (scratch,
init_from=checkpoint, init_from=hf from a tiny random GPT-2 that transformers saved, and a
resume of each), a 1-step run's config.yaml gives a GPTConfig whose model takes the
checkpoint's weights name for name and shape for shape and computes the same logits, and
whose block is the one expected: the block named, else the weights', else the recipe's."""

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict

import train
from conf import CONF_DIR, read_settings
from conftest import training_overrides
from hf_reference import hf_gpt2
from model import GPT, GPTConfig
from model.config import BLOCKS
from run.checkpoints import find_checkpoint, load_checkpoint, load_weights
from test_composition import RECIPES, recipe_block

NAMED_BLOCKS = [None, *sorted(BLOCKS)]  # None: the recipe's
HF_GPT2 = {**BLOCKS["gpt2"], "bias": True}  # what the tiny GPT-2 from transformers computes


def run_command(*overrides):
    """train.py *overrides, in this process, with Hydra's record of the command line (what
    resume and init_from read to tell a named setting from a filled-in one)."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="train", overrides=list(overrides), return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return train.train(cfg)


def block_choice(block):
    return [f"model/block={block}"] if block else []


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("record")


@pytest.fixture(scope="module")
def char_run(workdir):
    """The overrides of a 1-step run on characters (no recipe: each test names its own)."""
    base = [o for o in training_overrides(workdir) if not o.startswith("recipe=")]
    return [*base, "max_iters=1", "eval_interval=1", "optim.warmup_iters=0"]


@pytest.fixture(scope="module")
def gpt2_run(workdir, char_run):
    """The same on GPT-2's tokens, from a tiny random GPT-2 that transformers saved."""
    hf_dir = workdir / "hf"
    hf_gpt2(n_layer=1, n_embd=16, n_head=2, vocab_size=50257, n_positions=32).save_pretrained(hf_dir)
    tokens = [o for o in char_run if not o.startswith(("data.tokenizer=", "data.data_dir="))]
    return [
        *tokens,
        "data.tokenizer=gpt2",
        "data.name=hf",
        f"data.data_dir={workdir / 'gpt2data'}",
        "init_from=hf",
        f"model_path={hf_dir}",
    ]


@pytest.fixture(scope="module")
def sources(char_run):
    """A 1-step run of each block, to start from."""
    return {block: run_command(*char_run, "recipe=gpt2", f"model/block={block}") for block in BLOCKS}


def recorded_model(run_dir) -> GPTConfig:
    return read_settings(GPTConfig, OmegaConf.load(run_dir / "config.yaml").model)


def assert_config_rebuilds_the_checkpoint(run_dir, block, step=1):
    """config.yaml's model is the checkpoint's, and has `block`'s settings."""
    checkpoint = load_checkpoint(find_checkpoint(run_dir, runs_root=run_dir.parent))
    assert checkpoint.path.name == f"step_{step:06d}"
    recorded = recorded_model(run_dir)
    assert {key: getattr(recorded, key) for key in BLOCKS[block]} == BLOCKS[block]
    rebuilt, saved = GPT(recorded).eval(), GPT(checkpoint.model_config).eval()
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == {k: v.shape for k, v in saved.state_dict().items()}
    for model in (rebuilt, saved):
        load_weights(model, checkpoint.model_state)  # every name and shape, or a CheckpointError
    tokens = torch.randint(0, recorded.vocab_size, (2, recorded.block_size), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(tokens)[0], saved(tokens)[0], rtol=0, atol=0)
    assert recorded == checkpoint.model_config


def resumed(run_dir):
    return run_command(f"resume={run_dir}", "max_iters=2")


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("block", NAMED_BLOCKS)
def test_a_fresh_run_and_its_resume_record_the_model_they_trained(char_run, recipe, block):
    run_dir = run_command(*char_run, f"recipe={recipe}", *block_choice(block))
    assert_config_rebuilds_the_checkpoint(run_dir, block or recipe_block(recipe))
    assert_config_rebuilds_the_checkpoint(resumed(run_dir), block or recipe_block(recipe), step=2)
    assert OmegaConf.load(run_dir / "groups.yaml")["model/block"] == (
        block or recipe_block(recipe)
    )  # kept by the resume


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("source", sorted(BLOCKS))
def test_a_run_from_a_checkpoint_records_the_checkpoints_block_whatever_the_recipe(char_run, sources, recipe, source):
    run_dir = run_command(*char_run, f"recipe={recipe}", "init_from=checkpoint", f"model_path={sources[source]}")
    assert_config_rebuilds_the_checkpoint(run_dir, source)
    assert_config_rebuilds_the_checkpoint(resumed(run_dir), source, step=2)
    named = run_command(
        *char_run, f"recipe={recipe}", f"model/block={source}", "init_from=checkpoint", f"model_path={sources[source]}"
    )  # naming the checkpoint's own block is no contradiction
    assert_config_rebuilds_the_checkpoint(named, source)


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("block", [None, "gpt2"])
def test_a_run_from_hugging_face_records_gpt2s_block_whatever_the_recipe(gpt2_run, recipe, block):
    run_dir = run_command(*gpt2_run, f"recipe={recipe}", *block_choice(block))
    assert_config_rebuilds_the_checkpoint(run_dir, "gpt2")
    assert (recorded_model(run_dir).n_layer, recorded_model(run_dir).bias) == (1, True)  # the weights', not nano's
    assert_config_rebuilds_the_checkpoint(resumed(run_dir), "gpt2", step=2)


@pytest.mark.parametrize("block", sorted(set(BLOCKS) - {"gpt2"}))
def test_a_named_block_the_weights_contradict_is_refused_naming_each_setting(gpt2_run, block):
    with pytest.raises(ValueError) as refused:
        run_command(*gpt2_run, f"model/block={block}")
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"model/block={block} contradicts the weights of ")
    off = [key for key, value in BLOCKS[block].items() if value != HF_GPT2[key]]
    assert "position" in off and all(
        f"model.{key}={BLOCKS[block][key]!r} (there {HF_GPT2[key]!r})" in message for key in off
    )


def test_a_named_setting_the_weights_contradict_is_refused_and_one_they_allow_applies(gpt2_run, sources, char_run):
    with pytest.raises(
        ValueError,
        match=r"^model.qk_norm=true contradicts the weights of \S+: model.qk_norm=True \(there "
        r"False\); a run from existing weights has their model: leave this unset",
    ):
        run_command(*gpt2_run, "model.qk_norm=true")
    with pytest.raises(
        ValueError, match=r"^model.mlp=gelu contradicts the checkpoint \S+: model.mlp='gelu' \(there 'swiglu'\);"
    ):
        run_command(*char_run, "init_from=checkpoint", f"model_path={sources['llama']}", "model.mlp=gelu")
    pooled = run_command(*gpt2_run, "model.n_kv_head=1", "model.dropout=0.1")  # the run's own choices
    assert (recorded_model(pooled).n_kv_head, recorded_model(pooled).dropout) == (1, 0.1)
    assert_config_rebuilds_the_checkpoint(pooled, "gpt2")
    with pytest.raises(
        ValueError,
        match=r"^model.qk_norm=true contradicts the checkpoint \S+: model.qk_norm=True \(there "
        r"False\);",
    ):
        run_command(f"resume={pooled}", "max_iters=2", "model.qk_norm=true")
