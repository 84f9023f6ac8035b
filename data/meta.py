"""meta.json and the shards it describes (train.bin, val.bin: flat token ids): reading, checking, writing.

meta.json is written last: shards without a matching meta.json are never taken as complete. Since format 2 it records
the sha256 of each shard and of its own other entries (checked by every read): a damaged or edited meta.json is
refused; a format-1 directory reads with size checks only (prepare rebuilds it: the format is in its fingerprint).
"""

import hashlib
import json
from pathlib import Path

import numpy as np

from data.errors import DataError, reading
from system import write_atomic

FORMAT_VERSION = 3  # bump when the shard layout or meta.json changes: prepare then rebuilds old data
DIGESTS_SINCE = 2  # the first format whose meta.json records sha256 digests
META_FILE = "meta.json"
META_DIGEST = "meta_sha256"  # meta.json's entry holding the digest of its other entries
SPLITS = ("train", "val")
PREPARE_HINT = "run the prepare step again (python prepare.py, or train.py does it)"


def shard_path(data_dir: Path, split: str) -> Path:
    return Path(data_dir) / f"{split}.bin"


def read_meta(data_dir: Path) -> dict:
    """The parsed meta.json of a data directory; DataError when missing or malformed."""
    path = Path(data_dir) / META_FILE
    if not path.exists():
        raise DataError(f"{path} does not exist: {PREPARE_HINT}")
    try:
        with reading(path):
            meta = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:  # not UTF-8, or not JSON
        raise DataError(f"{path} is not valid JSON ({err}): {PREPARE_HINT}") from err
    tokens = meta.get("tokens") if isinstance(meta, dict) else None
    counts = (meta.get("format"), meta.get("vocab_size"), *map(tokens.get, SPLITS)) if isinstance(tokens, dict) else ()
    if not (
        counts
        and all(type(count) is int and count >= 0 for count in counts)  # JSON's ints, not its booleans
        and meta.get("dtype") in ("uint16", "uint32")
        and isinstance(meta.get("tokenizer"), dict)
    ):
        raise DataError(
            f"{path} lacks valid 'format', 'tokens', 'dtype', 'tokenizer' or 'vocab_size' entries: {PREPARE_HINT}"
        )
    if meta["format"] < DIGESTS_SINCE:
        return meta  # written before digests existed: the shards' sizes are all there is to check
    if META_DIGEST not in meta:
        raise DataError(f"{path} has no {META_DIGEST}, which its format ({meta['format']}) records: {PREPARE_HINT}")
    if meta[META_DIGEST] != with_digest(meta)[META_DIGEST]:
        raise DataError(
            f"{path} does not match the {META_DIGEST} it records (it was edited or damaged): {PREPARE_HINT}"
        )
    return meta


def with_digest(meta: dict) -> dict:
    """meta.json's entries, then META_DIGEST: the sha256 of the others as canonical JSON (sorted keys)."""
    entries = {key: value for key, value in meta.items() if key != META_DIGEST}
    digest = hashlib.sha256(json.dumps(entries, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()
    return {**entries, META_DIGEST: digest}


def file_sha256(path: Path) -> str:
    """sha256 of a file's content, read in chunks (any size); DataError when it cannot be read."""
    digest = hashlib.sha256()
    with reading(path), open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def check_shard(data_dir: Path, meta: dict, split: str) -> Path:
    """The path of a split's shard after checking it exists with the size meta.json promises."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    path = shard_path(data_dir, split)
    if not path.is_file():
        raise DataError(f"{path} is missing although meta.json describes it: {PREPARE_HINT}")
    expected, actual = meta["tokens"][split] * np.dtype(meta["dtype"]).itemsize, path.stat().st_size
    if actual != expected:
        raise DataError(
            f"{path} is {actual} bytes but meta.json promises {meta['tokens'][split]} {meta['dtype']} tokens "
            f"({expected} bytes): the shard is corrupt or from another prepare run; {PREPARE_HINT}"
        )
    return path


def write_json_atomic(path: Path, obj: dict) -> None:
    write_atomic(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")
