"""The prepare step (python prepare.py): a corpus tokenised once into train.bin / val.bin + meta.json.

The corpus's pieces (data/readers.py) are tokenised a batch at a time by a pool of threads (tiktoken releases the GIL)
and written block by block (data/shards.py): memory holds a batch and a block, whatever the corpus size. A killed
prepare resumes at its last complete block; a second process preparing the same directory waits for the lock, then
reuses. Whether shards are reused, refused or rebuilt is data/cache.py's rule. meta.json is written last, so an
interrupted run never leaves shards that look complete.
"""

import collections
import contextlib
import ctypes
import json
import logging
import os
import shutil
import signal
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import filelock
from tqdm import tqdm

from data.bpe import TOKENIZER_FILE, load_tokenizer, train_on_sample
from data.cache import fingerprint_of, refuse_other_settings, reusable_meta, token_settings
from data.config import DataConfig
from data.errors import DataError
from data.meta import FORMAT_VERSION, META_FILE, SPLITS, file_sha256, shard_path, with_digest, write_json_atomic
from data.readers import FORCED_CUT_CHARS, Piece
from data.shards import PROGRESS_FILE, ShardWriter, WriteError, partial_path, remove_temp_files
from data.sources import Corpus, open_corpus, source_digests
from data.tokenizer import CharTokenizer, Gpt2Tokenizer, Tokenizer
from system import on_signals, write_atomic

log = logging.getLogger(__name__)

LOCK_FILE = ".prepare.lock"
TASK_CHARS = 1 << 16  # text per task handed to a tokenising thread
NEW_COUNTERS = {"documents": 0, "nonempty": 0, "replaced_bytes": 0}


@dataclass(frozen=True)
class PreparedData:
    data_dir: Path
    meta: dict  # the parsed meta.json
    reused: bool  # True when shards with the same fingerprint were already there

    def shard(self, split: str) -> Path:
        return shard_path(self.data_dir, split)

    def tokenizer(self) -> Tokenizer:
        return load_tokenizer(self.meta, self.data_dir)


def prepare(cfg: DataConfig) -> PreparedData:
    """Tokenise cfg's corpus into its data directory, unless that already holds exactly this data."""
    data_dir, fingerprint = cfg.resolved_data_dir(), fingerprint_of(cfg)
    with _only_preparer(data_dir):
        for path in [data_dir / META_FILE, *(f(data_dir, s) for f in (shard_path, partial_path) for s in SPLITS)]:
            if path.is_dir():
                raise DataError(
                    f"{path} is a directory, where prepare keeps a file of the prepared data: move it "
                    "away (or delete it), or set another data.data_dir"
                )
        refuse_other_settings(cfg, data_dir)
        if (meta := reusable_meta(cfg, data_dir, fingerprint)) is not None:
            log.info("reusing the shards in %s (same settings and source)", data_dir)
            return PreparedData(data_dir, meta, reused=True)
        with _building(data_dir):
            return PreparedData(data_dir, _build(cfg, data_dir, fingerprint), reused=False)


