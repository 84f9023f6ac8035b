"""sample.py as a command: JSON output, a prompt as plain words or from stdin, a reader
that leaves early, Ctrl-C while sampling, the message when no checkpoint is found, and
setting names checked on the command line."""

import json
import signal
import subprocess
import sys

import pytest

from test_sample import REPO, runs_root, settings  # noqa: F401 (a fixture)


def test_json_output_from_the_command_line(runs_root, tmp_path):
    process = subprocess.run(
        [
            sys.executable,
            str(REPO / "sample.py"),
            f"runs_root={runs_root}",
            "num_samples=2",
            "max_new_tokens=12",
            "json=true",
            "prompt=All",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert process.returncode == 0, process.stderr
    result = json.loads(process.stdout)
    assert result["prompt"] == "All" and result["settings"]["seed"] == 1337
    assert [s["new_tokens"] for s in result["samples"]] == [12, 12]


def test_missing_checkpoint_says_where_it_looked_and_how_to_train(tmp_path):
    process = subprocess.run(
        [sys.executable, str(REPO / "sample.py"), f"runs_root={tmp_path / 'runs'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert process.returncode == 1
    assert f"error: no checkpoint found under {tmp_path / 'runs'}" in process.stderr
    assert "python train.py" in process.stderr and "checkpoint=PATH" in process.stderr


@pytest.mark.parametrize(
    "text",
    [
        "it's, a (test) [with] {brackets}",
        "def main(",
        'He said "hi", then left',
        "back\\slash and \\n escapes",
        "cost ${x} = 3",
        "ends in a backslash\\",
        "quote after a backslash \\'",
        "x = 1, with spaces",
    ],
)
def test_plain_words_reach_the_prompt_as_typed(text):
    from conf.cli import prompt_from_words

    args = prompt_from_words([text, "max_new_tokens=3"])
    assert args[0] == "max_new_tokens=3"
    assert settings(*args).prompt == text


def sample_cli(*args, cwd, **kwargs):
    return subprocess.run(
        [sys.executable, str(REPO / "sample.py"), *args], cwd=cwd, capture_output=True, text=True, timeout=120, **kwargs
    )


def test_a_prompt_as_plain_words_or_from_stdin(runs_root, tmp_path):
    words = sample_cli("All: Speak, speak", f"runs_root={runs_root}", "max_new_tokens=3", "json=true", cwd=tmp_path)
    assert words.returncode == 0, words.stderr
    assert json.loads(words.stdout)["prompt"] == "All: Speak, speak"
    assert "sampling from " in words.stderr  # which run was picked
    piped = sample_cli(
        "prompt=-",
        f"runs_root={runs_root}",
        "max_new_tokens=3",
        "json=true",
        cwd=tmp_path,
        input="First Citizen, hear me",
    )
    assert piped.returncode == 0, piped.stderr
    assert json.loads(piped.stdout)["prompt"] == "First Citizen, hear me"


def test_a_reader_that_leaves_early_is_not_an_error(runs_root, tmp_path):
    process = subprocess.Popen(
        [sys.executable, str(REPO / "sample.py"), f"runs_root={runs_root}", "max_new_tokens=400"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    process.stdout.read(1)  # `| head -c 1`: the reader leaves while the text still streams
    process.stdout.close()
    stderr = process.communicate(timeout=120)[1].decode()
    assert process.returncode == 0 and "Traceback" not in stderr, stderr


def test_nested_and_section_names_are_checked_too():
    from conf import Config
    from conf.cli import unknown_setting

    assert unknown_setting("optim.lr", Config).startswith(
        "optim.lr is not a setting of OptimConfig; known: name, learning_rate"
    )
    assert unknown_setting("seed.x", Config) == "seed is a value, not a section: it has no x"
    assert unknown_setting("logging.wandb.mode", Config) is None and unknown_setting("model.n_kv_head", Config) is None


def test_ctrl_c_while_sampling_keeps_what_was_printed_and_exits_quietly(runs_root):
    process = subprocess.Popen(
        [sys.executable, str(REPO / "sample.py"), f"runs_root={runs_root}", "prompt=First", "max_new_tokens=100000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout.read(len("First") + 20).startswith("First")  # generating by now
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGINT
    assert stderr.strip().endswith("interrupted") and "Traceback" not in stderr


@pytest.mark.parametrize("script, own", [("sample.py", "temperature: 0.8"), ("downstream.py", "tasks:")])
def test_help_lists_the_commands_own_settings_and_none_of_train_pys_groups(tmp_path, script, own):
    process = subprocess.run(
        [sys.executable, str(REPO / script), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert process.returncode == 0 and own in process.stdout
    assert not any(group in process.stdout for group in ("model/block", "experiment:", "recipe:", "data:"))
