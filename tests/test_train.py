"""train.py end to end: a real (tiny) run, exact resume after SIGKILL, SIGTERM, NaN, errors."""

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import train
from conf import CONF_DIR
from data import DataError
from run.checkpoints import CheckpointError, find_checkpoint, load_checkpoint
from run.metrics import read_metrics
from training.step import NonFiniteLoss

REPO = Path(__file__).resolve().parents[1]


def run_in_process(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="train", overrides=list(overrides))
    return train.train(cfg)


def start_train(*overrides, cwd):
    return subprocess.Popen(
        [sys.executable, str(REPO / "train.py"), *overrides],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def losses(run_dir):
    return [(r["step"], r["loss"]) for r in read_metrics(run_dir) if r["kind"] == "train"]


def wait_for_step(run_dir: Path, process, step: int) -> None:
    while not any(s >= step for s, _ in losses(run_dir)):
        assert process.poll() is None, process.communicate()[0]
        time.sleep(0.02)


def test_short_run_learns_and_leaves_a_complete_run_directory(train_overrides):
    run_dir = run_in_process(*train_overrides)
    evals = [r for r in read_metrics(run_dir) if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 10, 20, 30]
    assert evals[-1]["val_loss"] < 0.75 * evals[0]["val_loss"]  # 30 steps: well below the uniform ln(vocab)
    assert (run_dir / "config.yaml").is_file()
    checkpoint = load_checkpoint(find_checkpoint(run_dir, runs_root=run_dir.parent))
    assert checkpoint.training_state()["step"] == 30
    assert checkpoint.config["tokenizer"]["name"] == "char"
    assert checkpoint.model_config.vocab_size == 64  # 20-odd characters padded to a multiple of 64


def test_seed_scope_varies_only_the_weights_or_only_the_batches(train_overrides, tmp_path):
    def first_step(seed, scope):  # (the untrained model's val loss, step 1's training loss)
        run_dir = run_in_process(
            *train_overrides,
            "max_iters=1",
            "eval_interval=1",
            f"seed={seed}",
            f"seed_scope={scope}",
            f"out_dir={tmp_path / f'{scope}{seed}'}",
        )
        return next(r["val_loss"] for r in read_metrics(run_dir) if r["kind"] == "eval"), losses(run_dir)[0][1]

    weights_3, batches_0 = first_step(3, "weights")
    all_weights_3, all_batches_3 = first_step(3, "all")
    assert weights_3 == all_weights_3 and batches_0 != all_batches_3
    data_weights_0, data_batches_3 = first_step(3, "data")
    assert data_weights_0 != all_weights_3
    data_weights_4, data_batches_4 = first_step(4, "data")
    assert data_weights_0 == data_weights_4 and data_batches_3 != data_batches_4


def test_main_returns_the_run_directory_which_hydra_hands_to_callbacks(train_overrides, tmp_path):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="train", overrides=[*train_overrides, "max_iters=1", f"out_dir={tmp_path / 'run'}"])
    assert Path(train.main(cfg)).resolve() == (tmp_path / "run").resolve()  # evaluation/after_training.py scores it


def test_a_resume_records_its_overrides_in_the_runs_config(train_overrides, tmp_path):
    run_dir = run_in_process(*train_overrides, "max_iters=2", "eval_interval=2", f"out_dir={tmp_path / 'run'}")
    resumed = run_cli(f"resume={run_dir}", "max_iters=4", cwd=tmp_path)  # overrides come from the command line
    assert resumed.returncode == 0, resumed.stderr
    saved = OmegaConf.load(run_dir / "config.yaml")
    assert saved.max_iters == 4 and saved.resume is None  # report.py compares it with runs trained to 4 at once
    assert [step for step, _ in losses(run_dir)] == [1, 2, 3, 4]


def test_resume_after_sigkill_reproduces_the_uninterrupted_loss_log(train_overrides, tmp_path):
    # Dropout: the RNG state must resume too; accumulation: so must the micro-step batches.
    common = [*train_overrides, "max_iters=60", "model.dropout=0.1", "grad_accum_steps=2"]
    straight = run_in_process(*common, f"out_dir={tmp_path / 'straight'}")

    killed_dir = tmp_path / "killed"
    process = start_train(*common, f"out_dir={killed_dir}", cwd=tmp_path)
    wait_for_step(killed_dir, process, 25)  # past the checkpoint at step 20
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert max(s for s, _ in losses(killed_dir)) < 60  # it really died mid-run

    resumed = start_train(*common, f"resume={killed_dir}", cwd=tmp_path)
    output = resumed.communicate(timeout=120)[0]
    assert resumed.returncode == 0, output
    assert "resumed from" in output and "steps to go" in output
    assert losses(killed_dir) == losses(straight)  # step by step, bit for bit
    assert len(losses(straight)) == 60


