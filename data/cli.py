"""`python -m data`: run the prepare step on its own, with train.py's override syntax.

    python -m data                                       # the default corpus: stdlib, gpt2
    python -m data data=shakespeare_char data.path=input.txt

The presets are the YAML files of conf/data/, read as plain YAML so that data/
stays free of Hydra.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import fields
from pathlib import Path
from typing import Optional, get_type_hints

import yaml

from data.config import DataConfig
from data.errors import DataError
from data.preparation import prepare

PRESETS_DIR = Path(__file__).resolve().parents[1] / "conf" / "data"


def config_from_overrides(overrides: list[str]) -> DataConfig:
    """A DataConfig from train.py-style arguments: `data=<preset>` and `data.<field>=<value>`."""
    preset: dict = {}
    values: dict = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ValueError(f"expected KEY=VALUE, got {item!r}")
        if key == "data":
            preset = _read_preset(raw)
        else:
            field = key.removeprefix("data.")
            values[field] = _parse_value(field, raw)
    return DataConfig(**{**preset, **values})


def _read_preset(name: str) -> dict:
    path = PRESETS_DIR / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))
        raise ValueError(f"no data preset {name!r} in {PRESETS_DIR}; known: {known}")
    preset = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    for field in preset:
        _check_field(field)
    return preset


def _parse_value(field: str, raw: str) -> object:
    """YAML scalars as Hydra reads them, except that text fields keep text ("2024" stays a string)."""
    _check_field(field)
    if get_type_hints(DataConfig)[field] in (str, Optional[str]):
        return None if raw in ("null", "~") else raw
    return yaml.safe_load(raw)


def _check_field(field: str) -> None:
    names = [f.name for f in fields(DataConfig)]
    if field not in names:
        raise ValueError(f"unknown data field {field!r}; fields: {', '.join(names)}")


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m data",
        description="Tokenise a corpus into train.bin / val.bin / meta.json (skipped when already done).",
    )
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="data=<preset> and data.<field>=<value>")
    args = parser.parse_args(argv)
    try:
        cfg = config_from_overrides(args.overrides)
    except ValueError as err:
        parser.error(str(err))
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        prepared = prepare(cfg)
    except DataError as err:
        sys.exit(f"error: {err}")
    meta = prepared.meta
    print(
        f"{'reused' if prepared.reused else 'wrote'} {prepared.data_dir}: train {meta['tokens']['train']:,} "
        f"and val {meta['tokens']['val']:,} {meta['dtype']} tokens, tokenizer {meta['tokenizer']['name']} "
        f"(vocab {meta['vocab_size']}), from {meta['source']}"
    )
