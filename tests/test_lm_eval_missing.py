"""downstream.py without the `eval` extra: one line that says how to install it."""

import sys

import pytest

import downstream
from conf.downstream_config import DownstreamConfig


def test_without_the_harness_downstream_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # what `import lm_eval` meets when it is not installed
    with pytest.raises(downstream.UserError, match=r'pip install -e "\.\[eval\]"'):
        downstream.evaluate(DownstreamConfig(checkpoint="runs/none", tasks=["hellaswag"]))


def test_an_empty_task_list_is_refused_by_name():
    with pytest.raises(ValueError, match="tasks"):
        DownstreamConfig(tasks=[])
