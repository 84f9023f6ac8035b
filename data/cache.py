"""What a data directory holds, and whether a run may use it: prepared data is never silently rebuilt.

A data directory (data_cache/<data.name>, or data.data_dir) holds the tokens of one set of
*token settings*: every DataConfig field except those that only say where, how fast or how
carefully (RUN_ONLY_FIELDS). meta.json records them (and progress.json, while preparing).
A run whose token settings differ from the recorded ones is refused, naming each setting
that differs with both values, and both ways out: a directory of its own, or deleting the
old one. Only what no setting says may still rebuild the shards, each time with a warning:
the source's files changed (their sizes or modification times), the shard format or the
bpe training sample changed with gptlab, or the shards are damaged.

The fingerprint (sha256 in meta.json) covers the token settings, the source's file stats,
the shard format and the bpe sample size: equal fingerprints, and intact shards, are reused.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict
from pathlib import Path

from data.bpe import TRAINING_SAMPLE_BYTES
from data.config import DataConfig
from data.errors import DataError
from data.meta import FORMAT_VERSION, META_FILE
from data.shards import PROGRESS_FILE
from data.sources import source_signature

# Where, how fast and how carefully; never which tokens.
RUN_ONLY_FIELDS = ("name", "num_proc", "batch_mb", "data_dir", "hf_cache_dir", "keep_hf_cache", "verify")
SUFFIX_WORD = re.compile(r"[A-Za-z0-9_.-]{1,24}")  # a value short and plain enough to read in a directory name


def token_settings(cfg: DataConfig) -> dict:
    """The settings that decide the tokens, as JSON would hold them (what meta.json records)."""
    settings = {key: value for key, value in asdict(cfg).items() if key not in RUN_ONLY_FIELDS}
    return json.loads(json.dumps(settings))


def fingerprint_of(cfg: DataConfig) -> str:
    """sha256 of everything that decides the tokens: the token settings and the source's file stats."""
    payload = {"format": FORMAT_VERSION, "settings": token_settings(cfg), "source": source_signature(cfg)}
    if cfg.tokenizer == "bpe":  # how much of the corpus the tokenizer learns from decides its merges
        payload["bpe_sample_bytes"] = TRAINING_SAMPLE_BYTES
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def refuse_other_settings(cfg: DataConfig, data_dir: Path) -> None:
    """DataError when data_dir's meta.json, or the progress.json of an unfinished prepare, records
    token settings other than cfg's. Read as plain JSON: a meta.json that fails its own digest
    still tells whose data it is (prepare rebuilds it only when that is this run's)."""
    for file, what in ((META_FILE, "holds data prepared"), (PROGRESS_FILE, "holds an unfinished prepare")):
        _refuse_if_other(cfg, data_dir, _recorded_settings(data_dir / file), what)


def _recorded_settings(path: Path) -> dict | None:
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # missing or unreadable: nothing recorded, nothing to protect
        return None
    settings = recorded.get("settings") if isinstance(recorded, dict) else None
    return settings if isinstance(settings, dict) else None


def _refuse_if_other(cfg: DataConfig, data_dir: Path, recorded: dict | None, what: str) -> None:
    if recorded is None:
        return
    wanted = token_settings(cfg)
    differing = sorted(key for key in wanted.keys() | recorded.keys() if wanted.get(key) != recorded.get(key))
    if not differing:
        return
    changes = ", ".join(
        f"data.{key}={_shown(wanted.get(key))} (it holds {_shown(recorded.get(key))})" for key in differing
    )
    if cfg.data_dir is None:
        own = f"data.name={cfg.name}_{_suffix({key: wanted.get(key) for key in differing})}"
    else:
        own = "another data.data_dir"
    raise DataError(
        f"{data_dir} {what} with other settings than this run's {changes}: give this data a "
        f"directory of its own ({own}), or delete {data_dir} to prepare it again with these settings"
    )


def _shown(value: object) -> str:
    return json.dumps(value)


def _plain(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _suffix(settings: dict) -> str:
    """A readable name part for the settings that differ (max_documents2), or, when a value is
    long or not plain (a path), 8 hex digits of their sha256."""
    words = [f"{key}{_plain(value)}" for key, value in settings.items()]
    if all(SUFFIX_WORD.fullmatch(_plain(value)) for value in settings.values()) and len("_".join(words)) <= 48:
        return "_".join(words)
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:8]
