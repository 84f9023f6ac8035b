"""What a run will cost: the arithmetic, the header's tokens line, the line after the first
steps, and estimate=true, which writes nothing."""

import re

import pytest
from hydra import compose, initialize_config_dir

from conf import CONF_DIR, load_config
from data.meta import read_meta
from run.metrics import read_metrics
from test_train import run_cli, run_in_process
from training.estimate import WARMUP_STEPS, duration, estimate, estimate_line, estimate_steps, rounded, tokens_line


def test_the_estimate_is_steps_times_tokens_over_the_rate_and_gpu_hours_times_the_price():
    # llm.c's run: 19,073 steps of 524,288 tokens = 9,999,745,024 tokens; at 1M tokens/s on 8 GPUs:
    e = estimate(steps=19_073, tokens_per_step=524_288, tok_per_s=1e6, world_size=8, gpu_hour=2.0)
    assert e.seconds == pytest.approx(9_999.745024)
    assert e.gpu_hours == pytest.approx(22.221655609)  # 9,999.745 s / 3,600 x 8 GPUs
    assert e.cost == pytest.approx(44.443311218)
    assert estimate(steps=10, tokens_per_step=100, tok_per_s=50, world_size=1, gpu_hour=None).cost is None


def test_the_lines_say_the_numbers_a_user_plans_with():
    assert tokens_line(max_iters=19_073, tokens_per_step=524_288, train_tokens=9_900_000_000) == (
        "tokens: 19,073 steps x 524,288 = 9,999,745,024 (10.00B) | prepared train split: 9,900,000,000 (9.90B) "
        "| 1.01 epochs"
    )
    line = estimate_line(
        tok_per_s=1e6, measured=(11, 20), steps_to_go=19_073, tokens_per_step=524_288, world_size=8, gpu_hour=2.0
    )
    assert line == (
        "estimate: 1,000,000 tokens/s (steps 11-20) | 19,073 steps to max_iters: 2 h 46 min of training, "
        "evaluations not included | cost 44.44 (22.2 GPU-hours x 2, 8 GPU(s))"
    )
    assert estimate_line(
        tok_per_s=1e6, measured=(11, 20), steps_to_go=1, tokens_per_step=1, world_size=1, gpu_hour=None
    ).endswith("| cost.gpu_hour=<price> adds the cost")
    assert [rounded(n) for n in (9_999_745_024, 4_844_571, 1_536)] == ["10.00B", "4.84M", "1.5k"]
    assert [rounded(n) for n in (10**9, 10**6, 10**6 - 1)] == ["1.00B", "1.00M", "1000.0k"]  # at each unit's edge
    assert [duration(s) for s in (12.4, 249, 9_999.7, 90_061)] == ["12 s", "4 min 09 s", "2 h 46 min", "1 d 1 h"]


def test_a_run_states_its_tokens_and_after_the_warmup_steps_its_estimate(train_overrides, tmp_path, capsys):
    run_dir = run_in_process(*train_overrides, "max_iters=12", "eval_interval=12", "cost.gpu_hour=3")
    out = capsys.readouterr().out
    train_tokens = read_meta(tmp_path / "data")["tokens"]["train"]  # 4 x 32 = 128 tokens per step
    assert f"tokens: 12 steps x 128 = 1,536 (1.5k) | prepared train split: {train_tokens:,}" in out
    first = WARMUP_STEPS + 1  # log_interval=1: the first window after the warm-up is step 11 alone
    estimates = re.findall(
        r"estimate: ([\d,]+) tokens/s \(steps (\d+)-(\d+)\) \| (\d+) steps to max_iters.*"
        r"\(([\d.]+) GPU-hours x 3, 1 GPU\(s\)\)",
        out,
    )
    assert len(estimates) == 1  # once a run
    rate, measured, to_go = estimates[0][0], estimates[0][1:3], estimates[0][3]
    assert measured == (str(first), str(first)) and to_go == str(12 - first)
    logged = next(r["tok_per_s"] for r in read_metrics(run_dir) if r["kind"] == "train" and r["step"] == first)
    assert rate == f"{logged:,.0f}"  # the rate of the window, as metrics.jsonl records it