def test_a_muon_run_resumed_from_a_checkpoint_equals_the_uninterrupted_run(train_overrides):
    """optim.name=muon: Muon's momentum and AdamW's moments come back with the schedule's
    learning rates (the same resume path as above, in process: seconds)."""
    overrides = [
        *train_overrides,
        "optim.name=muon",
        "model.dropout=0.1",
        "grad_accum_steps=2",
        "max_iters=8",
        "eval_interval=4",
    ]
    run_dir = run_in_process(*overrides)
    straight, final = losses(run_dir), run_dir / "checkpoints" / "step_000008"
    straight_weights = load_checkpoint(final).model_state
    run_in_process(*overrides, f"resume={run_dir / 'checkpoints' / 'step_000004'}")  # steps 5-8 again, in place
    assert losses(run_dir) == straight  # step by step, bit for bit
    for name, weight in load_checkpoint(final).model_state.items():
        assert torch.equal(weight, straight_weights[name]), name


def test_sigterm_finishes_the_step_saves_and_exits_cleanly(train_overrides, tmp_path):
    run_dir = tmp_path / "run"
    process = start_train(
        *train_overrides, "max_iters=100000", "eval_interval=100000", f"out_dir={run_dir}", cwd=tmp_path
    )
    wait_for_step(run_dir, process, 3)
    process.send_signal(signal.SIGTERM)
    output = process.communicate(timeout=60)[0]
    assert process.returncode == 0, output
    assert "SIGTERM: saved" in output
    step = load_checkpoint(find_checkpoint(run_dir, runs_root=tmp_path)).training_state()["step"]
    assert step >= 3 and step == max(s for s, _ in losses(run_dir))


def break_training_forward(monkeypatch, forwards, corrupt):
    """Apply corrupt(loss) to the loss of the given training forwards (1-based)."""
    original = train.GPT.forward
    calls = {"n": 0}

    def forward(self, idx, targets=None, **kwargs):
        logits, loss = original(self, idx, targets, **kwargs)
        if self.training:
            calls["n"] += 1
            if calls["n"] in forwards:
                loss = corrupt(loss)
        return logits, loss

    monkeypatch.setattr(train.GPT, "forward", forward)


def nan_loss(loss):
    return loss * float("nan")


def inf_gradients(loss):
    """The loss stays finite; every gradient behind it becomes inf or NaN."""
    loss.register_hook(lambda grad: grad * float("inf"))
    return loss


def final_checkpoint(run_dir):
    return load_checkpoint(find_checkpoint(run_dir, runs_root=run_dir.parent))


@pytest.mark.parametrize("corrupt", [nan_loss, inf_gradients])
def test_nonfinite_step_stops_the_run_and_keeps_the_last_good_checkpoint(train_overrides, monkeypatch, corrupt):
    break_training_forward(monkeypatch, range(13, 10**6), corrupt)
    with pytest.raises(NonFiniteLoss, match="non-finite at step 13.*step_000010"):
        run_in_process(*train_overrides)
    runs = list((Path(train_overrides[7].split("=", 1)[1])).glob("*"))
    checkpoint = final_checkpoint(runs[0])
    assert checkpoint.training_state()["step"] == 10
    assert all(torch.isfinite(t).all() for t in checkpoint.model_state.values())


@pytest.mark.parametrize("corrupt", [nan_loss, inf_gradients])
def test_a_skipped_nonfinite_step_leaves_later_steps_training(train_overrides, monkeypatch, corrupt):
    break_training_forward(monkeypatch, {13}, corrupt)
    run_dir = run_in_process(*train_overrides, "on_nonfinite=skip")
    records = [r for r in read_metrics(run_dir) if r["kind"] == "train"]
    assert [r["step"] for r in records if r["skipped"]] == [13]  # that step only: no stale gradient after it
    assert records[13]["loss"] < records[11]["loss"]  # and the updates go on
    checkpoint = final_checkpoint(run_dir)
    assert checkpoint.training_state()["step"] == 30
    assert all(torch.isfinite(t).all() for t in checkpoint.model_state.values())


