"""report.py refuses or flags what it cannot compare honestly: runs that stopped before
the comparison point, run directories without checkpoints, runs on other data or
settings, `latest` links that lead nowhere, and missing seeds."""

import contextlib
import io
import json
import os
import shutil

import pytest
from hydra import compose, initialize_config_dir

import report
import train
from ablation.compare import baseline_of, results
from ablation.runs import group_arms, read_sweep
from conf import CONF_DIR
from conftest import training_overrides

STEPS, EVERY = 24, 12  # evaluations at 0, 12 and 24 steps
TOKENS_PER_STEP = 4 * 32  # batch_size x block_size of training_overrides


def train_run(directory, out, name, seed, *overrides):
    """A real tiny run of arm `name` under `seed`, into directory/out/<name>_seed<seed>."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(
            config_name="train",
            overrides=[
                *training_overrides(directory),
                f"max_iters={STEPS}",
                f"eval_interval={EVERY}",
                f"seed={seed}",
                f"arm={name}",
                f"out_dir={directory / out / f'{name}_seed{seed}'}",
                *overrides,
            ],
        )
    with contextlib.redirect_stdout(io.StringIO()):
        train.train(cfg)
    return directory / out / f"{name}_seed{seed}"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """MHA and MQA under seeds 1 and 2, and the odd runs each fault puts into a copy of them:
    an MQA and an MHA seed that stopped at 12 steps, an MQA seed on another corpus, a GQA
    run with another batch size."""
    directory = tmp_path_factory.mktemp("faults")
    for seed in (1, 2):
        train_run(directory, "runs", "kv4", seed)
        train_run(directory, "runs", "kv1", seed, "model.n_kv_head=1")
    other = directory / "other.txt"
    other.write_text("the quick brown fox jumps over the lazy dog.\n" * 60)
    return directory / "runs", {
        "short": train_run(directory, "short", "kv1", 2, "model.n_kv_head=1", f"max_iters={EVERY}"),
        "short_base": train_run(directory, "short", "kv4", 2, f"max_iters={EVERY}"),
        "corpus": train_run(
            directory,
            "corpus",
            "kv1",
            3,
            "model.n_kv_head=1",
            f"data.path={other}",
            f"data.data_dir={directory / 'other_data'}",
        ),
        "batch": train_run(directory, "batch", "kv2", 1, "model.n_kv_head=2", "batch_size=2"),
    }


@pytest.fixture
def sweep(trained, tmp_path):
    """A fresh copy of the four good runs, for one test to damage."""
    shutil.copytree(trained[0], tmp_path / "sweep", symlinks=True)
    return tmp_path / "sweep"


def swap_in(sweep, trained, odd, name):
    """Put the odd run `odd` into the sweep as run directory `name`."""
    shutil.rmtree(sweep / name, ignore_errors=True)
    shutil.copytree(trained[1][odd], sweep / name, symlinks=True)


def rows_of(sweep):
    arms = group_arms(read_sweep(sweep).runs)
    return {r.arm.name: r for r in results(arms, baseline_of(arms, None))}


def loss_at(run_dir, tokens):
    """The val loss metrics.jsonl records at `tokens`, read here without the report's code."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return next(r["val_loss"] for r in records if r["kind"] == "eval" and r["tokens"] == tokens)


def write(sweep, out):
    report.main([str(sweep), "--out", str(out), "--no-gpt2-decode", "--decode-steps", "1"])
    return (out / "report.md").read_text()


def test_a_seed_that_stopped_before_the_comparison_point_is_named_and_the_rest_compared(sweep, trained):
    swap_in(sweep, trained, "short", "kv1_seed2")  # max_iters=12: its last evaluation is at 1,536 tokens
    mqa = rows_of(sweep)["kv1"]
    end = STEPS * TOKENS_PER_STEP
    assert mqa.tokens == end and mqa.axis == "equal tokens" and mqa.arm.seeds == [1] and mqa.missing == [2]
    (line,) = mqa.left_out
    assert line == (
        f"{sweep / 'kv1_seed2'}: stopped at {EVERY * TOKENS_PER_STEP:,} tokens (step {EVERY}), before "
        f"the {end:,} tokens arm kv1 is compared at; left out of that comparison"
    )
    baseline = [loss_at(sweep / f"kv4_seed{seed}", end) for seed in (1, 2)]
    assert mqa.val_loss.mean == loss_at(sweep / "kv1_seed1", end)
    assert mqa.comparison.difference.mean == pytest.approx(loss_at(sweep / "kv1_seed1", end) - sum(baseline) / 2)


def test_a_baseline_seed_that_stopped_early_is_left_out_not_compared_at_its_own_end(sweep, trained):
    swap_in(sweep, trained, "short_base", "kv4_seed2")
    rows = rows_of(sweep)
    end = STEPS * TOKENS_PER_STEP
    assert (
        rows["kv4"].arm.seeds == [1]
        and rows["kv4"].tokens == end
        and "kv4_seed2: stopped at" in rows["kv4"].left_out[0]
    )
    mqa = [loss_at(sweep / f"kv1_seed{seed}", end) for seed in (1, 2)]
    assert rows["kv1"].comparison.difference.mean == pytest.approx(sum(mqa) / 2 - loss_at(sweep / "kv4_seed1", end))