def test_estimate_mode_times_steps_prints_the_estimate_and_writes_no_run(train_overrides, tmp_path, capsys):
    assert run_in_process(*train_overrides, "estimate=true", "estimate_steps=2", "cost.gpu_hour=2") is None
    out = capsys.readouterr().out
    assert "estimate=true (nothing written; data.tokenizer=char: its vocabulary comes from the corpus" in out
    assert "tokens: 30 steps x 128 = 3,840" in out and "peak memory: measured on a GPU only" in out
    assert re.search(
        rf"estimate: [\d,]+ tokens/s \(steps {WARMUP_STEPS + 1}-{WARMUP_STEPS + 2}\) \| 30 steps to "
        r"max_iters: .* \| cost [\d.]+ \([\d.]+ GPU-hours x 2, 1 GPU\(s\)\)",
        out,
    )
    runs = tmp_path / "runs"
    assert not runs.exists() or not any(runs.iterdir())


@pytest.mark.parametrize("setting", ["resume=true", "max_iters=0"])
def test_estimate_mode_refuses_what_it_cannot_time(setting):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="train", overrides=["estimate=true", setting])
    with pytest.raises(ValueError, match="estimate=true times the steps of a new run"):
        load_config(cfg)


def estimate_windows(out: str) -> list[tuple[int, int, int]]:
    """(first measured step, last measured step, steps to go) of each estimate line printed."""
    return [tuple(map(int, found)) for found in re.findall(r"\(steps (\d+)-(\d+)\) \| (\d+) steps to max_iters", out)]


def test_the_estimate_counts_the_steps_to_go_from_the_last_measured_step(train_overrides, capsys):
    """Windows of 3 steps: 10-12 starts inside the warm-up, so 13-15 is the first measured."""
    run_in_process(*train_overrides, "max_iters=20", "eval_interval=20", "logging.log_interval=3")
    assert estimate_windows(capsys.readouterr().out) == [(13, 15, 5)]


def test_a_resumed_runs_estimate_leaves_out_its_own_warm_up(train_overrides, tmp_path):
    """A resume compiles and warms up again: its estimate is timed WARMUP_STEPS after the step it resumed at."""
    run_dir = run_in_process(*train_overrides, "max_iters=12", "eval_interval=12")
    resumed = run_cli(f"resume={run_dir}", "max_iters=30", "eval_interval=30", cwd=tmp_path)
    first = 12 + WARMUP_STEPS + 1
    assert resumed.returncode == 0 and estimate_windows(resumed.stdout) == [(first, first, 30 - first)]


@pytest.mark.parametrize(
    "tokenizer, vocabulary",
    [(["data.tokenizer=gpt2"], "50,257"), (["data.tokenizer=bpe", "data.vocab_size=512"], "512")],
)
def test_estimate_mode_needs_no_corpus_when_the_vocabulary_is_known_without_it(
    train_overrides, tmp_path, capsys, tokenizer, vocabulary
):
    missing = tmp_path / "no_such_corpus.txt"  # preparing would fail on it
    assert (
        run_in_process(*train_overrides, f"data.path={missing}", *tokenizer, "estimate=true", "estimate_steps=1")
        is None
    )
    out = capsys.readouterr().out
    assert (
        f"estimate=true (nothing written; no data prepared: the steps run on random tokens of the {vocabulary}-"
        "token vocabulary, as a step's time does not depend on the text)"
    ) in out
    assert "tokens: 30 steps x 128 = 3,840 (3.8k) | train split not prepared yet" in out and "estimate: " in out
    assert not (tmp_path / "data").exists()


def test_estimate_mode_counts_its_steps_in_micro_batches():
    """A GPU recipe's step of 16 micro-batches warms up and times as many micro-batches as 16 steps of one."""
    assert estimate_steps(20, 1) == (range(0, WARMUP_STEPS), range(WARMUP_STEPS, WARMUP_STEPS + 20))
    assert estimate_steps(20, 16) == (range(0, 1), range(1, 3))
    assert estimate_steps(20, 2) == (range(0, 5), range(5, 15))
