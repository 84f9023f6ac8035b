"""meta.json and the shards it describes: reading, checking, writing atomically.

A data directory holds train.bin and val.bin (flat token ids, dtype from meta.json)
and meta.json, which is written last: shards without a matching meta.json are never
taken as complete.

Since format 2, meta.json records the sha256 of each shard ("sha256") and of its own
other entries ("meta_sha256", checked by every read), so a damaged or hand-edited
meta.json is refused instead of describing the wrong tokenizer. A format-1 data
directory (from before the digests) still reads, with size checks only; prepare
rebuilds it, since the format is part of its fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np

from data.errors import DataError
from system import TEMP_MARK, write_atomic

FORMAT_VERSION = 3  # bump when the shard layout or meta.json changes: prepare then rebuilds old data
DIGESTS_SINCE = 2  # the first format whose meta.json records sha256 digests
META_FILE = "meta.json"
META_DIGEST = "meta_sha256"  # meta.json's entry holding the digest of its other entries
SPLITS = ("train", "val")
SHARD_DTYPES = ("uint16", "uint32")
PREPARE_HINT = "run the prepare step again (python prepare.py, or train.py does it)"
IO_CHUNK = 1 << 20  # bytes per read when hashing a shard


def shard_path(data_dir: Path, split: str) -> Path:
    return Path(data_dir) / f"{split}.bin"


def read_meta(data_dir: Path) -> dict:
    """The parsed meta.json of a data directory; DataError when missing or malformed."""
    path = Path(data_dir) / META_FILE
    if not path.exists():
        raise DataError(f"{path} does not exist: {PREPARE_HINT}")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise DataError(f"cannot read {path}: {err.strerror}") from err
    except ValueError as err:
        raise DataError(f"{path} is not valid JSON ({err}): {PREPARE_HINT}") from err
    _check_meta_fields(meta, path)
    _check_meta_digest(meta, path)
    return meta


def _check_meta_fields(meta: object, path: Path) -> None:
    tokens = meta.get("tokens") if isinstance(meta, dict) else None
    well_formed = (
        isinstance(tokens, dict)
        and all(_is_count(tokens.get(split)) for split in SPLITS)
        and _is_count(meta.get("format"))
        and _is_count(meta.get("vocab_size"))
        and meta.get("dtype") in SHARD_DTYPES
        and isinstance(meta.get("tokenizer"), dict)
    )
    if not well_formed:
        raise DataError(
            f"{path} lacks valid 'format', 'tokens', 'dtype', 'tokenizer' or 'vocab_size' entries: {PREPARE_HINT}"
        )


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_meta_digest(meta: dict, path: Path) -> None:
    if meta["format"] < DIGESTS_SINCE:
        return  # written before digests existed: the shards' sizes are all there is to check
    if META_DIGEST not in meta:
        raise DataError(f"{path} has no {META_DIGEST}, which its format ({meta['format']}) records: {PREPARE_HINT}")
    if meta[META_DIGEST] != meta_digest(meta):
        raise DataError(
            f"{path} does not match the {META_DIGEST} it records (it was edited or damaged): {PREPARE_HINT}"
        )


def meta_digest(meta: dict) -> str:
    """sha256 of meta.json's entries other than the digest itself, as canonical JSON (sorted keys)."""
    entries = {key: value for key, value in meta.items() if key != META_DIGEST}
    return hashlib.sha256(json.dumps(entries, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def file_sha256(path: Path) -> str:
    """sha256 of a file's content, read in chunks (any size); DataError when it cannot be read."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(IO_CHUNK):
                digest.update(chunk)
    except OSError as err:
        raise DataError(f"cannot read {path}: {err.strerror}") from err
    return digest.hexdigest()


def check_shard(data_dir: Path, meta: dict, split: str) -> Path:
    """The path of a split's shard after checking it exists with the size meta.json promises."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    path = shard_path(data_dir, split)
    if not path.is_file():
        raise DataError(f"{path} is missing although meta.json describes it: {PREPARE_HINT}")
    expected = meta["tokens"][split] * np.dtype(meta["dtype"]).itemsize
    actual = path.stat().st_size
    if actual != expected:
        raise DataError(
            f"{path} is {actual} bytes but meta.json promises {meta['tokens'][split]} "
            f"{meta['dtype']} tokens ({expected} bytes): the shard is corrupt or from another "
            f"prepare run; {PREPARE_HINT}"
        )
    return path


def write_json_atomic(path: Path, obj: dict) -> None:
    write_atomic(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def remove_temp_files(data_dir: Path) -> None:
    """Delete what an interrupted prepare left behind (never a complete-looking file)."""
    for leftover in Path(data_dir).glob(f"*{TEMP_MARK}*"):
        if leftover.is_dir():
            shutil.rmtree(leftover)
        else:
            leftover.unlink()
