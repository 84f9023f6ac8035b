"""The command line before Hydra reads it. An override Hydra would refuse gets one `error:` line here instead of
Hydra's several: a setting that does not exist (Hydra would suggest appending it with `+`, which then fails), a preset
that does not exist, a value of the wrong type, or text its grammar cannot read. sample.py's prompt needs no quoting."""

from __future__ import annotations

import difflib
import re
import sys
import typing
from dataclasses import fields, is_dataclass
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, Override, RangeSweep
from hydra.errors import OverrideParseException
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from conf import CONF_DIR, load_config
from rules import SettingsError

# key=value, +key=value or key@package=value: Hydra's overrides; anything else is text.
OVERRIDE = re.compile(r"^[+~]{0,2}[\w./@-]+=")
PARSER = OverridesParser.create()
# Hydra's own command-line options (hydra.cc/docs/advanced/hydra-command-line-flags) and what each takes: nothing, the
# next word, or optionally one of some words. No public API of Hydra lists them (hydra.main builds its argparse parser
# in hydra._internal); tests/test_cli.py checks this table against that parser.
INFO_TOPICS = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")
HYDRA_OPTIONS: dict[str, bool | tuple[str, ...]] = {
    **dict.fromkeys(("--help", "-h", "--hydra-help", "--version", "--resolve", "--run", "-r"), False),
    **dict.fromkeys(("--multirun", "-m", "--shell-completion", "-sc"), False),
    **dict.fromkeys(("--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn"), True),
    **dict.fromkeys(("--config-dir", "-cd", "--experimental-rerun"), True),
    **dict.fromkeys(("--info", "-i"), INFO_TOPICS),
}
# Settings' names in other tools, suggested as a near spelling is: torch and transformers say dtype.
OTHER_NAMES = {"dtype": "precision", "torch_dtype": "precision"}


def check_overrides(args: list[str], schema: type, config_name: str) -> None:
    """Exit with one error, a line per problem, when an argument of a command line of conf/<config_name>.yaml (typed
    by `schema`) is one Hydra would refuse or one that would quietly do what no one means, listing with them the rules
    the other arguments break, so that one error says all there is to fix."""
    options = hydra_option_positions(args)
    multirun = any(args[i] in ("-m", "--multirun") for i in options)
    groups = config_groups(config_name)
    checked = [(arg, argument_problem(arg, schema, groups, multirun)) for i, arg in enumerate(args) if i not in options]
    if problems := [problem for _, problem in checked if problem]:
        readable = [arg for arg, problem in checked if problem is None]
        sys.exit(f"error: {SettingsError(problems + broken_rules_of(readable, schema, config_name))}")


def broken_rules_of(overrides: list[str], schema: type, config_name: str) -> list[str]:
    """The rule violations of conf/<config_name>.yaml under these (readable) overrides, as load_config would report
    them; a sweep is checked at its first value of each list."""
    first_values = [_first_of_sweep(override) for override in overrides]
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            load_config(compose(config_name=config_name, overrides=first_values), schema)
    except SettingsError as err:
        return err.problems
    except Exception:  # noqa: BLE001  # what composing finds on its own is reported when the command runs
        return []
    return []


def _first_of_sweep(override: str) -> str:
    parsed = PARSER.parse_overrides([override])[0]
    if not parsed.is_sweep_override():
        return override
    return f"{parsed.get_key_element()}={next(iter(parsed.sweep_iterator()))}"


