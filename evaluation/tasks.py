"""The user's own task directory (include_path), checked before the harness reads it: the harness passes
over a path that is not a directory, or a YAML file that does not load, and only says "not found"."""

from __future__ import annotations

from pathlib import Path

from lm_eval.tasks._yaml_loader import load_yaml  # what the harness's task index reads each file with

from system import UserError


def check_include_path(path: str, setting: str) -> None:
    """UserError naming `setting` ("include_path=" or "--include_path ") when `path` is not a
    directory, or holds a task file that the harness cannot read."""
    directory = Path(path).expanduser()
    if not directory.is_dir():
        what = "does not exist" if not directory.exists() else "is not a directory"
        raise UserError(f"{setting}{path} {what}: it names a directory of lm-eval task YAML files")
    for file in sorted(directory.glob("**/*.yaml")):
        try:
            load_yaml(file, resolve_func=False)  # as the index does: !function tags are not imported here
        except Exception as err:  # yaml's errors and the harness's own are of many types; each means unreadable
            reason = " ".join(f"{type(err).__name__}: {err}".split())
            raise UserError(
                f"{file} in {setting}{path} is not a task file the harness can read ({reason}); "
                "mend it, or move it out of that directory"
            ) from err
