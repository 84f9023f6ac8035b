"""The attention ablation in two blocks: attention_ablation_llama runs the same arms and
seeds in Llama's block, and a sweep holding both blocks reports each block in its own
section (never compared across blocks) with their differences side by side."""

import dataclasses

import pytest

import report
from ablation.compare import baseline_of, results
from ablation.runs import group_arms, read_sweep
from ablation.stats import paired_difference
from conf import load_config
from model.config import BLOCKS as BLOCK_PRESETS
from test_ablation import compose_experiment, run, sweep_params

SEEDS = (1, 2)
BLOCKS = {"gpt2": [], "llama": ["model/block=llama"]}
KV_HEADS = (4, 2, 1)  # nano: MHA, GQA, MQA


def test_the_llama_experiment_is_the_ablation_in_another_block():
    """The same arms, seeds, recipe, data and schedule; the block exactly Llama's, whatever the recipe's is."""
    assert sweep_params("attention_ablation_llama") == sweep_params("attention_ablation")
    ablation, llama = (
        dataclasses.asdict(load_config(compose_experiment(name)))
        for name in ("attention_ablation", "attention_ablation_llama")
    )
    assert {key: llama["model"][key] for key in BLOCK_PRESETS["llama"]} == BLOCK_PRESETS["llama"]
    differ = {key for key in ablation["model"] if ablation["model"][key] != llama["model"][key]}
    assert differ <= set(BLOCK_PRESETS["llama"]) and {"norm", "mlp"} <= differ
    assert {k: v for k, v in ablation.items() if k not in ("model", "logging")} == {
        k: v for k, v in llama.items() if k not in ("model", "logging")
    }


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """Real tiny runs: MHA, GQA and MQA under 2 seeds in each block, one sweep directory."""
    directory = tmp_path_factory.mktemp("blocks")
    for block, overrides in BLOCKS.items():
        for seed in SEEDS:
            for kv in KV_HEADS:
                run(directory, f"kv{kv}", seed, f"model.n_kv_head={kv}", *overrides, subdir=block)
    return directory / "sweep"


def test_each_block_is_its_own_group_with_the_same_arms_and_seeds(sweep):
    arms = group_arms(read_sweep(sweep).runs)
    assert [(a.name, a.shape[3], a.seeds) for a in arms] == [
        (f"kv{kv}", block, list(SEEDS)) for block in ("GPT-2 block", "Llama block") for kv in KV_HEADS
    ]
    assert all(
        run.path.parent.name == ("llama" if a.shape[3] == "Llama block" else "gpt2") for a in arms for run in a.runs
    )
    embeddings = (
        "transformer.wte.weight",
        "transformer.wpe.weight",
        "lm_head.weight",
    )  # the ladder's x axis leaves out
    for arm in arms:
        state = arm.runs[0].checkpoint.model_state
        assert arm.non_embedding_params == sum(t.numel() for name, t in state.items() if name not in embeddings)


def test_the_report_shows_both_blocks_and_their_differences_side_by_side(sweep, tmp_path):
    text = report.write_report(sweep, tmp_path, decode_steps=2).read_text()
    assert "query heads, GPT-2 block\n" in text and "query heads, Llama block\n" in text
    table = text.split("## The blocks side by side")[1].split("\n## ")[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "layout" not in line]
    assert [row.split(" | ")[1] for row in rows] == ["GQA (2 kv heads)", "MQA (1 kv heads)"]
    arms = group_arms(read_sweep(sweep).runs)
    for column, block in ((2, "GPT-2 block"), (3, "Llama block")):
        members = [a for a in arms if a.shape[3] == block]
        mha = {a.config.n_kv_head: a for a in members}[4]
        for row, kv in zip(rows, (2, 1)):  # the difference recomputed from the runs' final losses
            expected = paired_difference(mha.finals(), {a.config.n_kv_head: a for a in members}[kv].finals())
            assert row.split(" | ")[column].startswith(f"{expected.difference.mean:+.4f} (")
        assert [r.comparison is None for r in results(members, baseline_of(members, None))] == [True, False, False]
