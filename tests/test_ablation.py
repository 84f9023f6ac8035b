"""The attention experiments compose, and report.py builds its verdicts, CIs and plots
from real tiny runs: a null arm comes out "no difference", a planted one significant."""

import contextlib
import dataclasses
import io
import math
import re
import shlex
import statistics
from dataclasses import replace

import pytest
import scipy.stats
import torch
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

import report
import train
from ablation.commands import add_seeds_commands
from ablation.compare import baseline_of, results, uptraining
from ablation.runs import flatten, group_arms, read_sweep
from ablation.stats import detectable_effect, mean_ci, paired_difference, seeds_needed
from conf import CONF_DIR, load_config
from conftest import tiny_config, training_overrides
from evaluation.results import write_results
from system import UserError

DOCS = CONF_DIR.parent / "docs"

SEEDS = (1, 2, 3)


def compose_experiment(name, *overrides, hydra=False):
    """train.yaml with experiment=name (None: the default run) and overrides."""
    chosen = [f"experiment={name}"] if name else []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose(config_name="train", overrides=[*chosen, *overrides], return_hydra_config=hydra)


def sweep_params(name):
    return {k: str(v).split(",") for k, v in compose_experiment(name, hydra=True).hydra.sweeper.params.items()}


@pytest.mark.parametrize("experiment, n_head", [("attention_ablation", 4), ("attention_ablation_gpt2", 12)])
def test_every_variant_of_the_sweep_composes(experiment, n_head):
    kv_heads = [int(k) for k in sweep_params(experiment)["model.n_kv_head"]]
    assert kv_heads[0] == n_head and kv_heads[-1] == 1 and len(kv_heads) == 3  # MHA, GQA, MQA
    kinds = [load_config(compose_experiment(experiment, f"model.n_kv_head={k}")).model.attention_kind for k in kv_heads]
    assert kinds == ["MHA", "GQA", "MQA"]
    for k in kv_heads:  # everything but the attention is identical
        config = load_config(compose_experiment(experiment, f"model.n_kv_head={k}", "model.match_mha_params=true"))
        assert (
            config.model.n_head == n_head and config.max_iters == load_config(compose_experiment(experiment)).max_iters
        )


def test_the_ablations_sweep_seeds_and_name_runs_by_arm_and_seed():
    assert sweep_params("attention_ablation")["seed"] == ["1", "2", "3", "4"]
    assert load_config(compose_experiment("attention_ablation")).max_iters == 300  # more seeds at fewer steps
    assert sweep_params("attention_ablation_ladder")["model"] == ["nano", "micro", "mini"]
    config = compose_experiment("attention_ablation", "model.n_kv_head=2", "seed=3", hydra=True)
    assert config.arm == "kv2" and config.hydra.sweep.subdir == "kv2_seed3"
    ladder = [
        load_config(compose_experiment("attention_ablation_ladder", f"model={m}")) for m in ("nano", "micro", "mini")
    ]
    assert [c.model.n_embd for c in ladder] == [64, 96, 128] and {c.tokens_per_param for c in ladder} == {4}
    assert (
        {c.eval_whole_val for c in ladder}
        == {load_config(compose_experiment("attention_ablation")).eval_whole_val}
        == {"final"}
    )  # the compared evaluation covers the whole val split


def flat_settings(config):
    return flatten(dataclasses.asdict(config))


def test_the_ablation_is_the_default_run_with_its_steps_and_evaluations_cut_to_fit():
    """attention_ablation follows the default: its recipe, corpus, tokenizer, model and optimizer
    are the default run's, whatever they become; only the schedule's length and the evaluations differ."""
    default = flat_settings(load_config(compose_experiment(None)))
    ablation = flat_settings(load_config(compose_experiment("attention_ablation")))
    differ = {key for key in default if default[key] != ablation[key]}
    assert differ == {
        "max_iters",
        "optim.warmup_iters",
        "eval_interval",
        "eval_whole_val",
        "arm",
        "logging.wandb.group",
    }
    assert (
        ablation["optim.warmup_iters"] / ablation["max_iters"] == default["optim.warmup_iters"] / default["max_iters"]
    )
    choices = compose_experiment("attention_ablation", hydra=True).hydra.runtime.choices
    assert choices["recipe"] == compose_experiment(None, hydra=True).hydra.runtime.choices["recipe"]