def test_best_points_at_the_lowest_validation_loss(train_overrides, monkeypatch):
    scripted = iter([5.0, 3.0, 1.0, 2.0, 4.0])  # val loss at steps 0, 10, 20, 30, 40

    def evaluate(self, model, final=False):
        loss = next(scripted)
        return {"train_loss": loss, "train_ppl": 1.0, "val_loss": loss, "val_ppl": 1.0}

    monkeypatch.setattr(train.Evaluator, "__call__", evaluate)
    run_dir = run_in_process(*train_overrides, "max_iters=40", "keep_last=1")
    root = run_dir / "checkpoints"
    assert os.readlink(root / "best") == "step_000020"
    assert os.readlink(root / "latest") == "step_000040"
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("step_")) == ["step_000020", "step_000040"]


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.n_kv_head=3", r"n_kv_head \(3\) must divide n_head \(4\)"),
        ("optim.min_lr=1.0", r"optim.min_lr \(1.0\) must not exceed optim.learning_rate"),
        ("tokens_per_step=1000", r"tokens_per_step \(1000\) must be a multiple of block_size \* world_size \(32 \*"),
        ("tokens_per_step=96", r"tokens_per_step \(96\) must be a multiple of batch_size \* block_size \* world_size"),
        (
            "batch_size=auto",
            "batch_size=auto keeps the tokens per step through accumulation, so it needs tokens_per_step",
        ),
        ("on_nonfinite=ignore", "on_nonfinite must be one of"),
        (
            "logging.wandb.mode=cloud",
            r"logging.wandb.mode must be one of \('disabled', 'offline', 'online'\), got 'cloud'",
        ),
        ("resume=nowhere", "no checkpoint at nowhere"),
        ("resume=true", r"no checkpoint found under .*pass resume=PATH"),
        ("resume=", "^resume is empty: pass a checkpoint or run directory, or leave it unset$"),
        ("runs_root=", "^runs_root must be a non-empty text, got ''$"),
        ("out_dir=", "^out_dir must be a non-empty text"),
        (
            "model_path=runs/x",
            r"^model_path=runs/x is read only with init_from=checkpoint or hf, and init_from is scratch",
        ),
        ("seed=-1", r"^seed must be in \[0, 4294967295\], got -1$"),
        ("seed=4294967296", r"^seed must be in \[0, 4294967295\], got 4294967296$"),
    ],
)
def test_invalid_settings_fail_before_any_work(train_overrides, tmp_path, override, message):
    with pytest.raises((ValueError, CheckpointError), match=message):
        run_in_process(*train_overrides, override)
    assert not (tmp_path / "data").exists()  # rejected before the data was prepared


def test_resume_false_is_a_new_run(train_overrides):
    assert run_in_process(*train_overrides, "max_iters=2", "eval_interval=2", "resume=false").is_dir()


def test_missing_data_path_is_named(train_overrides, tmp_path):
    overrides = [o for o in train_overrides if not o.startswith("data.path")] + [f"data.path={tmp_path}/absent.txt"]
    with pytest.raises(DataError, match="absent.txt"):
        run_in_process(*overrides)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # no empty run left behind


def test_cli_reports_errors_without_a_traceback(train_overrides, tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "train.py"), *train_overrides, "model.n_embd=30"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "error: model.n_embd (30) must be divisible by n_head (4)" in result.stderr
    assert "Traceback" not in result.stderr


def test_wandb_offline_writes_its_run_files_without_a_login(train_overrides, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    run_dir = run_in_process(*train_overrides, "max_iters=10", "logging.wandb.mode=offline")
    offline_runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline_runs) == 1
    assert list(offline_runs[0].glob("*.wandb"))  # the event log `wandb sync` uploads


def test_wandb_online_without_a_key_is_refused_before_any_work(train_overrides, tmp_path, monkeypatch):
    import wandb

    monkeypatch.setattr(wandb, "login", lambda **kwargs: False)  # no API key on this machine
    with pytest.raises(ValueError, match=r"^logging.wandb.mode=online needs a wandb API key \(run `wandb login`"):
        run_in_process(*train_overrides, "max_iters=10", "logging.wandb.mode=online")
    assert not (tmp_path / "data").exists() and not (tmp_path / "runs").exists()  # nothing prepared or created


@pytest.mark.parametrize(
    "source, message", [("checkpoint", "no checkpoint at .*missing"), ("hf", "no directory .*missing")]
)
def test_a_model_path_that_leads_nowhere_is_refused_before_any_work(train_overrides, tmp_path, source, message):
    with pytest.raises(CheckpointError, match=message):
        run_in_process(*train_overrides, f"init_from={source}", f"model_path={tmp_path / 'missing'}")
    assert not (tmp_path / "data").exists() and not (tmp_path / "runs").exists()


