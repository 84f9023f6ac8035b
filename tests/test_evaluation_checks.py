"""downstream.py and `python -m evaluation` name what is wrong with their task settings
before the harness runs (it would pass over a missing include_path or a task file that does
not load without a word, then call the task "not found"; and a limit of 0 "finds no docs")."""

import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")  # the `eval` extra
from conf.downstream_config import DownstreamConfig  # noqa: E402
from evaluation import __main__ as evaluation_cli  # noqa: E402
from evaluation.downstream import evaluate  # noqa: E402
from system import UserError  # noqa: E402

TASKS, CHOICE = Path(__file__).parent / "lm_eval_tasks", "gptlab_tiny_choice"
TYPO = "task: gptlab_typo\ndataset_path: json\n  test_split: [test\n"  # an indented key: not YAML


@pytest.fixture
def places(tmp_path):
    """(a directory that does not exist, a copy of our tasks with one file that does not parse)."""
    broken = tmp_path / "tasks"
    shutil.copytree(TASKS, broken)
    (broken / "typo.yaml").write_text(TYPO)
    return tmp_path / "absent", broken


def causes(absent, broken, setting):
    return [
        (absent, f"^{setting}{absent} does not exist: it names a directory of lm-eval task YAML files$"),
        (
            broken,
            f"^{broken / 'typo.yaml'} in {setting}{broken} is not a task file the harness can read "
            r"\(ScannerError: mapping values are not allowed .* line 3, column 13\); mend it, or move it "
            "out of that directory$",
        ),
    ]


def test_downstream_names_a_missing_include_path_and_a_task_file_that_does_not_load(places, tmp_path):
    for include_path, message in causes(*places, "include_path="):
        with pytest.raises(UserError, match=message):  # before the checkpoint, which does not exist, is read
            evaluate(
                DownstreamConfig(
                    checkpoint=str(tmp_path / "no_run"), tasks=[CHOICE], include_path=str(include_path), device="cpu"
                )
            )
    with pytest.raises(ValueError, match="^limit must be >= 1, got 0$"):
        DownstreamConfig(tasks=[CHOICE], limit=0)


def test_python_m_evaluation_names_them_and_a_limit_of_no_items(places, tmp_path, monkeypatch):
    command = [
        "evaluation",
        "--model",
        "gptlab",
        "--model_args",
        f"checkpoint={tmp_path / 'no_run'}",
        "--tasks",
        CHOICE,
    ]
    for include_path, message in causes(*places, "--include_path "):
        monkeypatch.setattr(sys, "argv", [*command, "--include_path", str(include_path)])
        with pytest.raises(SystemExit, match=message.replace("^", "^error: ", 1)):
            evaluation_cli.main()
    for limit in (["--limit", "0"], ["-L", "-5"], ["--limit=0.0"]):
        monkeypatch.setattr(sys, "argv", [*command, "--include_path", str(TASKS), *limit])
        with pytest.raises(SystemExit, match=r"^error: --limit (0|-5|0\.0) evaluates no item of a task: give a count"):
            evaluation_cli.main()
