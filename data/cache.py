"""What a data directory holds, and whether a run may use it: prepared data is never silently rebuilt.

A data directory holds the tokens of one set of *token settings* (every DataConfig field but RUN_ONLY_FIELDS), recorded
in meta.json and progress.json. Other token settings are refused, naming each with both values and both ways out. Only
what no setting says rebuilds the shards, with a warning: changed source files, a new shard format or bpe sample,
damaged shards; equal fingerprints (settings, source file stats, format, bpe sample size) and intact shards are reused.
"""

import hashlib
import json
import logging
import re
from dataclasses import asdict
from pathlib import Path

from data.bpe import TRAINING_SAMPLE_BYTES, load_tokenizer
from data.config import DataConfig
from data.errors import DataError
from data.meta import FORMAT_VERSION, META_FILE, SPLITS, check_shard, file_sha256, read_meta
from data.shards import PROGRESS_FILE
from data.sources import source_digests, source_signature

log = logging.getLogger(__name__)

# Where, how fast and how carefully; never which tokens.
RUN_ONLY_FIELDS = ("name", "num_proc", "batch_mb", "data_dir", "hf_cache_dir", "keep_hf_cache", "verify")
SUFFIX_WORD = re.compile(r"[A-Za-z0-9_.-]{1,24}")  # a value short and plain enough to read in a directory name


def token_settings(cfg: DataConfig) -> dict:
    """The settings that decide the tokens, as JSON would hold them (what meta.json records)."""
    return json.loads(json.dumps({key: value for key, value in asdict(cfg).items() if key not in RUN_ONLY_FIELDS}))


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
    wanted = token_settings(cfg)
    for file, what in ((META_FILE, "holds data prepared"), (PROGRESS_FILE, "holds an unfinished prepare")):
        try:
            recorded = json.loads((data_dir / file).read_text(encoding="utf-8"))
        except (OSError, ValueError):  # missing or unreadable: nothing recorded, nothing to protect
            continue
        recorded = recorded.get("settings") if isinstance(recorded, dict) else None
        if not isinstance(recorded, dict):
            continue
        differing = sorted(key for key in wanted.keys() | recorded.keys() if wanted.get(key) != recorded.get(key))
        if not differing:
            continue
        changes = ", ".join(
            f"data.{key}={json.dumps(wanted.get(key))} (it holds {json.dumps(recorded.get(key))})" for key in differing
        )
        suffix = _suffix({key: wanted.get(key) for key in differing})
        own = f"data.name={cfg.name}_{suffix}" if cfg.data_dir is None else "another data.data_dir"
        raise DataError(
            f"{data_dir} {what} with other settings than this run's {changes}: give this data a "
            f"directory of its own ({own}), or delete {data_dir} to prepare it again with these settings"
        )


def _suffix(settings: dict) -> str:
    """A name part for the differing settings (max_documents2); 8 hex digits of their sha256 if a value is not plain."""
    plain = {key: value if isinstance(value, str) else json.dumps(value) for key, value in settings.items()}
    words = "_".join(f"{key}{value}" for key, value in plain.items())
    if all(SUFFIX_WORD.fullmatch(value) for value in plain.values()) and len(words) <= 48:
        return words
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:8]


def reusable_meta(cfg: DataConfig, data_dir: Path, fingerprint: str) -> dict | None:
    """meta.json of shards that this run may use as they are; None (with a warning why) when they must be rebuilt."""
    try:
        meta = read_meta(data_dir)  # a damaged or edited meta.json fails its own digest here
        if meta.get("fingerprint") != fingerprint:  # its settings are this run's (refuse_other_settings)
            log.warning(
                f"{data_dir} holds data of the same settings, but its source's files changed since, or another "
                f"version of gptlab prepared it (shard format {meta['format']}, now {FORMAT_VERSION}): rebuilding"
            )
            return None
        load_tokenizer(meta, data_dir)  # a trained tokenizer's file must be there, intact
        for split in SPLITS:
            path = check_shard(data_dir, meta, split)
            if cfg.verify == "sha256" and file_sha256(path) != meta["sha256"][split]:
                log.warning("%s does not match the sha256 meta.json recorded: rebuilding", path)
                return None
        recorded = meta.get("source_sha256")  # absent from data prepared before it was recorded
        if cfg.verify == "sha256" and recorded and recorded != source_digests(cfg):
            log.warning(
                f"{data_dir} was prepared from source files whose content changed since, their sizes and "
                "modification times kept (a copy with cp -p, rsync -t): rebuilding"
            )
            return None
    except DataError as err:  # nothing usable there: build afresh
        if (data_dir / META_FILE).exists():
            log.warning("%s; rebuilding", err)
        return None
    return meta
