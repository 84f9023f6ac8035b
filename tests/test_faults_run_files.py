"""Faults in a run's files and directories: a damaged or unfitting config.yaml, a resume
that would change what the seeds meant, checkpoints deleted or holding non-finite weights,
a `latest` link that leads to itself, what killed saves left behind, a directory that
cannot be made or that no run wrote, and the report of a damaged run. Each ends in one
message that says what is intact and what to do, and loses nothing."""

import re
import shutil

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig

import train
from conf import CONF_DIR
from report import write_report
from run import checkpoints as ckpt
from run.checkpoints import CheckpointError
from run.run_dir import resolve_resume
from test_faults import composed, restore_signal_handlers  # noqa: F401 (an autouse fixture)


def as_command(*overrides):
    """The config of `train.py *overrides`, with Hydra's record of the command line that resume reads."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="train", overrides=list(overrides), return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    return cfg


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    from conftest import training_overrides

    directory = tmp_path_factory.mktemp("finished")
    return train.train(composed(*training_overrides(directory), "max_iters=2", "eval_interval=2"))


@pytest.mark.parametrize("override", ["seed_scope=weights", "seed=7"])
def test_a_resume_that_changes_what_the_seeds_meant_is_refused(finished_run, override):
    key, value = override.split("=")
    saved = yaml.safe_load((finished_run / "config.yaml").read_text())
    with pytest.raises(ValueError) as refused:
        resolve_resume(as_command(f"resume={finished_run}", override, "max_iters=4"))
    assert str(refused.value) == (
        f"cannot apply {override} when resuming {finished_run}: it was started with "
        f"{key}={saved[key]}, which seeded its steps so far (start a new run instead)"
    )
    same = as_command(
        f"resume={finished_run}", f"seed={saved['seed']}", f"seed_scope={saved['seed_scope']}", "max_iters=4"
    )  # the original command again, with a new end
    assert resolve_resume(same)[0].max_iters == 4


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda text: "max_iters: [unclosed\n" + text, "ParserError|ScannerError"),
        (lambda text: "!!python/object/apply:os.system [echo owned]\n", "ConstructorError|UnsupportedValueType"),
        (lambda text: b"max_iters: \xff\xfe\n", "UnicodeDecodeError"),
        (lambda text: "- just\n- a list\n", "it holds a list"),
        (lambda text: "", "it is empty"),
    ],
)
def test_a_damaged_run_config_is_named_when_resuming(finished_run, tmp_path, damage, reason):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir, symlinks=True)
    damaged = damage((run_dir / "config.yaml").read_text())
    (run_dir / "config.yaml").write_bytes(damaged if isinstance(damaged, bytes) else damaged.encode())
    with pytest.raises(CheckpointError, match=f"{run_dir / 'config.yaml'} is damaged \\(({reason})"):
        resolve_resume(composed(f"resume={run_dir}"))


@pytest.mark.parametrize(
    "edit, why",
    [
        (
            lambda text: re.sub(r"(?m)^seed: .*$", "seed: abc", text),
            "Value 'abc' of type 'str' could not be converted to Integer (at seed)",
        ),
        (lambda text: text + "colour: blue\n", "Key 'colour' not in 'Config' (at colour)"),
    ],
)
def test_a_run_config_that_does_not_fit_the_settings_is_one_line(finished_run, tmp_path, edit, why):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir, symlinks=True)
    (run_dir / "config.yaml").write_text(edit((run_dir / "config.yaml").read_text()))
    with pytest.raises(ValueError) as error:
        resolve_resume(composed(f"resume={run_dir}"))
    assert str(error.value) == (
        f"{run_dir / 'config.yaml'} does not fit train.py's settings: {why}; mend that value in it, or start a new run"
    )


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


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda run: (run / "metrics.jsonl").unlink(), "has no metrics.jsonl: it is needed to compare the run"),
        (lambda run: (run / "metrics.jsonl").write_text(""), "metrics.jsonl has no evaluation records"),
        (lambda run: edit_checkpoint_config(run, lambda c: c.pop("tokenizer")), "does not describe a tokenizer"),
        (lambda run: edit_checkpoint_config(run, lambda c: c["model"].update(n_head="four")), "invalid model section"),
    ],
)
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
    with pytest.raises(
        ValueError, match=f"^{own} holds a config.yaml that no gptlab run wrote \\(it has no groups.yaml\\)"
    ):
        train.train(composed(*train_overrides, f"out_dir={own}"))
    assert (own / "config.yaml").read_text() == "my: own settings\n"


def test_non_finite_weights_from_elsewhere_are_refused_by_resume_and_export(finished_run, tmp_path):
    from safetensors.torch import load_file, save_file

    import export

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


def test_a_latest_link_that_points_at_itself_falls_back_to_the_newest_complete_checkpoint(
    finished_run, tmp_path, capsys
):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir, symlinks=True)
    latest = run_dir / "checkpoints" / "latest"
    latest.unlink()
    latest.symlink_to("latest")
    train.train(composed(f"resume={run_dir}"))  # was: RuntimeError: Symlink loop
    out, err = capsys.readouterr()
    assert (
        f"warning: {latest} leads to latest, which is gone or incomplete; using the newest complete checkpoint "
        f"left, {run_dir / 'checkpoints' / 'step_000002'}" in err
    )
    assert f"resumed from {run_dir.resolve()}/checkpoints/step_000002 at step 2; 0 steps to go\n" in out
