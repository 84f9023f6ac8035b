"""Faults around a run: signals at every phase, a full disk, a run that dies before its
first checkpoint, damaged run files, unusable directories. Each ends in one message that
says what is intact and what to do, and loses nothing."""

import errno
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig

import train
from conf import CONF_DIR
from data import DataError
from report import write_report
from system import GracefulStop, Interrupted, interrupts_raise
from run import checkpoint as ckpt
from run import checkpoints as manager
from run.checkpoint import CheckpointError
from run.metrics import read_metrics
from run.run_dir import resolve_resume

REPO = Path(__file__).resolve().parents[1]


def composed(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose(config_name="train", overrides=list(overrides))


def as_command(*overrides):
    """The config of `train.py *overrides`, with Hydra's record of the command line that resume reads."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="train", overrides=list(overrides), return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    return cfg


def train_cli(*args, cwd, processes=1):
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    command = [*(launcher if processes > 1 else [sys.executable]), str(REPO / "train.py"), *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=180)


def steps_logged(run_dir):
    return [(r["kind"], r["step"]) for r in read_metrics(run_dir)]


@pytest.fixture(autouse=True)
def restore_signal_handlers():
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_a_second_signal_in_the_loop_interrupts_at_once_with_the_shells_exit_code():
    with GracefulStop() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested == "SIGINT"  # the first only asks the loop to save and stop
        with pytest.raises(Interrupted) as second:
            os.kill(os.getpid(), signal.SIGTERM)
    assert (second.value.signal, second.value.exit_code) == ("SIGTERM", 128 + signal.SIGTERM)


def test_outside_the_loop_a_signal_raises_and_after_the_run_signals_are_ignored():
    with interrupts_raise():
        with pytest.raises(Interrupted, match="SIGINT"):
            os.kill(os.getpid(), signal.SIGINT)
        try:
            {}["missing"]
        except Exception:  # an `except Exception` on the way does not swallow it
            with pytest.raises(Interrupted):
                os.kill(os.getpid(), signal.SIGTERM)
    # interpreter shutdown after a finished run: a late signal cannot change the exit code
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN and signal.getsignal(signal.SIGTERM) is signal.SIG_IGN


def test_a_signal_before_the_first_checkpoint_leaves_a_run_that_resume_starts_afresh(train_overrides, tmp_path):
    run_dir = tmp_path / "run"
    # A long step-0 evaluation: the signal lands after config.yaml, before the loop.
    process = subprocess.Popen([sys.executable, str(REPO / "train.py"), *train_overrides, "eval_iters=3000",
                                f"out_dir={run_dir}"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    while not (run_dir / "config.yaml").exists():
        assert process.poll() is None, process.communicate()
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, stdout + stderr
    assert f"error: SIGTERM: stopped before the first checkpoint; resume={run_dir} starts the run afresh" in stderr
    assert "Traceback" not in stderr and not ckpt.has_checkpoint(run_dir)

    resumed = train_cli(f"resume={run_dir}", "eval_iters=2", "max_iters=4", "eval_interval=2", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{run_dir} held a run that stopped before its first checkpoint: starting it afresh" in resumed.stdout
    assert steps_logged(run_dir) == [("eval", 0), ("train", 1), ("train", 2), ("eval", 2), ("train", 3),
                                     ("train", 4), ("eval", 4)]  # one run's log, not two
    again = train_cli(*train_overrides, f"out_dir={run_dir}", cwd=tmp_path)
    assert again.returncode == 1 and f"error: {run_dir} already holds a run; pass resume={run_dir}" in again.stderr


def test_a_new_run_takes_over_a_directory_whose_run_failed_before_its_first_checkpoint(train_overrides, tmp_path,
                                                                                       monkeypatch):
    run_dir = tmp_path / "run"
    with pytest.raises(DataError, match="batch_size"):  # fails before its first step
        train.train(composed(*train_overrides, "batch_size=200000", f"out_dir={run_dir}"))
    monkeypatch.setattr(train, "train_step", lambda *args, **kwargs: 1 / 0)
    with pytest.raises(ZeroDivisionError):  # fails after logging its step-0 evaluation
        train.train(composed(*train_overrides, "batch_size=3", f"out_dir={run_dir}"))
    assert steps_logged(run_dir) == [("eval", 0)] and not ckpt.has_checkpoint(run_dir)
    monkeypatch.undo()
    train.train(composed(*train_overrides, "max_iters=2", "eval_interval=2", f"out_dir={run_dir}"))
    assert steps_logged(run_dir) == [("eval", 0), ("train", 1), ("train", 2), ("eval", 2)]  # one run's log
    assert "batch_size: 4" in (run_dir / "config.yaml").read_text()  # the new run's settings


@pytest.mark.parametrize("max_iters", [4, 2])  # the first save past step 0 mid-run, or the run's last
def test_a_signal_that_cuts_the_first_save_short_says_what_resume_then_does(train_overrides, tmp_path, monkeypatch,
                                                                           max_iters):
    """Ctrl-C twice just after the first evaluation past step 0: its record is logged, its save cut short."""
    run_dir = tmp_path / "run"

    def second_signal(*args, **kwargs):
        raise Interrupted(signal.SIGINT)

    monkeypatch.setattr(manager, "save_file", second_signal)
    with pytest.raises(Interrupted) as stop:
        train.train(composed(*train_overrides, f"max_iters={max_iters}", "eval_interval=2", f"out_dir={run_dir}"))
    monkeypatch.undo()
    assert steps_logged(run_dir)[-1] == ("eval", 2) and not ckpt.has_checkpoint(run_dir)
    if max_iters == 4:  # the log cannot be a finished run's: resume starts it afresh, as it said
        assert str(stop.value) == f"SIGINT: stopped before the first checkpoint; resume={run_dir} starts the run afresh"
        train.train(composed(f"resume={run_dir}"))
        assert steps_logged(run_dir) == [("eval", 0), ("train", 1), ("train", 2), ("eval", 2), ("train", 3),
                                         ("train", 4), ("eval", 4)]  # one run's log, not two
    else:  # the log reads as a finished run whose checkpoints were deleted: resume refuses, as it said
        assert str(stop.value) == (f"SIGINT: no checkpoint is left, and its metrics.jsonl reads as a run that saved "
                                   f"one, so resume={run_dir} refuses it: train into another out_dir, or delete "
                                   f"{run_dir} to run it again there")
        with pytest.raises(ValueError, match="held a run that saved checkpoints .* and they are gone"):
            train.train(composed(f"resume={run_dir}"))


@pytest.mark.parametrize("override", ["seed_scope=weights", "seed=7"])
def test_a_resume_that_changes_what_the_seeds_meant_is_refused(finished_run, override):
    key, value = override.split("=")
    saved = yaml.safe_load((finished_run / "config.yaml").read_text())
    with pytest.raises(ValueError) as refused:
        resolve_resume(as_command(f"resume={finished_run}", override, "max_iters=4"))
    assert str(refused.value) == (f"cannot apply {override} when resuming {finished_run}: it was started with "
                                  f"{key}={saved[key]}, which seeded its steps so far (start a new run instead)")
    same = as_command(f"resume={finished_run}", f"seed={saved['seed']}", f"seed_scope={saved['seed_scope']}",
                      "max_iters=4")  # the original command again, with a new end
    assert resolve_resume(same)[0].max_iters == 4


def test_a_full_disk_while_saving_ends_the_run_with_one_message_and_keeps_the_log(train_overrides, monkeypatch):
    saves = {"n": 0}
    real_save_file = manager.save_file

    def fills_the_disk_on_the_second_save(*args, **kwargs):
        saves["n"] += 1
        if saves["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save_file(*args, **kwargs)

    monkeypatch.setattr(manager, "save_file", fills_the_disk_on_the_second_save)
    with pytest.raises(CheckpointError, match=r"^no space left on device writing checkpoint .*step_000020; the last "
                                              r"good checkpoint .*step_000010 is intact$"):
        train.train(composed(*train_overrides))
    run_dir = next((Path(train_overrides[7].split("=", 1)[1])).iterdir())
    assert steps_logged(run_dir)[-2:] == [("train", 20), ("eval", 20)]  # every line written before is whole
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["best", "latest", "step_000010"]


def test_a_failed_save_on_rank_0_stops_every_rank_with_the_error(train_overrides, tmp_path):
    """Rank 0 alone saves; without telling the others, they would wait in their next
    collective until the process group times out."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "checkpoints").write_text("a file where the checkpoints directory belongs")
    result = train_cli(*train_overrides, "max_iters=2", "eval_interval=2", f"out_dir={run_dir}", cwd=tmp_path,
                       processes=2)
    assert result.returncode != 0
    assert result.stderr.count("error: could not write the checkpoint (FileExistsError") == 2, result.stderr


SLOW_PREPARE_UNDER_A_SHORT_TIMEOUT = """
import datetime, os, runpy, sys, time
import torch.distributed as dist
import data.preparation

real_init, real_build, real_lock = dist.init_process_group, data.preparation._build, data.preparation._only_preparer
# 15 s: longer than the ranks' skew after the prepare on a loaded 2-core machine (3 s and
# 6 s were not, under CI's load), half the prepare.
dist.init_process_group = lambda *a, **k: real_init(*a, **k, timeout=datetime.timedelta(seconds=15))
preparing = {marker!r}
def slow_build(*args):
    open(preparing, "w").close()  # rank 0 holds the lock from here on
    time.sleep(30)  # rank 0 prepares for longer than any collective may wait
    return real_build(*args)
def lock_once_rank_0_prepares(data_dir):
    while not os.path.exists(preparing):  # a fixed head start loses the race on a loaded machine
        time.sleep(0.05)
    return real_lock(data_dir)
if os.environ["RANK"] == "0":
    data.preparation._build = slow_build
else:
    data.preparation._only_preparer = lock_once_rank_0_prepares
sys.argv = [{train_py!r}] + sys.argv[1:]
runpy.run_path({train_py!r}, run_name="__main__")
"""


def test_ranks_wait_for_a_long_prepare_without_a_collective_timing_out(train_overrides, tmp_path):
    script = tmp_path / "slow_prepare.py"
    script.write_text(SLOW_PREPARE_UNDER_A_SHORT_TIMEOUT.format(train_py=str(REPO / "train.py"),
                                                                marker=str(tmp_path / "rank_0_preparing")))
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    result = subprocess.run([*launcher, str(script), *train_overrides, "max_iters=2", "eval_interval=2"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=180,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    assert "waiting for it to finish" in result.stdout  # rank 1 waited on the lock (logged by Hydra to stdout)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    from conftest import training_overrides

    directory = tmp_path_factory.mktemp("finished")
    return train.train(composed(*training_overrides(directory), "max_iters=2", "eval_interval=2"))


@pytest.mark.parametrize("damage, reason", [
    (lambda text: "max_iters: [unclosed\n" + text, "ParserError|ScannerError"),
    (lambda text: "!!python/object/apply:os.system [echo owned]\n", "ConstructorError|UnsupportedValueType"),
    (lambda text: b"max_iters: \xff\xfe\n", "UnicodeDecodeError"),
    (lambda text: "- just\n- a list\n", "it holds a list"),
    (lambda text: "", "it is empty"),
])
def test_a_damaged_run_config_is_named_when_resuming(finished_run, tmp_path, damage, reason):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir, symlinks=True)
    damaged = damage((run_dir / "config.yaml").read_text())
    (run_dir / "config.yaml").write_bytes(damaged if isinstance(damaged, bytes) else damaged.encode())
    with pytest.raises(CheckpointError, match=f"{run_dir / 'config.yaml'} is damaged \\(({reason})"):
        resolve_resume(composed(f"resume={run_dir}"))


@pytest.mark.parametrize("edit, why", [
    (lambda text: re.sub(r"(?m)^seed: .*$", "seed: abc", text), "Value 'abc' of type 'str' could not be converted to Integer (at seed)"),
    (lambda text: text + "colour: blue\n", "Key 'colour' not in 'Config' (at colour)"),
])
def test_a_run_config_that_does_not_fit_the_settings_is_one_line(finished_run, tmp_path, edit, why):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir, symlinks=True)
    (run_dir / "config.yaml").write_text(edit((run_dir / "config.yaml").read_text()))
    with pytest.raises(ValueError) as error:
        resolve_resume(composed(f"resume={run_dir}"))
    assert str(error.value) == (f"{run_dir / 'config.yaml'} does not fit train.py's settings: {why}; "
                                "mend that value in it, or start a new run")


@pytest.mark.parametrize("setting", ["out_dir=/proc/gptlab_run", "runs_root=/dev/null/runs"])
def test_a_run_directory_that_cannot_be_made_is_refused_naming_the_setting(train_overrides, setting):
    with pytest.raises(ValueError, match=f"^{setting}: cannot create that directory"):
        train.train(composed(*train_overrides, setting))


def test_a_resumed_run_first_removes_what_killed_saves_left_behind(finished_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir, symlinks=True)
    killed_save = run_dir / "checkpoints" / ".tmp_step_000003_4242"
    shutil.copytree(run_dir / "checkpoints" / "step_000002", killed_save)
    train.train(composed(f"resume={run_dir}"))  # nothing left to train: no save would prune it
    assert not killed_save.exists()


def edit_checkpoint_config(run_dir, edit):
    """A checkpoint whose files are intact (digests recorded anew) but whose config is wrong."""
    checkpoint = run_dir / "checkpoints" / "latest"
    config = yaml.safe_load((checkpoint / "config.yaml").read_text())
    edit(config)
    (checkpoint / "config.yaml").write_text(yaml.safe_dump(config))
    ckpt.write_digests(checkpoint)


@pytest.mark.parametrize("damage, message", [
    (lambda run: (run / "metrics.jsonl").unlink(), "has no metrics.jsonl: it is needed to compare the run"),
    (lambda run: (run / "metrics.jsonl").write_text(""), "metrics.jsonl has no evaluation records"),
    (lambda run: edit_checkpoint_config(run, lambda c: c.pop("tokenizer")), "does not describe a tokenizer"),
    (lambda run: edit_checkpoint_config(run, lambda c: c["model"].update(n_head="four")), "invalid model section"),
])
def test_the_report_names_a_damaged_run(finished_run, tmp_path, damage, message):
    sweep = tmp_path / "sweep"
    shutil.copytree(finished_run, sweep / "mha", symlinks=True)
    damage(sweep / "mha")
    with pytest.raises(CheckpointError, match=message):
        write_report(sweep, sweep, decode_steps=1)


def test_the_report_of_a_char_level_run_shows_the_prompt_its_tokenizer_can_encode(finished_run, tmp_path):
    sweep = tmp_path / "sweep"
    shutil.copytree(finished_run, sweep / "mha", symlinks=True)
    text = write_report(sweep, sweep, prompt="First (Citizen)_", decode_steps=1).read_text()
    assert "The char tokenizer lacks '(' ')' '_', so the prompt shown is 'First Citizen'." in text


FULL_DISK_WHILE_LOGGING = """
import errno, runpy, sys
from training import logger

def log(self, record):
    raise OSError(errno.ENOSPC, "No space left on device", str(self.path))

logger.RunLogger.log = log
sys.argv[0] = {train_py!r}
runpy.run_path({train_py!r}, run_name="__main__")
"""


def test_a_full_disk_while_logging_is_one_message_naming_the_file(train_overrides, tmp_path):
    script = tmp_path / "full_disk.py"
    script.write_text(FULL_DISK_WHILE_LOGGING.format(train_py=str(REPO / "train.py")))
    result = subprocess.run([sys.executable, str(script), *train_overrides, f"out_dir={tmp_path / 'run'}"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 1
    assert result.stderr.strip().endswith(f"error: No space left on device ({tmp_path / 'run' / 'metrics.jsonl'})")
    assert "Traceback" not in result.stderr


def test_a_run_whose_checkpoints_were_all_deleted_is_neither_restarted_nor_taken_over(finished_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir, symlinks=True)
    for checkpoint in (run_dir / "checkpoints").glob("step_*"):
        shutil.rmtree(checkpoint)
    log = (run_dir / "metrics.jsonl").read_text()
    with pytest.raises(CheckpointError, match="which is gone, and no other checkpoint is left"):
        resolve_resume(composed(f"resume={run_dir}"))
    with pytest.raises(ValueError, match="already holds a run"):
        train.train(composed(f"out_dir={run_dir}"))
    shutil.rmtree(run_dir / "checkpoints")  # the folder too: only the log tells that it saved any
    refusal = f"{run_dir} held a run that saved checkpoints .* and they are gone: its log is kept"
    for setting in (f"resume={run_dir}", f"out_dir={run_dir}"):
        with pytest.raises(ValueError, match=refusal):
            train.train(composed(setting))
    assert (run_dir / "metrics.jsonl").read_text() == log


def test_a_config_yaml_that_no_run_wrote_is_not_taken_over(train_overrides, tmp_path):
    own = tmp_path / "mine"
    own.mkdir()
    (own / "config.yaml").write_text("my: own settings\n")
    with pytest.raises(ValueError, match=f"^{own} holds a config.yaml that no gptlab run wrote \\(it has no groups.yaml\\)"):
        train.train(composed(*train_overrides, f"out_dir={own}"))
    assert (own / "config.yaml").read_text() == "my: own settings\n"


def test_non_finite_weights_from_elsewhere_are_refused_by_resume_and_export(finished_run, tmp_path):
    import export
    from safetensors.torch import load_file, save_file

    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir, symlinks=True)
    checkpoint = run_dir / "checkpoints" / "latest"
    weights = load_file(checkpoint / "model.safetensors")
    weights["transformer.h.0.attn.c_attn.bias"][0] = float("inf")
    save_file(weights, checkpoint / "model.safetensors")
    ckpt.write_digests(checkpoint)
    message = "holds non-finite weights \\(inf or NaN\\) in transformer.h.0.attn.c_attn.bias"
    with pytest.raises(CheckpointError, match=message):
        train.train(composed(f"resume={run_dir}", "max_iters=4"))
    with pytest.raises(SystemExit, match=message):
        export.main([str(run_dir), str(tmp_path / "hf")])


def test_a_latest_link_that_points_at_itself_falls_back_to_the_newest_complete_checkpoint(finished_run, tmp_path,
                                                                                         capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir, symlinks=True)
    latest = run_dir / "checkpoints" / "latest"
    latest.unlink()
    latest.symlink_to("latest")
    train.train(composed(f"resume={run_dir}"))  # was: RuntimeError: Symlink loop
    out, err = capsys.readouterr()
    assert f"warning: {latest} leads to latest, which is gone or incomplete; using the newest complete checkpoint " \
           f"left, {run_dir / 'checkpoints' / 'step_000002'}" in err
    assert f"resumed from {run_dir.resolve()}/checkpoints/step_000002 at step 2; 0 steps to go\n" in out


def test_resume_of_a_run_killed_before_its_config_says_so_and_a_new_run_takes_it_over(train_overrides, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / ".lock").touch()  # what a kill -9 between the lock and config.yaml leaves (a long prepare)
    (run_dir / ".lock.pid").write_text("4242\n")
    with pytest.raises(CheckpointError) as refused:
        resolve_resume(composed(f"resume={run_dir}"))
    assert str(refused.value) == (f"{run_dir} holds a run that stopped before it wrote its config.yaml (only its .lock "
                                  f"is there): nothing was saved to resume; run the original command with "
                                  f"out_dir={run_dir} to start it there afresh, or delete the directory")
    train.train(composed(*train_overrides, "max_iters=1", f"out_dir={run_dir}"))  # the way on it names
    assert steps_logged(run_dir) == [("eval", 0), ("train", 1), ("eval", 1)]


def test_a_signal_after_the_runs_last_line_prints_nothing_and_changes_nothing(train_overrides, monkeypatch, capsys):
    """The run is complete once it has said where its checkpoint is: a late SIGINT (in
    the cleanup after it, where tqdm's finalizer once printed `Exception ignored ...
    Interrupted`) must neither print nor turn into an interrupted run."""
    real_shutdown = train.shutdown

    def signalled_during_cleanup(ranks):
        os.kill(os.getpid(), signal.SIGINT)
        real_shutdown(ranks)

    monkeypatch.setattr(train, "shutdown", signalled_during_cleanup)
    with interrupts_raise():  # the handlers of a command (train.py's main)
        run_dir = train.train(composed(*train_overrides, "max_iters=2", "eval_interval=2"))
    out, err = capsys.readouterr()
    assert out.endswith(f"sample from it: python sample.py checkpoint={run_dir}\n")
    assert "Interrupted" not in err and "Exception ignored" not in err


def test_the_launchers_end_asks_the_loop_to_stop_and_a_live_launcher_does_not():
    with GracefulStop(launcher=os.getppid()) as alive:
        assert alive.requested is None
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    with GracefulStop(launcher=int(gone.stdout)) as orphaned:  # not our parent: as if it had died
        assert orphaned.requested == f"the launcher (process {gone.stdout.strip()}) ended"
