"""downstream.py without the `eval` extra (one line that says how to install it), its
settings, and its commands in the guide."""

import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import RunMode
from omegaconf import OmegaConf

from conf import CONF_DIR
from conf.cli import check_overrides, options_first
from conf.downstream_config import DownstreamConfig, load_downstream_config
from evaluation import NO_HARNESS, downstream
from evaluation.after_training import DownstreamAfterTraining
from test_docs import COMMANDS

REPO = Path(__file__).resolve().parent.parent


def test_without_the_harness_downstream_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # what `import lm_eval` meets when it is not installed
    with pytest.raises(downstream.UserError, match=r'pip install -e "\.\[eval\]"'):
        downstream.evaluate(DownstreamConfig(checkpoint="runs/none", tasks=["hellaswag"]))


@pytest.mark.parametrize(
    "command",
    [
        "runpy.run_module('evaluation', run_name='__main__')",  # python -m evaluation --tasks hellaswag
        "runpy.run_path('downstream.py', run_name='__main__')",  # python downstream.py checkpoint=runs/none tasks=[...]
    ],
)
def test_without_the_harness_each_command_ends_in_one_line(command, tmp_path):
    args = (
        ["--tasks", "hellaswag"]
        if "evaluation" in command
        else ["checkpoint=runs/none", "tasks=[hellaswag]", f"hydra.run.dir={tmp_path}"]
    )
    code = f"import runpy, sys; sys.modules['lm_eval'] = None; sys.argv[1:] = {args!r}; {command}"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stderr) == (1, f"error: {NO_HARNESS}\n")


def test_an_empty_task_list_is_refused_by_name():
    with pytest.raises(ValueError, match="tasks"):
        DownstreamConfig(tasks=[])


def test_a_run_whose_tasks_cannot_be_evaluated_ends_with_a_warning_and_the_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "lm_eval", None)
    config = OmegaConf.create(
        {
            "out_dir": None,
            "runs_root": str(tmp_path),
            "device": "cpu",
            "hydra": {"mode": RunMode.MULTIRUN, "runtime": {"output_dir": str(tmp_path / "kv1")}},
        }
    )
    DownstreamAfterTraining(tasks=["hellaswag", "arc_easy"]).on_job_end(
        config=config, job_return=JobReturn(status=JobStatus.COMPLETED, _return_value=tmp_path / "kv1")
    )
    err = capsys.readouterr().err
    assert 'pip install -e ".[eval]"' in err
    assert f"python downstream.py checkpoint={tmp_path / 'kv1'} 'tasks=[hellaswag,arc_easy]'" in err


def test_the_guides_downstream_commands_compose():
    commands = [command[1:] for _, command in COMMANDS if command[0] == "downstream.py"]
    assert len(commands) >= 5
    for args in commands:
        args = options_first(args)
        check_overrides(args, DownstreamConfig, "downstream")
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            config = load_downstream_config(compose("downstream", args))
        assert config.tasks and all(name and "[" not in name for name in config.tasks)