@pytest.mark.parametrize("experiment", ["attention_ablation_char", "attention_ablation_ladder", "attention_uptraining"])
def test_the_character_level_experiments_keep_the_gpt2_recipe_their_results_were_measured_under(experiment):
    settings = load_config(compose_experiment(experiment))
    assert compose_experiment(experiment, hydra=True).hydra.runtime.choices["recipe"] == "gpt2"
    assert (settings.data.name, settings.data.tokenizer, settings.batch_size) == ("stdlib_char", "char", 16)
    assert settings.model.position == "learned" and not settings.model.qk_norm  # GPT-2's block
    if experiment == "attention_ablation_char":  # the first ablation's arms, seeds and steps
        assert sweep_params(experiment) == sweep_params("attention_ablation") and settings.max_iters == 300


def test_uptraining_arms_start_from_the_mha_run_of_their_seed():
    arms = sweep_params("attention_uptraining")["+uptraining"]
    assert arms[0] == "mha"  # the sweep trains the sources before the arms that need them
    for arm in arms[1:]:
        config = compose_experiment("attention_uptraining", f"+uptraining={arm}", "seed=2", hydra=True)
        HydraConfig.instance().set_config(config)  # as in a sweep's job: model_path names the sweep's directory
        up = "_up" in arm
        assert (config.init_from == "checkpoint") == up
        if up:
            assert config.model_path == f"{config.hydra.sweep.dir}/mha_seed2"
            assert config.max_iters in (30, 60)  # 5% and 10% of 600
        else:
            assert config.max_iters == 660


def run(directory, name, seed, *overrides, subdir="."):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(
            config_name="train",
            overrides=[
                *training_overrides(directory),
                "max_iters=12",
                "eval_interval=12",
                f"seed={seed}",
                f"arm={name}",
                "optim.learning_rate=3e-3",
                "optim.min_lr=3e-4",  # 1e-2 makes 12 steps erratic from seed to seed
                f"out_dir={directory / 'sweep' / subdir / f'{name}_seed{seed}'}",
                *overrides,
            ],
        )
    with contextlib.redirect_stdout(io.StringIO()):
        train.train(cfg)


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    """Real tiny runs: MHA and MQA under 3 seeds; a null arm (MHA again, other seeds); a
    planted arm (half the learning rate); MQA uptrained from each MHA run and
    MQA from scratch for as many tokens in all; MQA given MHA's training FLOPs; and a
    narrower shape, so the report has every section."""
    directory = tmp_path_factory.mktemp("ablation")
    for seed in SEEDS:
        run(directory, "kv4", seed)
        run(directory, "kv1", seed, "model.n_kv_head=1")
        run(directory, "slow", seed, "optim.learning_rate=1.5e-3", "optim.min_lr=1.5e-4")
        run(directory, "again", seed + 3)
        run(
            directory,
            "kv1_up",
            seed,
            "init_from=checkpoint",
            f"model_path={directory / 'sweep' / f'kv4_seed{seed}'}",
            "model.n_kv_head=1",
            "max_iters=6",
            "optim.warmup_iters=2",
        )
        run(directory, "kv1_long", seed, "model.n_kv_head=1", "max_iters=18", "eval_interval=6")  # scratch, as long
        run(directory, "kv1_flops", seed, "model.n_kv_head=1", "match_mha_flops=true")  # evaluated at 12 and at its end
    for seed in SEEDS[:2]:
        for kv in (4, 1):
            run(directory, f"kv{kv}", seed, "model.n_embd=32", f"model.n_kv_head={kv}", subdir="narrow")
    return directory / "sweep"


