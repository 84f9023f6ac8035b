"""The GPU recipes (conf/experiment/gpt2_*.yaml) hold the values their references publish,
whatever the settings' defaults become."""

from dataclasses import replace

import pytest
import torch
from hydra import compose, initialize_config_dir

from conf import CONF_DIR, load_config
from model.config import BLOCKS
from training.microbatch import plan_micro_batches

# llm.c's GPT-2 (124M) run (github.com/karpathy/llm.c/discussions/481) and nanoGPT's
# config/train_gpt2.py with its train.py's defaults, as the recipes' comments cite them.
REFERENCES = {
    "gpt2_fineweb": dict(
        learning_rate=6e-4,
        min_lr=0.0,
        warmup_iters=700,
        tokens_per_step=524_288,
        max_iters=19_073,
        dataset="HuggingFaceFW/fineweb-edu",
    ),
    "gpt2_openwebtext": dict(
        learning_rate=6e-4,
        min_lr=6e-5,
        warmup_iters=2_000,
        tokens_per_step=491_520,
        max_iters=20_000,
        dataset="Skylion007/openwebtext",
    ),
}


def compose_recipe(name, hydra=False):
    """train.py's config under experiment=<name> (None: the default run's)."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose(config_name="train", overrides=[f"experiment={name}"] if name else [], return_hydra_config=hydra)


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_a_gpu_recipe_holds_its_references_values(name):
    config, ref = load_config(compose_recipe(name)), REFERENCES[name]
    o, m = config.optim, config.model
    assert (o.name, o.learning_rate, o.min_lr, o.warmup_iters, o.decay_iters) == (
        "adamw",
        ref["learning_rate"],
        ref["min_lr"],
        ref["warmup_iters"],
        None,
    )  # decay over the whole run
    assert (o.weight_decay, o.beta1, o.beta2, o.grad_clip) == (0.1, 0.9, 0.95, 1.0)
    assert (config.tokens_per_step, config.max_iters) == (ref["tokens_per_step"], ref["max_iters"])
    assert (config.precision, config.compile, config.data.dataset) == ("bf16", True, ref["dataset"])
    assert (m.n_layer, m.n_head, m.kv_heads, m.n_embd, m.block_size, m.bias, m.dropout) == (
        12,
        12,
        12,
        768,
        1024,
        True,
        0.0,
    )
    assert (m.position, m.norm, m.mlp, m.tie_embeddings, m.qk_norm, m.zero_init_proj, m.logit_softcap) == (
        "learned",
        "layernorm",
        "gelu",
        True,
        False,
        False,
        None,
    )  # GPT-2's block, whatever recipe is the default
    callbacks = compose_recipe(name, hydra=True).hydra.callbacks
    assert list(callbacks.downstream.tasks) == ["hellaswag"]  # scored when the run ends


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_one_gpu_accumulates_eight_times_what_eight_gpus_do(name):
    config = load_config(compose_recipe(name))
    assert config.batch_size == "auto"  # the largest micro-batch that fits, keeping tokens_per_step
    for n in (1, 2, 4, 8):
        plan = plan_micro_batches(config, config.model.block_size, n, torch.device("cuda"))
        assert plan.sequences * config.model.block_size * n == config.tokens_per_step
        assert {size * plan.accum(size) for size in plan.sizes} == {plan.sequences}
    fixed = replace(config, batch_size=4)  # a number instead: 4 sequences a micro-batch on every GPU
    accum = {
        n: plan_micro_batches(fixed, config.model.block_size, n, torch.device("cpu")).accum(4) for n in (1, 2, 4, 8)
    }
    assert accum == {n: config.tokens_per_step // (4 * 1024 * n) for n in (1, 2, 4, 8)}


def test_the_fineweb_recipe_is_llm_cs_ten_billion_tokens():
    config = load_config(compose_recipe("gpt2_fineweb"))
    assert config.max_iters * config.tokens_per_step == 9_999_745_024  # llm.c: 19,073 steps of 2^19 tokens


# The experiments the docs say run GPT-2's recipe (docs/recipes.md, ablation_results.md, finetuning.md):
# its block (Llama's where the experiment names it) and none of the modern recipe's pieces.
PINNED_TO_GPT2 = {
    "shakespeare_char_cpu": "gpt2",
    "gpt2_fineweb": "gpt2",
    "gpt2_openwebtext": "gpt2",
    "attention_ablation_gpt2": "gpt2",
    "attention_ablation_char": "gpt2",
    "attention_ablation_ladder": "gpt2",
    "attention_uptraining": "gpt2",
    "finetune_gpt2": "gpt2",
}


@pytest.mark.parametrize("name", sorted(PINNED_TO_GPT2))
def test_an_experiment_on_gpt2s_recipe_has_no_modern_piece(name):
    config = load_config(compose_recipe(name))
    block = {key: getattr(config.model, key) for key in BLOCKS[PINNED_TO_GPT2[name]]}
    assert block == BLOCKS[PINNED_TO_GPT2[name]]
    m = config.model
    assert (m.zero_init_proj, m.qk_norm, m.tie_embeddings, m.logit_softcap, config.optim.name) == (
        False,
        False,
        True,
        None,
        "adamw",
    )
    assert config.optim.cooldown_frac is None  # nanoGPT's cosine, not the modern recipe's warmup-stable-decay


def test_the_attention_ablation_follows_the_default_recipe():
    default, ablation = (load_config(compose_recipe(name)) for name in (None, "attention_ablation"))
    assert {key: getattr(ablation.model, key) for key in BLOCKS["modern"]} == BLOCKS["modern"]
    assert (ablation.model.zero_init_proj, ablation.data.tokenizer) == (
        default.model.zero_init_proj,
        default.data.tokenizer,
    )