def run_cli(*args, cwd):
    return subprocess.run(
        [sys.executable, str(REPO / "train.py"), *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_resume_refuses_a_different_model_shape_or_group(train_overrides, tmp_path):
    run_dir = run_in_process(*train_overrides, "max_iters=10")
    shape = run_cli(f"resume={run_dir}", "model.n_layer=3", "model.qk_norm=true", cwd=tmp_path)
    assert shape.returncode == 1
    assert (
        "holds a different model: model.n_layer: 2 saved, 3 asked; model.qk_norm: False saved, True asked;"
        in shape.stderr
    )
    group = run_cli(f"resume={run_dir}", "model=gpt2", cwd=tmp_path)
    assert group.returncode == 1
    assert "cannot apply 'model=gpt2' when resuming" in group.stderr


def test_compiled_training_matches_eager_and_saves_plain_checkpoints(train_overrides):
    """torch.compile on the CPU (inductor): same losses as eager, a checkpoint that loads
    into an uncompiled model."""
    eager = run_in_process(*train_overrides, "max_iters=3", "eval_interval=3")
    compiled = run_in_process(*train_overrides, "max_iters=3", "eval_interval=3", "compile=true")
    for (step, a), (_, b) in zip(losses(eager), losses(compiled)):
        assert a == pytest.approx(b, rel=1e-4), step
    checkpoint = load_checkpoint(find_checkpoint(compiled, runs_root=compiled.parent))
    assert not any(k.startswith("_orig_mod.") for k in checkpoint.model_state)


def eval_records(run_dir):
    return [r for r in read_metrics(run_dir) if r["kind"] == "eval"]


def test_uptraining_an_mha_checkpoint_into_mqa_reports_the_converted_loss(train_overrides):
    mha = run_in_process(*train_overrides)
    mqa = run_in_process(
        *train_overrides,
        "init_from=checkpoint",
        f"model_path={mha}",
        "model.n_kv_head=1",
        "max_iters=5",
        "eval_interval=5",
    )
    assert load_checkpoint(find_checkpoint(mqa, runs_root=mqa.parent)).model_config.n_kv_head == 1
    converted, mha_final = eval_records(mqa)[0], eval_records(mha)[-1]
    assert converted["step"] == 0  # the pooled model's loss, before any uptraining
    untrained = eval_records(mha)[0]["val_loss"]
    # Pooling keeps most of what MHA learned: far closer to it than to a fresh model.
    assert converted["val_loss"] - mha_final["val_loss"] < 0.5 * (untrained - mha_final["val_loss"])


def test_init_from_hugging_face_weights(train_overrides, tmp_path):
    from hf_reference import hf_gpt2

    hf_dir = tmp_path / "hf"
    hf_gpt2(n_layer=1, n_embd=16, n_head=2, vocab_size=50257, n_positions=32).save_pretrained(hf_dir)
    overrides = [o for o in train_overrides if o != "data.tokenizer=char"] + ["data.tokenizer=gpt2", "data.name=hfinit"]
    run_dir = run_in_process(
        *overrides,
        "init_from=hf",
        f"model_path={hf_dir}",
        "max_iters=2",
        "eval_interval=2",
        f"data.data_dir={tmp_path / 'gpt2data'}",
    )
    config = load_checkpoint(find_checkpoint(run_dir, runs_root=run_dir.parent)).model_config
    assert (config.n_layer, config.n_embd, config.vocab_size, config.block_size) == (1, 16, 50257, 32)

    # A shorter context crops the position table, and the step's size is counted at it.
    cropped = run_in_process(
        *overrides,
        "init_from=hf",
        f"model_path={hf_dir}",
        "max_iters=2",
        "eval_interval=2",
        f"data.data_dir={tmp_path / 'gpt2data'}",
        "model.block_size=16",
        "tokens_per_step=128",
    )
    assert final_checkpoint(cropped).model_config.block_size == 16
    assert [r["tokens"] for r in read_metrics(cropped) if r["kind"] == "train"] == [128, 256]  # 4 x 16 x 2 micro-steps
    with pytest.raises(ValueError, match=r"model.block_size \(64\) is longer than the context of .* \(32\)"):
        run_in_process(
            *overrides,
            "init_from=hf",
            f"model_path={hf_dir}",
            f"data.data_dir={tmp_path / 'gpt2data'}",
            "model.block_size=64",
        )
    with pytest.raises(ValueError, match="init_from=hf needs the gpt2 tokenizer"):
        run_in_process(*train_overrides, "init_from=hf", f"model_path={hf_dir}")


def test_a_sweep_ends_with_its_directory_and_the_report_command_and_its_runs_are_found(train_overrides, tmp_path):
    result = run_cli("-m", *train_overrides, "max_iters=2", "eval_interval=2", "model.n_kv_head=4,1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    [sweep] = list((tmp_path / "runs").glob("multirun_*"))
    assert f"sweep: {sweep}\nreport on it: python report.py {sweep}" in result.stdout
    newest = find_checkpoint(None, runs_root=tmp_path / "runs")  # what sample.py and resume=true pick
    assert newest == (sweep / "1" / "checkpoints" / "step_000002").resolve()


def test_a_run_that_ends_inside_the_warmup_is_warned_about(train_overrides, capsys):
    run_in_process(*train_overrides, "max_iters=3", "eval_interval=3")  # warmup_iters=5
    assert "warning: max_iters (3) ends inside the warmup (optim.warmup_iters=5)" in capsys.readouterr().out


def test_max_iters_zero_evaluates_a_checkpoint_and_writes_nothing(train_overrides, capsys):
    run_dir = run_in_process(*train_overrides)
    final = eval_records(run_dir)[-1]
    assert final["val_bpb"] == pytest.approx(final["val_loss"] / math.log(2))  # ASCII text: one byte a character
    runs_before = sorted(run_dir.parent.iterdir())
    capsys.readouterr()
    assert run_in_process(*train_overrides, "max_iters=0", "init_from=checkpoint", f"model_path={run_dir}") is None
    printed = capsys.readouterr().out
    assert f"evaluated weights: init_from=checkpoint {run_dir}" in printed
    # The same eval batches as the run's own last evaluation, so the same figures.
    assert (
        f"val   loss {final['val_loss']:.4f} | ppl {final['val_ppl']:.2f} | {final['val_bpb']:.4f} bits/byte" in printed
    )
    assert sorted(run_dir.parent.iterdir()) == runs_before
    # The form docs/training.md leads with: the run's own config, whatever its context (32 here, not the preset's 64).
    logged = read_metrics(run_dir)
    result = run_cli(f"resume={run_dir}", "max_iters=0", cwd=run_dir.parent.parent)
    assert result.returncode == 0, result.stderr
    assert "val windows of 32 tokens" in result.stdout
    assert (
        f"val   loss {final['val_loss']:.4f} | ppl {final['val_ppl']:.2f} | {final['val_bpb']:.4f} bits/byte"
        in result.stdout
    )
    assert read_metrics(run_dir) == logged and sorted(run_dir.parent.iterdir()) == runs_before


def test_a_run_without_loss_scaling_resumes_in_fp16(train_overrides, tmp_path):
    run_dir = run_in_process(*train_overrides, "max_iters=3", "eval_interval=3")  # fp32: an empty scaler state
    result = run_cli(f"resume={run_dir}", "precision=fp16", "max_iters=4", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert final_checkpoint(run_dir).training_state()["scaler"]["scale"] == 65536.0  # fp16's own, fresh


def test_resuming_an_older_checkpoint_says_so_and_a_resume_with_nothing_to_train_keeps_the_log(
    train_overrides, tmp_path
):
    run_dir = run_in_process(*train_overrides)  # checkpoints at steps 10, 20, 30
    before = read_metrics(run_dir)
    result = run_cli(f"resume={run_dir / 'checkpoints' / 'step_000020'}", "max_iters=20", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "an older checkpoint than latest, step_000030: nothing to train, so the log is kept whole" in result.stdout
    assert read_metrics(run_dir) == before


def test_one_writer_per_run_directory(train_overrides, tmp_path):
    run_dir = tmp_path / "run"
    first = start_train(*train_overrides, "max_iters=100000", "eval_interval=5", f"out_dir={run_dir}", cwd=tmp_path)
    try:
        wait_for_step(run_dir, first, 6)  # past its first checkpoint
        resume = run_cli(f"resume={run_dir}", cwd=tmp_path)  # would truncate the log the first is writing
        assert resume.returncode == 1
        assert f"error: {run_dir} is in use: process {first.pid} is writing it" in resume.stderr
        assert first.poll() is None  # the first run goes on, its log whole
        steps = [s for s, _ in losses(run_dir)]  # one read: the first run is still writing
        assert steps == list(range(1, len(steps) + 1))
    finally:
        first.kill()
        first.wait()
