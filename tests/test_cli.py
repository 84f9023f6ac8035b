"""The command-line check that runs before Hydra: one `error:` line for every override
Hydra would refuse, and none for an override it takes."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from conf import CONF_DIR, Config
from conf.cli import (
    HYDRA_OPTIONS,
    argument_problem,
    check_overrides,
    config_groups,
    options_first,
    prompt_from_words,
)
from conf.sample_config import SampleConfig

REPO = Path(__file__).resolve().parents[1]
SCHEMAS = {"train": Config, "sample": SampleConfig}


def problem(config_name: str, arg: str, multirun: bool = False) -> str | None:
    return argument_problem(arg, SCHEMAS[config_name], config_groups(config_name), multirun)


def hydra_refuses(config_name: str, arg: str) -> bool:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        try:
            compose(config_name=config_name, overrides=[arg])
        except Exception:  # Hydra's own errors are of several kinds
            return True
    return False


@pytest.mark.parametrize(
    "config_name, arg",
    [
        ("train", arg)
        for arg in [
            "max_iters=5",
            "max_iters=abc",
            "max_iters='7'",
            "max_iters=2.5",
            "model.dropout=0",
            "model.dropout=high",
            "compile=true",
            "compile=maybe",
            "resume=true",
            "out_dir=null",
            "tokens_per_param=20",
            "tokens_per_param=many",
            "seed=${max_iters}",
            "model=gpt2",
            "model=foo",
            "model=null",
            "model/attention=mqa",
            "model/attention=foo",
            "data=shakespeare_char",
            "data=bar",
            "experiment=attention_base",
            "experiment=nope",
            "+uptraining=mqa",
            "+uptraining=nope",
            "optim.learning_rate=1e-3",
            "optim.learning_rate=fast",
            "optim=3",
            "logging.wandb.mode=offline",
            "data.val_fraction=half",
            "data.path=/some/where",
            "seed=x=1",
            "hydra.run.dir=/tmp/x",
        ]
    ]
    + [
        ("sample", arg)
        for arg in [
            "seed=abc",
            "seed=null",
            "num_samples=1.5",
            "num_samples=4",
            "stop=[a,b]",
            "stop=abc",
            "top_k=null",
            "top_k=1.5",
            "temperature=1",
            "json=true",
            "json=sometimes",
            "prompt='a, b'",
            "prompt=x=1",
            "model=gpt2",
            "precision=bf16",
            "dtype=bf16",
        ]
    ],
)
def test_an_override_is_refused_exactly_when_hydra_refuses_it(config_name, arg):
    assert (problem(config_name, arg) is not None) == hydra_refuses(config_name, arg), problem(config_name, arg)


@pytest.mark.parametrize(
    "config_name, arg, message",
    [
        ("train", "max_iters=abc", "max_iters must be an integer, got 'abc'"),
        ("train", "model.dropout=high", "model.dropout must be a number, got 'high'"),
        ("train", "compile=maybe", "compile must be true or false, got 'maybe'"),
        ("train", "optim=3", "optim must be a section of settings (OptimConfig), got 3"),
        ("sample", "seed=abc", "seed must be an integer or null, got 'abc'"),
        ("sample", "stop=abc", "stop must be a list of texts, e.g. [a,b], got 'abc'"),
        (
            "train",
            "model=foo",
            "model=foo: there is no preset conf/model/foo.yaml; presets: gpt2, micro, mini, nano, small",
        ),
        (
            "train",
            "model/attention=foo",
            "model/attention=foo: there is no preset conf/model/attention/foo.yaml; presets: gqa, mha, mqa",
        ),
        ("train", "+uptraining=nope", "uptraining=nope: there is no preset conf/uptraining/nope.yaml"),
        ("train", "model=null", "model=null: model takes one of its presets: gpt2, micro, mini, nano, small"),
        (
            "sample",
            "model=gpt2",
            "model is not a setting of SampleConfig (did you mean model_path?); known: checkpoint, runs_root",
        ),
        ("sample", "dtype=bf16", "dtype is not a setting of SampleConfig (did you mean precision?)"),  # torch's word
        (
            "train",
            "torch_dtype=bf16",
            "torch_dtype is not a setting of Config (did you mean precision?)",
        ),  # transformers'
        (
            "train",
            "seed=x=1",
            "seed=x=1: Hydra cannot read this value (mismatched input '=' expecting <EOF>); "
            "quote it, e.g. \"seed='...'\"",
        ),
    ],
)
def test_a_refusal_names_the_setting_and_the_rule(config_name, arg, message):
    assert problem(config_name, arg).startswith(message)


@pytest.mark.parametrize(
    "arg, message",
    [
        ("seed=1,2,x", "seed must be an integer, got 'x'"),
        ("seed=range(1,4)", None),
        ("optim.learning_rate=interval(1e-4,1e-3)", "optim.learning_rate=interval(1e-4,1e-3): the sweeper runs lists"),
        ("model=nano,foo", "model=foo: there is no preset"),
        ("model=nano,mini", None),
    ],
)
def test_each_value_of_a_sweep_is_checked(arg, message):
    found = problem("train", arg, multirun=True)
    assert found == message if message is None else found.startswith(message)


@pytest.mark.parametrize(
    "config_name, arg, message",
    [
        ("train", "seed=1,2", "seed=1,2 is a sweep: add -m (--multirun) to run one job per value"),
        ("train", "~seed", "~seed: a setting cannot be deleted; set it instead (to null where null is allowed)"),
        ("train", "~model", "~model: a setting cannot be deleted"),  # GPTConfig's defaults would apply, not the preset
        ("train", "+seed=5", "+seed=5: seed already has a value: drop the + (seed=5)"),
        ("train", "+model=nano", "+model=nano: model already has a value: drop the + (model=nano)"),
        ("train", "foo", "foo is not a setting: give key=value overrides (max_iters=100) or Hydra's options (--help)"),
        ("sample", "stop=[a(b]", "stop=[a(b]: Hydra cannot read this value"),
    ],
)
def test_what_hydra_would_take_but_no_one_means_is_refused_too(config_name, arg, message):
    assert problem(config_name, arg).startswith(message)


def test_the_quoting_hint_fits_the_setting():
    assert problem("sample", "stop=[a(b]").endswith("quote it, e.g. \"stop=['...']\"")
    assert problem("train", "data.path=a(b").endswith("quote it, e.g. \"data.path='...'\"")


@pytest.mark.parametrize(
    "arg",
    ["++seed=5", "+uptraining=mqa", "hydra/job_logging=disabled", "hydra.run.dir=/tmp/x", "hydra.job.env_set.X=1"],
)
def test_forced_additions_optional_groups_and_hydras_own_settings_pass(arg):
    assert problem("train", arg) is None


def test_options_go_first_wherever_they_were_typed():
    assert options_first(["model=nano", "-m", "seed=1,2", "--cfg", "job"]) == [
        "-m",
        "--cfg",
        "job",
        "model=nano",
        "seed=1,2",
    ]
    assert options_first(["--", "prompt='-x'"]) == ["prompt='-x'"]


@pytest.mark.parametrize(
    "command, message",
    [
        (
            ["sample.py", "max_new_token=5"],
            "error: max_new_token is not a setting of SampleConfig (did you mean max_new_tokens?)",
        ),
        (["train.py", "max_iter=5"], "error: max_iter is not a setting of Config (did you mean max_iters?)"),
        (["sample.py", "seed=abc"], "error: seed must be an integer or null, got 'abc'"),
        (["train.py", "model.n_head=2.5"], "error: model.n_head must be an integer, got 2.5"),
        (["train.py", "-m", "model=nano,foo"], "error: model=foo: there is no preset conf/model/foo.yaml"),
        (
            ["train.py", "model=nano", "-m", "model=nano,foo"],
            "error: model=foo: there is no preset conf/model/foo.yaml",
        ),
        (["train.py", "seed=1,2"], "error: seed=1,2 is a sweep: add -m"),
        (["prepare.py", "data=bar"], "error: data=bar: there is no preset conf/data/bar.yaml"),
        # Past Hydra: an interpolation resolves only when the config is built.
        (["train.py", "seed=${nope}"], "error: Interpolation key 'nope' not found (at seed)"),
        (["sample.py", "seed=${nope}"], "error: Interpolation key 'nope' not found (at seed)"),
    ],
)
def test_a_bad_override_gets_one_line_of_ours_not_hydras(tmp_path, command, message):
    launch = [sys.executable, str(REPO / command[0])] if command[0].endswith(".py") else [sys.executable]
    result = subprocess.run(
        [*launch, *command[command[0].endswith(".py") :]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1, result.stderr
    assert not any(tmp_path.iterdir())  # refused before any run directory or data


@pytest.mark.parametrize(
    "args",
    [
        ["max_iters=abc", "model.n_layr=3", "optim.learning_rate=-1", "model.n_layer=0"],
        ["-m", "seed=1,2", "model.n_layer=0,2", "max_iters=abc", "model.n_layr=3", "optim.learning_rate=-1"],
    ],
)
def test_every_problem_of_a_command_line_is_one_error(args):
    """Types and names (which Hydra would refuse) and the rules of what it could read, all at once."""
    with pytest.raises(SystemExit) as refused:
        check_overrides(args, Config, "train")
    lines = str(refused.value.code).splitlines()
    assert lines[0] == "error: 4 settings are wrong:"
    assert [line.strip().split(" ")[0] for line in lines[1:]] == [
        "max_iters",
        "model.n_layr",
        "model.n_layer",
        "optim.learning_rate",
    ]  # the readable ones' rules after


@pytest.mark.parametrize(
    "arg, prompt",
    [
        ("prompt=x=1", "x=1"),
        ("prompt=a(b", "a(b"),
        ("prompt=日本", "日本"),
        ("prompt='a, b'", "a, b"),
        ("prompt=plain", "plain"),  # readable: Hydra's reading stands
    ],
)
def test_a_prompt_hydra_cannot_read_is_taken_as_typed(arg, prompt):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        composed = compose(config_name="sample", overrides=prompt_from_words([arg, "max_new_tokens=3"]))
    assert composed.prompt == prompt and composed.max_new_tokens == 3


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--cfg", "job", "hello"], ["--cfg", "job", "prompt='hello'"]),
        (["- a list item", "max_new_tokens=3"], ["max_new_tokens=3", "prompt='- a list item'"]),
        (["--info", "plugins"], ["--info", "plugins"]),
        (["--info", "word"], ["--info", "prompt='word'"]),  # --info's value is one of its choices
        (["--cfg=job", "-x"], ["--cfg=job", "prompt='-x'"]),
        (["--", "-h", "y"], ["--", "prompt='-h y'"]),  # after `--`, even an option's name is text
        (["-m", "seed=1,2"], ["-m", "seed=1,2"]),
    ],
)
def test_hydras_options_stay_options_and_other_dashed_words_are_text(args, expected):
    assert prompt_from_words(args) == expected


def test_a_dashed_prompt_reaches_the_composed_config(tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "sample.py"), "seed=3", "--cfg", "job", "- a list item"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "prompt: '- a list item'" in result.stdout and "seed: 3" in result.stdout


def test_hydras_options_are_the_ones_its_parser_defines():
    from hydra._internal.utils import get_args_parser  # private, so read here only: conf/cli.py keeps a table

    takes = {None: True, 0: False, "?": "choices"}  # argparse's nargs: a value, none, an optional one of choices
    found = {
        option: tuple(action.choices) if takes[action.nargs] == "choices" else takes[action.nargs]
        for action in get_args_parser()._actions
        for option in action.option_strings
    }
    assert found == HYDRA_OPTIONS, "Hydra's command-line options changed: update conf/cli.py's HYDRA_OPTIONS"