@contextlib.contextmanager
def _only_preparer(data_dir: Path) -> Iterator[None]:
    """Hold the data directory's lock: a second process (another run, or rank) waits, with no collective to time out."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        if not data_dir.is_dir():  # a file in the way, or no permission to create it
            raise DataError(f"data.data_dir={data_dir}: cannot create that directory ({err.strerror or err})") from err
    if not os.access(data_dir, os.W_OK):  # a read-only data directory: nothing can be written, nothing to guard
        yield
        return
    lock = filelock.FileLock(data_dir / LOCK_FILE)
    try:
        try:
            lock.acquire(timeout=0)
        except filelock.Timeout:
            log.warning("another process is preparing %s: waiting for it to finish", data_dir)
            lock.acquire()
    except OSError as err:  # a filesystem without locks (some network mounts)
        log.warning(
            f"cannot lock {data_dir / LOCK_FILE} ({err.strerror or err}): preparing without the lock; "
            "run one prepare at a time there"
        )
    try:
        yield
    finally:
        lock.release()


def _build(cfg: DataConfig, data_dir: Path, fingerprint: str) -> dict:
    (data_dir / META_FILE).unlink(missing_ok=True)  # from now on the old shards no longer look complete
    remove_temp_files(data_dir)
    threads, batch_chars = cfg.resolved_num_proc(), int(cfg.batch_mb * (1 << 20))
    corpus = open_corpus(cfg, piece_chars=max(1024, min(FORCED_CUT_CHARS, batch_chars // (4 * threads))))
    progress = _resumable_progress(data_dir, fingerprint)
    if progress is None:
        _remove_partials(data_dir)
        tokenizer = _new_tokenizer(cfg, corpus)
        for name, content in tokenizer.files().items():  # before progress.json, which names them
            write_atomic(data_dir / name, content)
        progress = {
            "fingerprint": fingerprint,
            "settings": token_settings(cfg),
            "tokenizer": tokenizer.describe(),
            "dtype": "uint16" if tokenizer.vocab_size <= 65535 else "uint32",
            "blocks": 0,
            "bytes": {split: 0 for split in SPLITS},
            "resume": None,
        }
    else:
        tokenizer = load_tokenizer(progress["tokenizer"], data_dir)
        log.info("resuming the prepare of %s after block %d", data_dir, progress["blocks"])
    try:
        meta = _write(cfg, data_dir, corpus, tokenizer, progress, threads, batch_chars)
    except WriteError:
        raise  # disk full or the like: the blocks written so far are kept, to resume from
    except Exception:  # the corpus itself is at fault: nothing written is worth keeping
        _remove_partials(data_dir)
        raise
    if cfg.hf_cache_dir is None and not cfg.keep_hf_cache:  # datasets' cache in its default place is gptlab's to remove
        shutil.rmtree(cfg.resolved_hf_cache_dir(), ignore_errors=True)
    return meta


def _write(cfg, data_dir, corpus, tokenizer, progress, threads, batch_chars) -> dict:
    start = progress["resume"] or {"position": None, "skip_tokens": 0, "counters": NEW_COUNTERS}
    counters = dict(start["counters"])
    with contextlib.closing(ShardWriter(data_dir, tokenizer.eot_id, cfg, progress)) as writer:
        pieces = _numbered(corpus.reader.pieces(start["position"]), cfg.max_documents, counters)
        with tqdm(desc="tokenizing", unit="tok", unit_scale=True) as bar:
            for index, (piece, before, tokens) in enumerate(_tokenized(pieces, tokenizer, threads, batch_chars)):
                opens = piece.new_document
                if index == 0 and start["skip_tokens"]:  # these are in the blocks written before
                    tokens, opens = tokens[start["skip_tokens"] :], False
                writer.add(tokens, opens, piece.position, before)
                bar.update(len(tokens))
        tokens = writer.finish()
    if (total := sum(tokens.values())) == 0:
        raise DataError("the corpus is empty: it holds no text (empty documents are skipped)")
    if min(tokens.values()) == 0:
        raise DataError(f"the corpus has only {total} tokens, too few to hold out val_fraction={cfg.val_fraction}")
    sha256 = {split: file_sha256(partial_path(data_dir, split)) for split in SPLITS}
    for split in SPLITS:
        os.replace(partial_path(data_dir, split), shard_path(data_dir, split))
    if counters["replaced_bytes"]:
        log.warning("%d bytes of the corpus were not valid UTF-8 and became U+FFFD", counters["replaced_bytes"])
    meta = with_digest(
        {
            "format": FORMAT_VERSION,
            "fingerprint": progress["fingerprint"],
            "source": corpus.description,
            "settings": token_settings(cfg),
            "tokenizer": tokenizer.describe(),
            "vocab_size": tokenizer.vocab_size,
            "eot_id": tokenizer.eot_id,
            "dtype": progress["dtype"],
            "tokens": tokens,
            "sha256": sha256,
            "source_sha256": source_digests(cfg),
            "documents": counters["documents"],
            "blocks": progress["blocks"],
            "replaced_bytes": counters["replaced_bytes"],
        }
    )
    write_json_atomic(data_dir / META_FILE, meta)
    (data_dir / PROGRESS_FILE).unlink(missing_ok=True)
    return meta


def _resumable_progress(data_dir: Path, fingerprint: str) -> dict | None:
    """progress.json of an unfinished prepare of this very data, if its partial shards are there."""
    try:
        progress = json.loads((data_dir / PROGRESS_FILE).read_text(encoding="utf-8"))
        sizes = {split: partial_path(data_dir, split).stat().st_size for split in SPLITS}
    except (OSError, ValueError):
        return None
    if not isinstance(progress, dict) or progress.get("fingerprint") != fingerprint:
        log.warning(
            f"{data_dir} holds an unfinished prepare of the same settings from files that changed since (or from "
            "another version of gptlab): starting afresh"
        )
        return None
    if progress.get("resume") is None or any(sizes[s] < progress["bytes"][s] for s in SPLITS):
        return None
    try:
        load_tokenizer(progress["tokenizer"], data_dir)  # a trained tokenizer's file must be there, intact
    except DataError:
        return None
    return progress


def _remove_partials(data_dir: Path) -> None:
    """What an unfinished prepare leaves: progress.json, the partial shards, a trained tokenizer."""
    for path in [data_dir / PROGRESS_FILE, data_dir / TOKENIZER_FILE, *(partial_path(data_dir, s) for s in SPLITS)]:
        path.unlink(missing_ok=True)


def _numbered(pieces: Iterator[Piece], max_documents: int | None, counters: dict):
    """(piece, the counters before it) up to max_documents documents; `counters` counts as pieces are read."""
    for piece in pieces:
        before = dict(counters)
        if piece.new_document:
            if counters["documents"] == max_documents:
                return
            if piece.error:
                raise DataError(piece.error)
            counters["documents"] += 1
            counters["nonempty"] += bool(piece.text)
        counters["replaced_bytes"] += piece.replaced_bytes
        yield piece, before


def _new_tokenizer(cfg: DataConfig, corpus: Corpus) -> Tokenizer:
    """The new corpus's tokenizer: `char` reads all of it (its vocabulary), `bpe` its first TRAINING_SAMPLE_BYTES."""
    if cfg.tokenizer == "gpt2":
        return Gpt2Tokenizer()
    counters = dict(NEW_COUNTERS)
    texts = (piece.text for piece, _ in _numbered(corpus.reader.pieces(), cfg.max_documents, counters))
    if cfg.tokenizer == "bpe":
        return train_on_sample(tqdm(texts, desc="training the tokenizer", unit=" pieces"), cfg.vocab_size)
    characters: set[str] = set()
    for text in tqdm(texts, desc="vocabulary", unit=" pieces"):
        characters.update(text)
    return CharTokenizer("".join(sorted(characters)), with_eot=counters["nonempty"] > 1)


