"""The prepare step: a corpus tokenised once into train.bin / val.bin + meta.json.

    python -m data                                       # the default: stdlib, gpt2
    python -m data data=shakespeare_char data.path=input.txt

Re-running with the same source and tokenizer reuses the shards (their fingerprint is
in meta.json); anything else rebuilds them. Before reuse, each shard's size is checked
against meta.json and, unless data.verify=size, its content against the sha256 that
meta.json recorded; a shard that fails is rebuilt. (verify=size is for corpora too large
to hash at every start: a shard damaged in place, at the same size, then goes unnoticed.)
Every file is written under a temporary name and renamed into place, and meta.json
last, so an interrupted run never leaves shards that look complete.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import datasets
import numpy as np
import pyarrow.compute as pc
from tqdm import tqdm

from data.config import DataConfig
from data.errors import DataError
from data.meta import (
    FORMAT_VERSION, IO_CHUNK, META_DIGEST, META_FILE, SPLITS, check_shard, file_sha256, meta_digest, read_meta,
    remove_temp_files, shard_path, temp_path, write_json_atomic,
)
from data.sources import Documents, load_corpus, source_signature
from data.tokenizer import Tokenizer, build_tokenizer, load_tokenizer

log = logging.getLogger(__name__)

# Where, how fast and how carefully; never which tokens.
RUN_ONLY_FIELDS = ("name", "num_proc", "data_dir", "hf_cache_dir", "verify")
BATCH_DOCUMENTS = 1000  # documents per tokenising batch


@dataclass(frozen=True)
class PreparedData:
    data_dir: Path
    meta: dict  # the parsed meta.json
    reused: bool  # True when shards with the same fingerprint were already there

    def shard(self, split: str) -> Path:
        return shard_path(self.data_dir, split)

    def tokenizer(self) -> Tokenizer:
        return load_tokenizer(self.meta)


def prepare(cfg: DataConfig) -> PreparedData:
    """Tokenise cfg's corpus into its data directory, unless that already holds exactly this data."""
    data_dir = cfg.resolved_data_dir()
    fingerprint = fingerprint_of(cfg)
    meta = _reusable_meta(data_dir, fingerprint, cfg.verify)
    if meta is not None:
        log.info("reusing the shards in %s (same source and tokenizer)", data_dir)
        return PreparedData(data_dir, meta, reused=True)
    with _forks_die_with_this_process(), _signals_stop_at_once(data_dir):  # datasets' workers
        return PreparedData(data_dir, _build(cfg, data_dir, fingerprint), reused=False)