@pytest.fixture(scope="module")
def written(sweep_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    for r in read_sweep(sweep_dir).runs:  # what downstream.py would write, for the main shape's MHA and MQA
        if r.path.parent == sweep_dir and r.settings["arm"] in ("kv4", "kv1"):
            accuracy = 0.25 + 0.1 * r.seed + (0.02 * r.seed if r.settings["arm"] == "kv1" else 0)
            quick = {"metrics": {"acc": 1.0}, "limit": 2, "items": 2}  # downstream.py ... limit=2
            write_results(r.checkpoint.path, {"toy": {"metrics": {"acc": accuracy}}, "quick": quick})
    tiny_preset = lambda config: tiny_config(n_kv_head=config.n_kv_head, block_size=48)  # noqa: E731  # gpt2_sized, smaller
    path = report.write_report(sweep_dir, out, prompt="First Citizen:", frontier_preset=tiny_preset, decode_steps=2)
    return out, path.read_text()


def arms_of_main_shape(sweep_dir):
    arms = [a for a in group_arms(read_sweep(sweep_dir).runs) if a.config.n_embd == 64]
    return arms, baseline_of(arms, None)


def test_a_null_arm_shows_no_difference_and_a_planted_one_is_significant(sweep_dir, written):
    arms, baseline = arms_of_main_shape(sweep_dir)
    assert baseline.name == "kv4"
    by_name = {r.arm.name: r for r in results(arms, baseline)}
    null, planted = by_name["again"], by_name["slow"]
    assert null.comparison.test == "Welch t-test"  # other seeds: nothing to pair
    assert null.comparison.p_value > 0.05 and null.comparison.difference.low < 0 < null.comparison.difference.high
    assert planted.comparison.test == "paired t-test" and planted.comparison.p_value < 0.05
    assert planted.comparison.difference.low > 0  # half the learning rate learns less in 12 steps
    text = written[1]
    assert re.search(
        r"again: MHA \(4 kv heads\) vs MHA \(4 kv heads\): [+-]\d\.\d{3} nats \(95% CI .*Holm p=[\d.]+ of 5 "
        r"tests, Welch t-test, 3\+3 seeds\): no difference detected at this budget; it detects \d\.\d{3} nats "
        r"or more 80% of the time",
        text,
    )
    assert re.search(
        r"slow: MHA \(4 kv heads\) vs MHA \(4 kv heads\): \+\d\.\d{3} nats .*paired t-test, 3 seeds\): worse", text
    )
    assert planted.comparison.p_adjusted < 0.05 and planted.comparison.family == 5  # worse after Holm's adjustment too


def test_a_null_arm_that_reran_a_baseline_seed_is_refused(sweep_dir):
    """A null arm (the baseline's settings under another name) run under one of the baseline's
    seeds trains the baseline's own run again; its independent seeds 4-6 are compared."""
    arms, baseline = arms_of_main_shape(sweep_dir)
    again = next(a for a in arms if a.name == "again")
    own = baseline.runs[0]  # what `arm=again seed=1` trains, bit for bit
    rerun = replace(own, path=sweep_dir / "again_seed1", settings=dict(own.settings, arm="again"))
    with pytest.raises(
        UserError,
        match=rf"^{re.escape(str(rerun.path))} \(arm again, seed 1\) is the baseline's run "
        rf"{re.escape(str(own.path))} again: .* did not run \(seed=7\)$",
    ):
        results([baseline, replace(again, runs=[rerun, *again.runs])], baseline)
    compiled = replace(rerun, settings=dict(rerun.settings, compile=not own.settings["compile"]))  # other numerics
    assert (
        results([baseline, replace(again, runs=[compiled, *again.runs])], baseline)[1].comparison.test == "Welch t-test"
    )
    elsewhere = replace(
        rerun, settings=dict(rerun.settings, device="cuda" if own.settings["device"] == "cpu" else "cpu")
    )
    assert (
        results([baseline, replace(again, runs=[elsewhere, *again.runs])], baseline)[1].comparison.test
        == "Welch t-test"
    )


def test_the_documented_null_check_runs_seeds_the_sweep_does_not():
    text = (DOCS / "ablation.md").read_text() + (DOCS / "ablation_results.md").read_text()
    commands = re.findall(r"arm=mha_again [^\n]*", text)
    assert commands
    for command in commands:
        seeds = set(re.search(r" seed=([\d,]+) ", command).group(1).split(","))
        assert not seeds & set(sweep_params("attention_ablation")["seed"]), command


def test_the_table_holds_each_arms_mean_and_ci_over_its_seeds(sweep_dir, written):
    arms, baseline = arms_of_main_shape(sweep_dir)
    mqa = next(a for a in arms if a.name == "kv1")
    finals = [r.final["val_loss"] for r in mqa.runs]
    assert mqa.seeds == list(SEEDS) and len(set(finals)) == 3
    expected = paired_difference(baseline.finals(), finals).difference
    row = next(line for line in written[1].splitlines() if line.startswith("| MQA (1 kv heads) | 3 |"))
    mean = sum(finals) / 3
    assert f"| {mean:.4f} ± " in row and f"{expected.mean:+.4f} ({expected.low:+.4f}..{expected.high:+.4f})" in row
    assert f"| {mqa.params:,} |" in row and f"{mqa.flops_per_token / 1e6:.2f}M" in row
    assert "val bits/byte" in written[1] and f"torch {torch.__version__}" in written[1]


def test_the_table_compares_in_bits_per_byte_and_names_the_recipe_and_data(sweep_dir, written):
    """The bits-per-byte difference, recomputed from the runs' logged val_bpb with scipy's t; on this
    ASCII corpus of characters it is also the difference in nats over ln 2."""
    arms, baseline = arms_of_main_shape(sweep_dir)
    mqa = next(a for a in arms if a.name == "kv1")
    differences = [m - b for m, b in zip(mqa.finals("val_bpb"), baseline.finals("val_bpb"))]
    mean, half = (
        statistics.mean(differences),
        scipy.stats.t.ppf(0.975, 2) * statistics.stdev(differences) / math.sqrt(3),
    )
    nats = paired_difference(baseline.finals(), mqa.finals()).difference.mean
    assert mean == pytest.approx(nats / math.log(2))
    row = next(line for line in written[1].splitlines() if line.startswith("| MQA (1 kv heads) | 3 |")).split(" | ")
    header = next(line for line in written[1].splitlines() if line.startswith("| arm |")).split(" | ")
    assert row[header.index("vs baseline (bits/byte)")] == f"{mean:+.4f} ({mean - half:+.4f}..{mean + half:+.4f})"
    assert "\nRecipe: not recorded. Data: files (char tokenizer).\n" in written[1]  # train.train(cfg): no groups.yaml
    runs = [
        replace(
            run,
            groups={"recipe": "modern"},
            settings=dict(
                run.settings, data=dict(run.settings["data"], name="stdlib", tokenizer="bpe", vocab_size=4096)
            ),
        )
        for run in mqa.runs
    ]
    assert report.trained_as([replace(mqa, runs=runs)]) == "Recipe: modern. Data: stdlib (bpe tokenizer, 4,096 ids)."


def test_uptraining_starts_from_the_converted_loss_and_compares_at_equal_tokens(sweep_dir, written):
    arms = group_arms(read_sweep(sweep_dir).runs)
    up = next(a for a in arms if a.name == "kv1_up")
    source = next(a for a in arms if a.name == "kv4" and a.config.n_embd == 64)
    assert up.uptrained and up.pretraining_tokens == source.runs[0].final["tokens"]
    assert all(run.evals[0]["step"] == 0 for run in up.runs)
    converted = [run.evals[0]["val_loss"] for run in up.runs]
    section = written[1].split("## Uptraining")[1]
    line = next(line for line in section.splitlines() if line.startswith("| kv1_up:"))
    assert f"{sum(converted) / 3:.4f} ± " in line
    total = up.pretraining_tokens + up.runs[0].final["tokens"]
    assert f"| {total:,} |" in line
    scratch = next(a for a in arms if a.name == "kv1_long")
    at_total = scratch.at_tokens(total)
    assert at_total == [run.final["val_loss"] for run in scratch.runs]  # 18 steps = 12 + 6
    assert line.endswith(f"| {sum(at_total) / 3:.4f} ± {mean_ci(at_total).half_width:.4f} |")
    assert re.search(
        rf"kv1_up \({total:,} tokens in all\) vs kv1_long at the same tokens: [+-]\d\.\d{{3}} nats "
        r"\(95% CI .*paired t-test, 3 seeds\)",
        written[1],
    )


def test_the_report_lists_what_each_named_arm_changes_and_no_seed_of_an_arm_run_under_other_seeds_as_missing(
    sweep_dir, written
):
    text = written[1]
    assert (
        "- slow: MHA (4 kv heads) also changes optim.learning_rate 0.0015 (baseline 0.003), optim.min_lr 0.00015 "
        "(baseline 0.0003)\n"
    ) in text
    assert (
        "- kv1_long: MQA (1 kv heads) also changes eval_interval 6 (baseline 12), max_iters 18 (baseline 12)\n" in text
    )
    assert text.count(" also changes ") == 2  # kv1_flops changes only its budget, `again` only its seeds
    arms, baseline = arms_of_main_shape(sweep_dir)
    assert all(
        r.missing == [] and r.left_out == [] for r in results(arms, baseline)
    )  # `again` ran seeds 4-6 on purpose
    assert "missing" not in text and "Left out" not in text


def test_an_uptrained_seed_that_stopped_early_is_left_out_and_the_rest_compared_at_equal_tokens(sweep_dir):
    arms = group_arms(read_sweep(sweep_dir).runs)
    up, scratch = (next(a for a in arms if a.name == name) for name in ("kv1_up", "kv1_long"))
    total = up.pretraining_tokens + up.runs[0].final["tokens"]
    stopped, short = up.runs[1], scratch.runs[2]  # seed 2 uptrained, seed 3 from scratch
    stopped.metrics = [r for r in stopped.metrics if r["kind"] != "eval" or r["step"] == 0]  # stopped at the conversion
    short.metrics = [r for r in short.metrics if r["kind"] != "eval" or r["tokens"] < total]
    (row,) = [r for r in uptraining(arms) if r.arm.name == "kv1_up"]
    assert row.arm.seeds == [1, 3] and row.scratch.seeds == [1, 2] and row.total_tokens == total
    assert row.final.mean == pytest.approx((up.runs[0].final["val_loss"] + up.runs[2].final["val_loss"]) / 2)
    assert row.scratch_at_total.mean == pytest.approx(
        sum(next(e["val_loss"] for e in run.evals if e["tokens"] == total) for run in scratch.runs[:2]) / 2
    )
    assert row.left_out[0].startswith(
        f"{stopped.path}: stopped at {up.pretraining_tokens:,} tokens (step 0), before "
        f"the {total:,} tokens arm kv1_up is compared at"
    )
    assert row.left_out[1].startswith(f"{short.path}: stopped at ") and len(row.left_out) == 2
    assert row.comparison.test == "Welch t-test"


def test_an_arm_that_trains_longer_is_compared_where_the_baseline_stopped(sweep_dir):
    arms, baseline = arms_of_main_shape(sweep_dir)
    row = next(r for r in results(arms, baseline) if r.arm.name == "kv1_long")
    tokens = baseline.runs[0].final["tokens"]
    assert row.tokens == tokens and row.axis == "equal tokens"
    assert row.val_loss == mean_ci(
        [next(e["val_loss"] for e in run.evals if e["tokens"] == tokens) for run in row.arm.runs]
    )


def test_a_matched_compute_arm_is_compared_at_its_own_end_where_its_flops_equal_the_baselines(sweep_dir, written):
    arms, baseline = arms_of_main_shape(sweep_dir)
    row = next(r for r in results(arms, baseline) if r.arm.name == "kv1_flops")
    base_tokens = baseline.runs[0].final["tokens"]
    step_tokens = base_tokens // 12
    assert row.axis == "equal FLOPs" and row.tokens == row.arm.runs[0].final["tokens"] > base_tokens
    assert row.arm.at_tokens(base_tokens) is not None  # evaluated where the baseline stopped, yet not compared there
    base_flops = baseline.flops_per_token * base_tokens
    assert base_flops <= row.flops < base_flops + row.arm.flops_per_token * step_tokens  # one step's rounding at most
    finals = [run.final["val_loss"] for run in row.arm.runs]
    assert replace(row.comparison, p_adjusted=None, family=1) == paired_difference(baseline.finals(), finals)
    line = next(line for line in written[1].splitlines() if line.startswith("| kv1_flops:"))
    assert f"| equal FLOPs | {row.tokens:,} | {row.flops:.4g} |" in line
    base_line = next(line for line in written[1].splitlines() if line.startswith("| MHA (4 kv heads) | 3 |"))
    assert f"| baseline | {base_tokens:,} | {base_flops:.4g} |" in base_line


def test_the_power_section_gives_each_comparisons_detectable_effect_and_the_seeds_for_the_effect(sweep_dir, written):
    arms, baseline = arms_of_main_shape(sweep_dir)
    section = written[1].split("### What these seeds can detect")[2]  # the main shape's; the narrow one is first
    for row in results(arms, baseline)[1:]:
        c = row.comparison
        line = next(line for line in section.splitlines() if line.startswith(f"| {row.arm.label} |"))
        assert (
            line == f"| {row.arm.label} | {c.sd:.4f} | {detectable_effect(c.se, c.df):.4f} | {seeds_needed(c, 0.01)} |"
        )
    assert "seeds for 0.01 nats" in section and "at alpha 0.05" in section


def test_the_add_seeds_command_composes_the_arms_settings_with_new_seeds(sweep_dir):
    arms, baseline = arms_of_main_shape(sweep_dir)
    slow = next(a for a in arms if a.name == "slow")
    (command,) = add_seeds_commands([(slow, 5)], sweep_dir)
    words = shlex.split(command)
    assert words[:3] == ["python", "train.py", "-m"] and "seed=4,5" in words
    assert f"hydra.sweep.dir={sweep_dir}" in words
    overrides = [w for w in words[3:] if not w.startswith(("seed=", "hydra."))]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        composed = OmegaConf.to_container(compose(config_name="train", overrides=[*overrides, "seed=4"]), resolve=True)
    recorded = dict(slow.runs[0].settings, seed=4, out_dir=None)
    assert not [w for w in words if w.startswith("model.vocab_size=")]  # the tokenizer sets it, not the command
    assert composed == dict(recorded, model=dict(recorded["model"], vocab_size=composed["model"]["vocab_size"]))
    assert add_seeds_commands([(slow, 3)], sweep_dir) == []  # it has them


def test_an_arm_evaluated_on_other_windows_at_the_baselines_tokens_is_not_compared_there(sweep_dir):
    """Under eval_whole_val=final the baseline's last evaluation covers the whole split, while an
    arm that trains longer was evaluated on a sample at those tokens: no equal-tokens comparison."""
    arms, baseline = arms_of_main_shape(sweep_dir)
    tokens = baseline.runs[0].final["tokens"]
    for run in baseline.runs:
        run.metrics = [dict(r, val_windows=10_000) if r is run.final else r for r in run.metrics]
    row = next(r for r in results(arms, baseline) if r.arm.name == "kv1_long")
    assert row.axis == "own end" and row.tokens == row.arm.runs[0].final["tokens"] > tokens


def test_report_writes_every_section_and_plot(written):
    out, text = written
    for section in (
        "## 2 layers x 64 dims",
        "## 2 layers x 32 dims",
        "## Across model sizes",
        "## Uptraining against training from scratch",
        "## Quality and decode speed",
        "## Attention patterns",
    ):
        assert section in text
    images = re.findall(r"\]\(([\w.]+\.png)\)", text)
    assert {"ladder.png", "uptraining.png", "frontier.png", "attention.png"} <= set(images)
    for image in images:
        assert (out / image).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| random weights (2 layers x 32, context 3 / 46) | MQA (1 kv heads) | 128 |" in text
    # The trained MHA model: K and V, 2 layers x 64 fp32 values, 1,024 bytes a token, over its context of 32.
    assert "| KV cache bytes/token | KV cache MiB (one full context) |" in text
    assert f"| MHA (4 kv heads) | 1,024 | {32 * 1024 / 2**20:.3f} |" in text  # 0.031 MiB; 0.033 would be MB


def test_the_report_gives_each_downstream_task_with_its_paired_difference(written):
    text = written[1]
    assert "### Downstream tasks" in text and "| arm | seeds | toy acc | vs baseline (95% CI) | p | Holm p |" in text
    assert "| MHA (4 kv heads) | 1, 2, 3 | 45.00 ± 24.84 | baseline | |" in text  # 35, 45, 55 %: t(2) x 10 / sqrt(3)
    assert re.search(r"\| MQA \(1 kv heads\) \| 1, 2, 3 \| 49\.00 ± 29\.81 \| \+4\.00 \(-0\.97\.\.\+8\.97\) \|", text)
    assert "quick acc" not in text  # a score on part of its task is not compared with anything
    assert "- kv4_seed1: quick was scored on 2 items (limit=2); left out: score it again without limit" in text


def test_report_on_a_directory_without_runs_says_so(tmp_path):
    with pytest.raises(SystemExit, match="no run directories with checkpoints"):
        report.main([str(tmp_path)])


def test_an_unknown_baseline_is_named(sweep_dir, tmp_path):
    with pytest.raises(SystemExit, match="--baseline nope: no such arm"):
        report.main([str(sweep_dir), "--out", str(tmp_path), "--baseline", "nope", "--no-gpt2-decode"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--prompt", ""], "^error: --prompt is empty: the heatmaps need at least one token of text$"),
        (["--effect", "0"], "^error: --effect must be a positive number of nats, got 0.0$"),
        (["--effect", "nan"], "^error: --effect must be a positive number of nats, got nan$"),
        (["--out", "{file}"], "^error: --out .*a_file is a file: pass a directory for report.md and the plots$"),
        (["--out", "{file}/below"], r"^error: Not a directory \(.*a_file/below"),
    ],
)
def test_report_options_that_cannot_work_are_one_line(sweep_dir, tmp_path, args, message):
    (tmp_path / "a_file").write_text("")
    args = [arg.format(file=tmp_path / "a_file") for arg in args]
    with pytest.raises(SystemExit, match=message):
        report.main([str(sweep_dir), *args, "--no-gpt2-decode"])
