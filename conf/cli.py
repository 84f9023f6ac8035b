"""The command line before Hydra reads it: gptlab's own message for a setting that does
not exist (Hydra's would suggest appending it with `+`, which then fails), and a plain
prompt argument for sample.py that needs no Hydra quoting."""

from __future__ import annotations

import difflib
import re
import sys
from dataclasses import fields, is_dataclass

from conf import CONF_DIR

# key=value, +key=value or key@package=value: Hydra's overrides; anything else is text.
OVERRIDE = re.compile(r"^[+~]{0,2}[\w./@-]+=")


def check_setting_names(args: list[str], schema: type) -> None:
    """Exit with one clear line when an override names no setting of `schema`."""
    groups = {p.relative_to(CONF_DIR).as_posix() for p in CONF_DIR.rglob("*") if p.is_dir() and p.name != "__pycache__"}
    for arg in args:
        if not OVERRIDE.match(arg):
            continue
        key = arg.split("=", 1)[0].lstrip("+~").split("@", 1)[0]
        if key.split(".", 1)[0] == "hydra" or key in groups:
            continue
        problem = unknown_setting(key, schema)
        if problem:
            sys.exit(f"error: {problem}")


def unknown_setting(key: str, schema: type) -> str | None:
    """Why `key` (dotted) is not a setting of the dataclass `schema`, or None if it is."""
    node, path = schema, []
    for part in key.split("."):
        if node is None:
            return f"{'.'.join(path)} is a value, not a section: it has no {part}"
        known = {f.name: f for f in fields(node)}
        if part not in known:
            close = difflib.get_close_matches(part, known, n=1)
            hint = f" (did you mean {'.'.join([*path, close[0]])}?)" if close else ""
            return (f"{'.'.join([*path, part])} is not a setting of {node.__name__}{hint}; "
                    f"known: {', '.join(known)}")
        path.append(part)
        default = known[part].default_factory() if callable(known[part].default_factory) else None
        node = type(default) if is_dataclass(default) else None
    return None


def prompt_from_words(args: list[str]) -> list[str]:
    """sample.py's arguments with its plain words (`python sample.py "it's, here"`) turned
    into one prompt override, quoted for Hydra so that commas, quotes, parentheses and
    `${` reach the prompt as typed."""
    words = [arg for arg in args if not OVERRIDE.match(arg) and not arg.startswith("-")]
    if not words:
        return args
    text = " ".join(words)
    text = re.sub(r"(\\+)(?='|$)", lambda match: match.group(1) * 2, text)  # Hydra reads \\ as \ only there
    quoted = text.replace("'", "\\'").replace("${", "\\${")
    return [arg for arg in args if arg not in words] + [f"prompt='{quoted}'"]