def fingerprint_of(cfg: DataConfig) -> str:
    """sha256 of everything that decides the tokens: the content settings and the source's file stats."""
    payload = {"format": FORMAT_VERSION, "settings": _settings(cfg), "source": source_signature(cfg)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _settings(cfg: DataConfig) -> dict:
    return {key: value for key, value in asdict(cfg).items() if key not in RUN_ONLY_FIELDS}


def _reusable_meta(data_dir: Path, fingerprint: str, verify: str) -> Optional[dict]:
    try:
        meta = read_meta(data_dir)  # a damaged or edited meta.json fails its own digest here
        if meta.get("fingerprint") != fingerprint:
            return None
        for split in SPLITS:
            path = check_shard(data_dir, meta, split)
            if verify == "sha256" and file_sha256(path) != meta["sha256"][split]:
                log.warning("%s does not match the sha256 meta.json recorded: rebuilding", path)
                return None
    except DataError as err:  # nothing usable there: build afresh
        if (data_dir / META_FILE).exists():
            log.warning("%s; rebuilding", err)
        return None
    return meta


def _build(cfg: DataConfig, data_dir: Path, fingerprint: str) -> dict:
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / META_FILE).unlink(missing_ok=True)  # from now on the old shards no longer look complete
    remove_temp_files(data_dir)
    try:
        corpus = load_corpus(cfg)
        documents = corpus.documents
        if isinstance(documents, datasets.Dataset):
            documents = documents.shuffle(seed=cfg.split_seed)  # so val.bin's tail samples the whole corpus
        tokenizer = build_tokenizer(cfg.tokenizer, _texts(documents))
        dtype = np.dtype(np.uint16 if tokenizer.vocab_size <= 65535 else np.uint32)
        work_dir = temp_path(data_dir / "work")
        work_dir.mkdir()
        tokenized = _tokenize(documents, tokenizer, dtype, cfg.resolved_num_proc(), work_dir)
        tokens, n_documents, sha256 = write_shards(_token_batches(tokenized), data_dir, dtype, cfg.val_fraction)
    finally:
        remove_temp_files(data_dir)
    if corpus.replaced_bytes:
        log.warning("%d bytes of the corpus were not valid UTF-8 and became U+FFFD", corpus.replaced_bytes)
    meta = {
        "format": FORMAT_VERSION,
        "fingerprint": fingerprint,
        "source": corpus.description,
        "settings": _settings(cfg),
        "tokenizer": tokenizer.describe(),
        "vocab_size": tokenizer.vocab_size,
        "eot_id": tokenizer.eot_id,
        "dtype": dtype.name,
        "tokens": tokens,
        "sha256": sha256,
        "documents": n_documents,
        "replaced_bytes": corpus.replaced_bytes,
    }
    meta[META_DIGEST] = meta_digest(meta)
    write_json_atomic(data_dir / META_FILE, meta)
    return meta


def _texts(documents: Documents) -> Iterator[str]:
    for batch in documents.iter(batch_size=BATCH_DOCUMENTS):
        yield from batch["text"]


def _tokenize(documents: Documents, tokenizer: Tokenizer, dtype: np.dtype, num_proc: int, work_dir: Path) -> Documents:
    """One row of ids per non-empty document (column "ids"), separators included.

    A map-style dataset is tokenised here, by num_proc processes, into work_dir; a stream
    is tokenised lazily, as it is read.
    """
    options = dict(
        batched=True,
        with_indices=True,
        batch_size=BATCH_DOCUMENTS,
        remove_columns=["text"],
        features=datasets.Features({"ids": datasets.Sequence(datasets.Value(dtype.name))}),
        fn_kwargs={"tokenizer": tokenizer.describe()},  # a small dict pickles cheaply into workers
    )
    if isinstance(documents, datasets.Dataset):
        workers = min(num_proc, len(documents))
        options.update(
            num_proc=workers if workers > 1 else None, cache_file_name=str(work_dir / "tokens.arrow"), desc="tokenizing"
        )
    return documents.map(_encode_documents, **options)


def _encode_documents(batch: dict[str, list[str]], indices: list[int], tokenizer: dict) -> dict[str, list[list[int]]]:
    """Each non-empty document's ids, after the separator unless it opens the corpus."""
    encoder = load_tokenizer(tokenizer)  # cached per process
    kept = [(index, text) for index, text in zip(indices, batch["text"]) if text]
    encoded = encoder.encode_batch([text for _, text in kept])
    if encoder.eot_id is None:  # a one-document corpus: nothing to separate
        return {"ids": encoded}
    return {"ids": [([encoder.eot_id] if index > 0 else []) + ids for (index, _), ids in zip(kept, encoded)]}


def _token_batches(tokenized: Documents) -> Iterator[tuple[int, np.ndarray]]:
    """(documents in the batch, all their ids in order: (n_tokens,) array)."""
    for table in tokenized.with_format("arrow").iter(batch_size=BATCH_DOCUMENTS):
        yield table.num_rows, pc.list_flatten(table["ids"]).to_numpy()


