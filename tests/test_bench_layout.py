"""bench/layout.py's counting, on a small repository made here and on made-up calls: the
import arrows, cycles and upward imports it reports, and the stops and returns of a path."""

import subprocess
from pathlib import Path
from types import SimpleNamespace

from bench.layout import PathCounter, file_namer, import_figures, line_figures, nearest_repo_file

FILES = {
    "app/__init__.py": "",
    "app/core.py": "import os\nfrom lib import helper\n\ndef later():\n    import train\n",
    "lib/__init__.py": "from app.core import later\n",  # app <-> lib
    "lib/helper.py": "from . import other\n",  # a relative import inside lib: no arrow
    "lib/other.py": "\n\nx = 1\n\n",
    "model/__init__.py": "from .a import A\n",
    "model/a.py": "from .b import B\n",
    "model/b.py": "def f():\n    from model.a import A\n",  # a <-> b, inside a function
    "model/c.py": "from model import a\n",
    "tool.py": "import lib.helper\n",  # a top-level module, not a script
    "train.py": "import app.core\n\nif __name__ == '__main__':\n    app.core.later()\n",
    "tests/test_app.py": "import train\n",  # tests/ import, uncounted
}


def make_repo(root: Path) -> Path:
    for path, text in FILES.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    (root / "model/long.py").write_text("x = 1\n" * 401)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "."], check=True)
    return root


def test_import_arrows_cycles_and_upward_imports(tmp_path):
    figures = import_figures(make_repo(tmp_path))
    assert figures["packages"] == ["app", "lib", "model"] and figures["scripts"] == ["train"]
    assert list(figures["arrow_list"]) == ["app -> lib", "app -> train", "lib -> app", "tool -> lib", "train -> app"]
    assert figures["arrows"] == 5 and figures["package_arrows"] == 2
    assert figures["arrow_list"]["app -> train"] == ["app/core.py:5 (fn)"]
    (cycle,) = figures["cycles"]  # app <-> lib and app <-> train: one tangle of three
    assert cycle["members"] == ["app", "lib", "train"]
    assert list(cycle["arrows"]) == ["app -> lib", "app -> train", "lib -> app", "train -> app"]
    assert figures["model_cycles"] == [
        {
            "members": ["model.a", "model.b"],
            "arrows": {"model.a -> model.b": ["model/a.py:1"], "model.b -> model.a": ["model/b.py:2 (fn)"]},
        }
    ]
    assert figures["upward"] == ["app/core.py:5 (fn) imports train.py"]


def test_lines_per_package_and_long_files(tmp_path):
    lines = line_figures(make_repo(tmp_path))
    assert lines["non_blank"]["lib/"] == 3 and lines["non_blank"]["model/"] == 5 + 401
    assert lines["non_blank"]["tests/"] == 1 and lines["non_blank"]["train.py"] == 3
    assert lines["long_files"] == {"model/long.py": 401}


def test_stops_returns_and_calls_of_a_path():
    path = PathCounter("train.py")
    for caller, function in [
        ("train.py", "run.py:1 start"),
        ("run.py", "run.py:9 helper"),  # same file: no stop
        ("run.py", "conf.py:3 load"),
        ("conf.py", "run.py:9 helper"),  # helper already read
        ("conf.py", "run.py:20 check"),
        ("run.py", "train.py:5 <lambda>"),
        ("train.py", "conf.py:3 load"),
        (None, "data.py:1 prepare"),
    ]:
        path.enter(caller, function.split(":")[0], function)
    figures = path.summary()
    assert (figures["stops"], figures["files"], figures["returns"], figures["calls"]) == (4, 3, 2, 6)
    assert figures["files_in_order"] == ["train.py", "run.py", "conf.py"]
    assert figures["top_returns"] == [("run.py", 1), ("train.py", 1)]


def test_the_caller_is_the_innermost_frame_in_the_repo(tmp_path):
    (tmp_path / "tests").mkdir()
    name = file_namer(tmp_path)

    def frame(filename, back=None):
        return SimpleNamespace(f_code=SimpleNamespace(co_filename=str(filename)), f_back=back)

    outer = frame(tmp_path / "train.py")
    library = frame("/usr/lib/python3/site-packages/torch/nn/module.py", frame("<string>", outer))
    assert nearest_repo_file(library, name) == "train.py"
    assert nearest_repo_file(frame(tmp_path / "tests" / "test_x.py"), name) is None
    assert name("<frozen abc>") is None and name(str(tmp_path / "run" / "start.py")) == "run/start.py"