def _tokenized(numbered, tokenizer: Tokenizer, threads: int, batch_chars: int):
    """(piece, counters before it, its uint32 ids) in reading order; threads tokenise, about batch_chars in flight."""
    task_chars = max(1, min(TASK_CHARS, batch_chars // (4 * threads)))

    def encoded(task: list) -> list:
        return [(*item, tokenizer.encode_array(item[0].text)) for item in task]

    with ThreadPoolExecutor(threads) as pool:
        in_flight, chars = collections.deque(), 0
        for task, size in _tasks(numbered, task_chars):
            in_flight.append((size, pool.submit(encoded, task)))
            chars += size
            while chars > batch_chars:
                chars -= in_flight[0][0]
                yield from in_flight.popleft()[1].result()
        for _, done in in_flight:
            yield from done.result()


def _tasks(numbered, task_chars: int):
    task, size = [], 0
    for item in numbered:
        task.append(item)
        size += len(item[0].text)
        if size >= task_chars:
            yield task, size
            task, size = [], 0
    if task:
        yield task, size


# Processes forked while preparing (datasets' pool workers and progress manager) must not outlive
# a killed prepare: on Linux each asks, right after its fork, for SIGKILL when its parent dies
# (sent when the *thread* that forked ends; datasets forks from the thread calling it).
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_preparing_parent: int | None = None  # this process's pid while it prepares


@contextlib.contextmanager
def _building(data_dir: Path) -> Iterator[None]:
    """While building, forked processes die with this one, and SIGINT and SIGTERM exit at once: unwinding through
    datasets' worker pool can wait on busy workers for minutes. meta.json is written last, so nothing left behind
    looks complete."""
    global _preparing_parent

    def stop(signum: int, frame) -> None:
        with contextlib.suppress(OSError):  # a worker may still be writing there
            remove_temp_files(data_dir)
        sys.stderr.write(
            f"error: interrupted by {signal.Signals(signum).name} while preparing {data_dir}: the same command "
            "resumes after the last complete block (shards left incomplete never look complete)\n"
        )
        sys.stderr.flush()
        os._exit(128 + signum)

    _preparing_parent = os.getpid()  # recorded before the pool starts, for its workers to compare
    try:
        with on_signals(stop):
            yield
    finally:
        _preparing_parent = None


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