def test_a_run_whose_checkpoints_were_deleted_is_named_and_its_seed_shown_missing(sweep, tmp_path, capsys):
    shutil.rmtree(sweep / "kv1_seed2" / "checkpoints")
    text = write(sweep, tmp_path / "out")
    why = (
        f"{sweep / 'kv1_seed2'}: its checkpoints are gone (its metrics.jsonl has evaluations past step 0, each "
        "followed by a save); left out"
    )
    assert f"warning: {why}\n" in capsys.readouterr().err
    assert "3 runs in 2 arms" in text and f"Left out of the comparisons (1):\n\n- {why}\n" in text
    end = STEPS * TOKENS_PER_STEP
    difference = loss_at(sweep / "kv1_seed1", end) - sum(loss_at(sweep / f"kv4_seed{s}", end) for s in (1, 2)) / 2
    row = next(line for line in text.splitlines() if line.startswith("| MQA (1 kv heads) |"))
    assert row.startswith("| MQA (1 kv heads) | 1 (seed 2 missing) |") and f"| {difference:+.4f} (no CI) |" in row
    assert "nan" not in text


def test_a_missing_seed_shows_the_value_and_says_so(sweep):
    shutil.rmtree(sweep / "kv1_seed1")
    rows = list(rows_of(sweep).values())
    table = report.shape_section(rows[0].arm.shape, rows, "val_loss.png")
    end = STEPS * TOKENS_PER_STEP
    difference = loss_at(sweep / "kv1_seed2", end) - sum(loss_at(sweep / f"kv4_seed{s}", end) for s in (1, 2)) / 2
    assert "| 1 (seed 1 missing) |" in table and f"| {difference:+.4f} (no CI) |" in table and "nan" not in table


@pytest.mark.parametrize(
    "odd, name, message",
    [
        (
            "corpus",
            "kv1_seed3",
            r"kv1_seed3 trained on other data than .*kv1_seed1: data.path \('.*other.txt' and '.*corpus.txt'\), "
            r"tokenizer.chars \('.*' and '.*'\); a loss on other text or tokens is not comparable",
        ),
        (
            "batch",
            "kv2_seed1",
            r"kv2_seed1 \(arm kv2\) differs from the baseline .*kv4_seed1 \(arm kv4\) in batch_size \(2 and "
            r"4\): arms under their default names kv<n> may differ only in arm, model.n_kv_head, "
            r"match_mha_flops, tokens_per_param and seed; give a deliberate change an arm name of its own",
        ),
    ],
    ids=["corpus", "batch"],
)
def test_a_run_on_other_data_or_settings_is_refused_naming_the_setting(sweep, trained, tmp_path, odd, name, message):
    swap_in(sweep, trained, odd, name)
    with pytest.raises(SystemExit, match="^error: .*" + message):
        write(sweep, tmp_path / "out")


def test_a_setting_a_run_predates_is_not_compared(sweep):
    config = sweep / "kv1_seed2" / "config.yaml"
    config.write_text(
        "".join(line for line in config.read_text().splitlines(keepends=True) if not line.startswith("eval_whole_val:"))
    )
    rows = rows_of(sweep)
    assert rows["kv1"].arm.seeds == [1, 2] and rows["kv1"].comparison.test == "paired t-test"


def test_two_seeds_of_an_arm_with_another_schedule_are_refused(sweep, tmp_path):
    config = sweep / "kv1_seed2" / "config.yaml"
    config.write_text(config.read_text().replace("warmup_iters: 5", "warmup_iters: 3"))
    with pytest.raises(
        SystemExit,
        match=r"kv1_seed2 and .*kv1_seed1, two seeds of arm kv1, differ in optim.warmup_iters "
        r"\(3 and 5\): the runs of an arm may differ in their seed only",
    ):
        write(sweep, tmp_path / "out")


def test_latest_links_that_lead_nowhere_fall_back_to_the_newest_complete_checkpoint(sweep, capsys):
    checkpoints = {run: sweep / run / "checkpoints" for run in ("kv4_seed1", "kv4_seed2", "kv1_seed1", "kv1_seed2")}
    shutil.rmtree(checkpoints["kv4_seed1"] / f"step_{STEPS:06d}")  # dangling
    (checkpoints["kv4_seed2"] / "latest").unlink()
    os.symlink("latest", checkpoints["kv4_seed2"] / "latest")  # a loop
    (checkpoints["kv1_seed1"] / "latest").unlink()  # missing
    sweep_read = read_sweep(sweep)
    used = {run.path.name: run.checkpoint.path.name for run in sweep_read.runs}
    assert (
        used
        == {
            "kv4_seed1": f"step_{EVERY:06d}",
            "kv4_seed2": f"step_{STEPS:06d}",
            "kv1_seed1": f"step_{STEPS:06d}",
            "kv1_seed2": f"step_{STEPS:06d}",
        }
        and sweep_read.left_out == []
    )
    warnings = capsys.readouterr().err
    assert all(f"warning: {checkpoints[run]}" in warnings for run in ("kv4_seed1", "kv4_seed2", "kv1_seed1"))


def test_a_run_with_no_checkpoint_left_is_named_and_left_out(sweep):
    for step in (EVERY, STEPS):
        shutil.rmtree(sweep / "kv1_seed2" / "checkpoints" / f"step_{step:06d}")
    (line,) = read_sweep(sweep).left_out
    assert line.startswith(
        f"{sweep / 'kv1_seed2'}: {sweep / 'kv1_seed2' / 'checkpoints' / 'latest'} leads to "
        f"step_{STEPS:06d}, which is gone, and no other checkpoint is left"
    )