def argument_problem(arg: str, schema: type, groups: set[str], multirun: bool = False) -> str | None:
    """Why the argument `arg` (not one of Hydra's options) should be refused, or None."""
    if arg.startswith("~"):  # the dataclass's default would apply, not the YAML's: never what is meant
        return f"{arg}: a setting cannot be deleted; set it instead (to null where null is allowed)"
    if not OVERRIDE.match(arg):
        return f"{arg} is not a setting: give key=value overrides (max_iters=100) or Hydra's options (--help)"
    try:
        override = PARSER.parse_overrides([arg])[0]
    except OverrideParseException as err:
        key = arg.split("=", 1)[0].lstrip("+")
        quoted = "['...']" if typing.get_origin(setting_type(key, schema)[0]) is list else "'...'"
        return f'{arg}: Hydra cannot read this value ({str(err).splitlines()[0]}); quote it, e.g. "{key}={quoted}"'
    key = override.key_or_group
    if re.split(r"[./]", key, maxsplit=1)[0] == "hydra":
        return None  # Hydra's own settings and groups: Hydra checks them
    if override.is_sweep_override():
        if not multirun:
            return f"{arg} is a sweep: add -m (--multirun) to run one job per value"
        if not isinstance(override.value(), (ChoiceSweep, RangeSweep)):
            return f"{arg}: the sweeper runs lists (1,2,3) and ranges (range(1,4)), not intervals"
    group = key in groups or (override.is_add() and (CONF_DIR / key).is_dir())
    if override.is_add() and (key in groups or (not group and unknown_setting(key, schema) is None)):
        return f"{arg}: {key} already has a value: drop the + ({arg[1:]})"
    if group:
        return unknown_preset(key, override_values(override))
    return unknown_setting(key, schema) or wrong_type(key, override_values(override), schema)


def config_groups(config_name: str) -> set[str]:
    """The config groups that conf/<config_name>.yaml's defaults list chooses from."""
    defaults = OmegaConf.to_container(OmegaConf.load(CONF_DIR / f"{config_name}.yaml")).get("defaults", [])
    entries = [entry for entry in defaults if isinstance(entry, dict)]
    return {group for entry in entries for group in entry if not group.startswith("override ")}


def named_settings(overrides: list[str], section: str) -> dict[str, str]:
    """The settings of `section` (e.g. model) that the command-line `overrides` name, each with the override that
    names it: `model.qk_norm=true` names qk_norm, and a preset of a group under the section (`model/block=llama`)
    every setting its file sets. A setting named both ways is the setting's override's, which wins in Hydra too."""
    presets, values = {}, {}
    for override in PARSER.parse_overrides(overrides):
        key, value = override.key_or_group, override.value()
        if key.startswith(f"{section}/") and isinstance(value, str):
            chosen = OmegaConf.to_container(OmegaConf.load(CONF_DIR / key / f"{value}.yaml")) or {}
            presets |= dict.fromkeys(chosen, override.input_line)
        elif key.startswith(f"{section}."):
            values[key.split(".")[1]] = override.input_line
    return presets | values


def override_values(override: Override) -> list[Any]:
    """The value an override sets, or each value of a sweep (`-m seed=1,2,3`)."""
    return list(override.sweep_iterator()) if override.is_sweep_override() else [override.value()]


def unknown_preset(group: str, values: list[Any]) -> str | None:
    """Why some value is not a preset (a YAML file) of the config group `group`, or None."""
    presets = sorted(path.stem for path in (CONF_DIR / group).glob("*.yaml"))
    chosen = [preset for value in values for preset in (value if isinstance(value, list) else [value])]
    for preset in chosen:  # `model=[a,b]` chooses several
        if preset is None:  # Hydra cannot take a group away from the command line
            return f"{group}=null: {group} takes one of its presets: {', '.join(presets)}"
        if preset not in presets:
            return f"{group}={preset}: there is no preset conf/{group}/{preset}.yaml; presets: {', '.join(presets)}"
    return None


def unknown_setting(key: str, schema: type) -> str | None:
    """Why `key` (dotted) is not a setting of the dataclass `schema`, or None if it is."""
    return setting_type(key, schema)[1]


def wrong_type(key: str, values: list[Any], schema: type) -> str | None:
    """Why some value cannot be given to the setting `key` of `schema`, or None: OmegaConf, which Hydra merges
    with, is the judge, and the field's annotation the rule named."""
    config = OmegaConf.structured(schema)
    for value in values:
        try:
            OmegaConf.update(config, key, value, merge=True)
        except ValidationError:
            return f"{key} must be {describe(setting_type(key, schema)[0])}, got {value!r}"
    return None


