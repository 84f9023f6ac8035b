"""How recipes and blocks compose: a recipe chooses a block and sets only what is not a block's;
a block named on the command line replaces the recipe's whole, and a model.<setting>= wins
over both. Checked over every recipe and every block preset, against a plain merge of the
YAML files (the reference: what each file says, in the order of precedence the docs state)."""

from dataclasses import asdict, fields

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from conf import CONF_DIR, load_config
from model import GPTConfig
from model.config import BLOCK_SETTINGS, BLOCKS

RECIPES = sorted(path.stem for path in (CONF_DIR / "recipe").glob("*.yaml"))
# What a recipe may set in model: an initialisation, not the block's architecture.
RECIPE_MODEL_SETTINGS = {"zero_init_proj"}


def composed_model(*overrides: str) -> GPTConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return load_config(compose(config_name="train", overrides=list(overrides))).model


def yaml_of(*parts: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(CONF_DIR.joinpath(*parts))) or {}


def recipe_block(recipe: str) -> str:
    """The block a recipe's defaults list chooses."""
    [block] = [
        entry["override /model/block"]
        for entry in yaml_of("recipe", f"{recipe}.yaml").get("defaults", [])
        if isinstance(entry, dict) and "override /model/block" in entry
    ]
    return block


def expected_model(recipe: str, block: str, size: str = "mini", **explicit) -> dict:
    """The rule: the settings' defaults, then the size preset and the recipe's own model values, over them
    the block's settings, and over everything the settings named explicitly."""
    recipe_model = yaml_of("recipe", f"{recipe}.yaml").get("model", {})
    return {
        **asdict(GPTConfig()),
        **yaml_of("model", f"{size}.yaml"),
        **recipe_model,
        **yaml_of("model", "block", f"{block}.yaml"),
        **explicit,
    }


def test_every_block_preset_sets_every_block_setting_and_its_file_says_the_same():
    for name, settings in BLOCKS.items():
        assert set(BLOCK_SETTINGS) <= set(settings), name  # so no earlier choice shows through
        assert yaml_of("model", "block", f"{name}.yaml") == settings, name
    assert {path.stem for path in (CONF_DIR / "model" / "block").glob("*.yaml")} == set(BLOCKS)


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_recipe_chooses_a_block_and_sets_nothing_of_a_blocks(recipe):
    assert recipe_block(recipe) in BLOCKS
    assert set(yaml_of("recipe", f"{recipe}.yaml").get("model", {})) <= RECIPE_MODEL_SETTINGS
    assert asdict(composed_model(f"recipe={recipe}")) == expected_model(recipe, recipe_block(recipe))


def test_the_default_recipe_is_modern_with_its_block():
    assert asdict(composed_model()) == expected_model("modern", "modern")
    assert {key: getattr(composed_model(), key) for key in BLOCKS["modern"]} == dict(
        position="rope",
        norm="layernorm",
        norm_weight=True,
        embed_norm=False,
        branch_scale=1.0,
        mlp="relu2",
        qk_norm=True,
    )  # today's modern architecture


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_a_block_named_on_the_command_line_wins_over_the_recipes_in_either_order(recipe, block):
    expected = expected_model(recipe, block)
    assert asdict(composed_model(f"recipe={recipe}", f"model/block={block}")) == expected
    assert asdict(composed_model(f"model/block={block}", f"recipe={recipe}")) == expected


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_a_setting_named_on_the_command_line_wins_over_block_and_recipe(recipe, block):
    flipped = dict(qk_norm=not BLOCKS[block]["qk_norm"], zero_init_proj=True, position="learned")
    model = composed_model(f"recipe={recipe}", f"model/block={block}", *(f"model.{k}={v}" for k, v in flipped.items()))
    assert asdict(model) == expected_model(recipe, block, **flipped)


def test_an_experiments_block_wins_over_its_recipe_and_a_command_line_recipe():
    llama = {key: value for key, value in BLOCKS["llama"].items()}
    for overrides in ([], ["recipe=modern"]):
        model = composed_model("experiment=attention_ablation_llama", *overrides)
        assert {key: getattr(model, key) for key in llama} == llama


def test_only_the_size_preset_sets_what_a_block_leaves_open():
    open_settings = {f.name for f in fields(GPTConfig)} - set(BLOCKS["gpt2"])
    assert "bias" in open_settings  # GPT-2's family has both: the size preset decides
    assert composed_model("model=nano", "model/block=gpt2").bias is True
    assert composed_model("model=mini", "model/block=gpt2").bias is False
    assert composed_model("model=nano", "model/block=llama").bias is False  # Llama's family has none