def write_shards(
    batches: Iterable[tuple[int, np.ndarray]], data_dir: Path, dtype: np.dtype, val_fraction: float
) -> tuple[dict[str, int], int, dict[str, str]]:
    """Token counts per split, the number of documents, and each shard's sha256.

    All tokens stream into one temporary file; its last val_fraction becomes val.bin and
    the rest train.bin (as nanoGPT splits tiny Shakespeare), each renamed into place only
    when complete. val.bin is hashed as it is copied out of the stream; train.bin, whose
    end is known only once the stream is complete, by reading it back (from the page
    cache, as it was just written).
    """
    stream = temp_path(shard_path(data_dir, "train"))
    n_documents = n_tokens = 0
    with open(stream, "wb") as out, tqdm(desc="writing shards", unit="tok", unit_scale=True) as bar:
        for rows, ids in batches:
            out.write(ids.astype(dtype, copy=False).tobytes())
            n_documents += rows
            n_tokens += len(ids)
            bar.update(len(ids))
    if n_tokens == 0:
        raise DataError("the corpus is empty: it holds no text (empty documents are skipped)")
    n_train = int(n_tokens * (1 - val_fraction))
    if not 0 < n_train < n_tokens:
        raise DataError(f"the corpus has only {n_tokens} tokens, too few to hold out val_fraction={val_fraction}")
    val_sha256 = _move_tail(stream, shard_path(data_dir, "val"), n_train * dtype.itemsize)
    os.replace(stream, shard_path(data_dir, "train"))
    sha256 = {"train": file_sha256(shard_path(data_dir, "train")), "val": val_sha256}
    return {"train": n_train, "val": n_tokens - n_train}, n_documents, sha256


def _move_tail(source: Path, target: Path, offset: int) -> str:
    """Move source's bytes from `offset` on into `target` (via a temporary name); their sha256."""
    temp = temp_path(target)
    digest = hashlib.sha256()
    with open(source, "rb") as src, open(temp, "wb") as dst:
        src.seek(offset)
        while chunk := src.read(IO_CHUNK):
            digest.update(chunk)
            dst.write(chunk)
    os.truncate(source, offset)
    os.replace(temp, target)
    return digest.hexdigest()


# Processes forked while preparing (datasets' pool workers, and the manager process that
# relays their progress) must not outlive a killed prepare. On Linux each asks, right
# after its fork, for SIGKILL when its parent dies (elsewhere nothing is done). Linux
# sends it when the *thread* that forked ends; datasets forks from the thread calling it.
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_preparing_parent: Optional[int] = None  # this process's pid while it prepares


@contextlib.contextmanager
def _forks_die_with_this_process() -> Iterator[None]:
    global _preparing_parent
    _preparing_parent = os.getpid()  # recorded before the pool starts, for its workers to compare
    try:
        yield
    finally:
        _preparing_parent = None


@contextlib.contextmanager
def _signals_stop_at_once(data_dir: Path) -> Iterator[None]:
    """While building, SIGINT and SIGTERM exit at once: unwinding through datasets' worker
    pool can wait on busy workers for minutes. The workers die with this process (see
    below), and meta.json is written last, so nothing left behind looks complete."""
    if threading.current_thread() is not threading.main_thread():  # only it may handle signals
        yield
        return
    handler = functools.partial(_stop_at_once, data_dir=data_dir)
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _stop_at_once(signum: int, frame, data_dir: Path) -> None:
    with contextlib.suppress(OSError):  # a worker may still be writing there
        remove_temp_files(data_dir)
    print(f"error: interrupted by {signal.Signals(signum).name} while preparing {data_dir}; nothing was kept (a "
          "partial file left behind is removed by the next prepare): run the same command to start again",
          file=sys.stderr, flush=True)
    os._exit(128 + signum)


def _die_with_parent() -> None:
    """Runs in every forked child, first thing; does nothing unless forked while preparing."""
    global _preparing_parent
    if _preparing_parent is None:
        return
    parent, _preparing_parent = _preparing_parent, os.getpid()  # a fork of this child follows this child
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the request above took hold
        os._exit(1)


if sys.platform == "linux":
    _LIBC = ctypes.CDLL(None)  # looked up here: loading a library in a forked child can deadlock
    os.register_at_fork(after_in_child=_die_with_parent)