def setting_type(key: str, schema: type) -> tuple[Any, str | None]:
    """The annotation of the setting `key` (dotted) of the dataclass `schema`, or why there is no such setting."""
    hint, path = schema, []
    for part in key.split("."):
        if not is_dataclass(hint):
            return None, f"{'.'.join(path)} is a value, not a section: it has no {part}"
        known = [f.name for f in fields(hint)]
        if part not in known:
            near = [OTHER_NAMES[part]] if OTHER_NAMES.get(part) in known else difflib.get_close_matches(part, known, 1)
            suggestion = f" (did you mean {'.'.join([*path, near[0]])}?)" if near else ""
            where = ".".join([*path, part])
            return None, f"{where} is not a setting of {hint.__name__}{suggestion}; known: {', '.join(known)}"
        path.append(part)
        hint = typing.get_type_hints(hint)[part]
    return hint, None


def describe(hint: Any) -> str:
    """A type annotation in words: `Optional[int]` is "an integer or null"."""
    arguments = [a for a in typing.get_args(hint) if a is not type(None)]
    if type(None) in typing.get_args(hint):
        return f"{describe(arguments[0])} or null"
    if typing.get_origin(hint) is list:
        return f"a list of {describe(arguments[0]).split(' ', 1)[1]}s, e.g. [a,b]"
    if is_dataclass(hint):
        return f"a section of settings ({hint.__name__})"
    if hint is Any:  # a number or a word (batch_size=auto): its rule says which
        return "an integer or a word"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a text"}.get(hint, str(hint))


def prompt_from_words(args: list[str]) -> list[str]:
    """sample.py's arguments with its plain words (`python sample.py "it's, here"`) or a `prompt=` Hydra cannot read
    (`prompt=x=1`) turned into one prompt override, quoted for Hydra so that commas, quotes, parentheses and `${`
    reach the prompt as typed. Hydra's options (`--cfg job`, `--help`) stay options; other words with `-` are text."""
    options = hydra_option_positions(args)
    is_word = [i not in options and not OVERRIDE.match(arg) for i, arg in enumerate(args)]
    is_unreadable = [arg.startswith("prompt=") and not readable(arg) for arg in args]
    texts = [arg for arg, word in zip(args, is_word) if word]
    texts += [arg.split("=", 1)[1] for arg, unreadable in zip(args, is_unreadable) if unreadable]
    if not texts:
        return args
    text = re.sub(r"(\\+)(?='|$)", lambda match: match.group(1) * 2, " ".join(texts))  # Hydra reads \\ as \ only there
    quoted = text.replace("'", "\\'").replace("${", "\\${")
    kept = [arg for arg, word, unreadable in zip(args, is_word, is_unreadable) if not (word or unreadable)]
    return kept + [f"prompt='{quoted}'"]


def hydra_option_positions(args: list[str]) -> set[int]:
    """Where Hydra's options (`--help`, `-m`, `--cfg job`, `--info=plugins`) and their values are in `args`;
    `--` ends them."""
    positions: set[int] = set()
    for i, arg in enumerate(args):
        if arg == "--":
            return positions | {i}
        takes = HYDRA_OPTIONS.get(arg.split("=", 1)[0]) if arg.startswith("-") else None
        if takes is None:
            continue
        positions.add(i)
        takes_value = takes is True or (isinstance(takes, tuple) and i + 1 < len(args) and args[i + 1] in takes)
        if takes_value and "=" not in arg:
            positions.add(i + 1)
    return positions


def options_first(args: list[str]) -> list[str]:
    """`args` with Hydra's options (and their values) ahead of the overrides, where Hydra's parser needs them
    (`train.py model=nano -m seed=1,2` works too); `--`, which only separated them, is dropped."""
    options = hydra_option_positions(args)
    first = [arg for i, arg in enumerate(args) if i in options and arg != "--"]
    return first + [arg for i, arg in enumerate(args) if i not in options]


def readable(arg: str) -> bool:
    """Whether Hydra's override grammar can read `arg`."""
    try:
        PARSER.parse_overrides([arg])
    except OverrideParseException:
        return False
    return True
