"""meta.json and the shards it describes: reading, checking, writing atomically.

A data directory holds train.bin and val.bin (flat token ids, dtype from meta.json)
and meta.json, which is written last: shards without a matching meta.json are never
taken as complete.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from data.errors import DataError

META_FILE = "meta.json"
SPLITS = ("train", "val")
SHARD_DTYPES = ("uint16", "uint32")
TEMP_MARK = ".tmp-"  # written files are <name>.tmp-<pid> until renamed into place
_PREPARE_HINT = "run the prepare step again (python -m data, or train.py does it)"


def shard_path(data_dir: Path, split: str) -> Path:
    return Path(data_dir) / f"{split}.bin"


def temp_path(final: Path) -> Path:
    return final.with_name(f"{final.name}{TEMP_MARK}{os.getpid()}")


def read_meta(data_dir: Path) -> dict:
    """The parsed meta.json of a data directory; DataError when missing or malformed."""
    path = Path(data_dir) / META_FILE
    if not path.exists():
        raise DataError(f"{path} does not exist: {_PREPARE_HINT}")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise DataError(f"cannot read {path}: {err.strerror}") from err
    except ValueError as err:
        raise DataError(f"{path} is not valid JSON ({err}): {_PREPARE_HINT}") from err
    _check_meta_fields(meta, path)
    return meta


def _check_meta_fields(meta: object, path: Path) -> None:
    tokens = meta.get("tokens") if isinstance(meta, dict) else None
    well_formed = (
        isinstance(tokens, dict)
        and all(isinstance(tokens.get(split), int) and tokens[split] >= 0 for split in SPLITS)
        and meta.get("dtype") in SHARD_DTYPES
        and isinstance(meta.get("tokenizer"), dict)
    )
    if not well_formed:
        raise DataError(f"{path} lacks valid 'tokens', 'dtype' or 'tokenizer' entries: {_PREPARE_HINT}")


def check_shard(data_dir: Path, meta: dict, split: str) -> Path:
    """The path of a split's shard after checking it exists with the size meta.json promises."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    path = shard_path(data_dir, split)
    if not path.is_file():
        raise DataError(f"{path} is missing although meta.json describes it: {_PREPARE_HINT}")
    expected = meta["tokens"][split] * np.dtype(meta["dtype"]).itemsize
    actual = path.stat().st_size
    if actual != expected:
        raise DataError(
            f"{path} is {actual} bytes but meta.json promises {meta['tokens'][split]} "
            f"{meta['dtype']} tokens ({expected} bytes): the shard is corrupt or from another "
            f"prepare run; {_PREPARE_HINT}"
        )
    return path


def write_json_atomic(path: Path, obj: dict) -> None:
    temp = temp_path(path)
    temp.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(temp, path)


def remove_temp_files(data_dir: Path) -> None:
    """Delete what an interrupted prepare left behind (never a complete-looking file)."""
    for leftover in Path(data_dir).glob(f"*{TEMP_MARK}*"):
        if leftover.is_dir():
            shutil.rmtree(leftover)
        else:
            leftover.unlink()
