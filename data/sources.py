"""Corpora: every source becomes a Hugging Face dataset with one column, "text".

- stdlib: the running Python's standard library sources and pydoc topics (offline).
- files: local text / jsonl / parquet files through datasets' packaged builders; with
  no `path`, the file at `url` is downloaded once (tiny Shakespeare).
- hub: a Hub dataset id (or a local dataset directory), map-style or streaming.

Text files are decoded as UTF-8; bytes that are not UTF-8 become U+FFFD, and how many
did is counted, logged and stored in meta.json.
"""

from __future__ import annotations

import codecs
import contextlib
import glob
import logging
import os
import re
import sysconfig
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Union

import datasets
import pyarrow.compute as pc
from pydoc_data.topics import topics as PYDOC_TOPICS

from data.config import DataConfig
from data.errors import DataError
from data.meta import temp_path

log = logging.getLogger(__name__)

Documents = Union[datasets.Dataset, datasets.IterableDataset]

_BUILDER_OF_SUFFIX = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}  # others: "text"
_STDLIB_SKIPPED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
_STDLIB_TOPICS_MODULE = "pydoc_data/topics.py"  # its texts come in as PYDOC_TOPICS instead
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")  # how surrogateescape spells an undecodable byte
_CHECKED_ROWS = 100_000  # rows per arrow slice when looking for documents without text


@dataclass
class Corpus:
    documents: Documents  # one row per document, column "text"
    description: str  # for people reading meta.json
    origin: str  # what error messages call it: its file(s) or data.dataset
    replaced_bytes: int = 0  # bytes that were not UTF-8 and were decoded as U+FFFD


def load_corpus(cfg: DataConfig) -> Corpus:
    corpus = {"stdlib": _stdlib_corpus, "files": _files_corpus, "hub": _hub_corpus}[cfg.source](cfg)
    if cfg.max_documents is not None:
        corpus.documents = _first(corpus.documents, cfg.max_documents)
        corpus.description += f", first {cfg.max_documents} documents"
    corpus.documents = _require_texts(corpus.documents, cfg.text_column, corpus.origin)
    return corpus


def source_signature(cfg: DataConfig) -> dict:
    """What identifies the source's content, cheaply (file stats, not file contents)."""
    if cfg.source == "stdlib":
        return {"python": sysconfig.get_python_version(), "files": _file_stats(stdlib_files())}
    if cfg.source == "files":
        return {"files": _file_stats(resolve_files(cfg.path))} if cfg.path else {"url": cfg.url}
    local_dir = Path(cfg.dataset).expanduser()
    return {"files": _file_stats(resolve_files(cfg.dataset))} if local_dir.is_dir() else {}


def _file_stats(files: list[Path]) -> list[tuple[str, int, int]]:
    return [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files]


def stdlib_files() -> list[Path]:
    """The standard library's own .py files (no tests, no site-packages), sorted by path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for directory, subdirectories, names in os.walk(root):
        subdirectories[:] = [d for d in subdirectories if d not in _STDLIB_SKIPPED_DIRS]  # prune the walk
        found += [Path(directory, name).relative_to(root) for name in names if name.endswith(".py")]
    kept = sorted((p for p in found if p.as_posix() != _STDLIB_TOPICS_MODULE), key=Path.as_posix)
    return [root / p for p in kept]


def _stdlib_corpus(cfg: DataConfig) -> Corpus:
    files = stdlib_files()
    sources, replaced = _text_files(files, cfg)
    topics = datasets.Dataset.from_dict({"text": [PYDOC_TOPICS[key] for key in sorted(PYDOC_TOPICS)]})
    description = f"Python {sysconfig.get_python_version()} standard library: {len(files)} .py files + {len(PYDOC_TOPICS)} pydoc topics"
    return Corpus(datasets.concatenate_datasets([sources, topics]), description, "the standard library", replaced)


def _files_corpus(cfg: DataConfig) -> Corpus:
    files = resolve_files(cfg.path) if cfg.path else [_download(cfg.url, cfg.resolved_data_dir() / "download")]
    builders = {_BUILDER_OF_SUFFIX.get(f.suffix.lower(), "text") for f in files}
    if len(builders) > 1:
        raise DataError(f"data.path={cfg.path!r} mixes file formats ({sorted(builders)}); point it at one format")
    description = f"{len(files)} file(s): {files[0]}{' ...' if len(files) > 1 else ''}"
    origin = str(files[0]) if len(files) == 1 else f"the {len(files)} files of data.path={cfg.path!r} (in path order)"
    if builders == {"text"}:
        documents, replaced = _text_files(files, cfg)
        return Corpus(documents, description, origin, replaced)
    for path in files:
        _check_readable(path)
    documents = _load(builders.pop(), f"files {[str(f) for f in files]}", cfg, data_files=[str(f) for f in files])
    return Corpus(_text_column(documents, cfg.text_column), description, origin)


def _hub_corpus(cfg: DataConfig) -> Corpus:
    mode = "streaming" if cfg.streaming else "map-style"
    documents = _load(
        cfg.dataset, f"data.dataset={cfg.dataset!r}", cfg,
        name=cfg.subset, split=cfg.split, revision=cfg.revision, streaming=cfg.streaming,
        num_proc=None if cfg.streaming else cfg.resolved_num_proc(),
    )
    description = f"{cfg.dataset} ({cfg.subset or 'default'}, split {cfg.split}, {mode})"
    return Corpus(_text_column(documents, cfg.text_column), description, f"data.dataset={cfg.dataset!r}")


def _load(path: str, what: str, cfg: DataConfig, **options) -> Documents:
    """datasets.load_dataset, with its failures (offline, missing, malformed) explained.
    Local files load without datasets' progress bars: they would say "Downloading data"."""
    options.setdefault("split", "train")
    try:
        with _no_usage_ping(), _quiet(local="data_files" in options):
            return datasets.load_dataset(path, cache_dir=str(cfg.resolved_hf_cache_dir()), **options)
    except Exception as err:  # datasets raises many types; all mean "this source did not load"
        raise DataError(f"could not load {what} through datasets ({type(err).__name__}: {err})") from err


@contextlib.contextmanager
def _quiet(local: bool):
    was_disabled = datasets.are_progress_bars_disabled()
    if local:
        datasets.disable_progress_bars()
    try:
        yield
    finally:
        if local and not was_disabled:
            datasets.enable_progress_bars()


@contextlib.contextmanager
def _no_usage_ping():
    """Loading local files with a packaged builder ("text", "json", ...) makes datasets ping
    a server to count the builder's use, which costs up to 3 s with no network; skip it."""
    saved = datasets.config.HF_UPDATE_DOWNLOAD_COUNTS
    datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = False
    try:
        yield
    finally:
        datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = saved


def _text_files(files: list[Path], cfg: DataConfig) -> tuple[datasets.Dataset, int]:
    """Each file is one document; counts (and logs) the bytes that are not UTF-8."""
    replaced = 0
    for path in files:
        bad = count_non_utf8_bytes(path)
        if bad:
            log.warning("%s: %d bytes are not valid UTF-8; they were decoded as U+FFFD", path, bad)
        replaced += bad
    documents = _load(
        "text", f"text files {[str(f) for f in files][:3]}", cfg,
        data_files=[str(f) for f in files], sample_by="document", encoding_errors="replace",
    )
    return documents, replaced


def count_non_utf8_bytes(path: Path) -> int:
    """How many bytes of `path` are not part of valid UTF-8 (read in chunks, any size)."""
    _check_readable(path)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
    count = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            count += len(_ESCAPED_BYTE.findall(decoder.decode(chunk)))
    return count + len(_ESCAPED_BYTE.findall(decoder.decode(b"", final=True)))


def _check_readable(path: Path) -> None:
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as err:
        raise DataError(f"cannot read {path}: {err.strerror}") from err


def resolve_files(pattern: str) -> list[Path]:
    """The files a path names: itself, every non-hidden file under a directory, or a glob's matches."""
    expanded = os.path.expanduser(pattern)
    base = Path(expanded)
    if base.is_dir():
        found = [p for p in base.rglob("*") if not any(part.startswith(".") for part in p.relative_to(base).parts)]
    elif any(char in expanded for char in "*?["):
        found = [Path(p) for p in glob.glob(expanded, recursive=True)]
    else:
        found = [base]
    files = sorted(p for p in found if p.is_file())
    if not files:
        raise DataError(f"data.path={pattern!r} matched no files")
    return files


def _download(url: str, directory: Path) -> Path:
    """The file at `url`, fetched once into `directory` (written to a temporary name, then renamed)."""
    target = directory / (Path(urllib.parse.urlparse(url).path).name or "download.txt")
    if target.exists():
        return target
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            content = response.read()
    except (OSError, ValueError) as err:  # URLError is an OSError; a malformed URL a ValueError
        raise DataError(
            f"data.path is not set and {url} could not be downloaded ({err}); download the file "
            "yourself and pass data.path=/path/to/it"
        ) from err
    directory.mkdir(parents=True, exist_ok=True)
    temp = temp_path(target)
    temp.write_bytes(content)
    os.replace(temp, target)
    return target


def _text_column(documents: Documents, column: str) -> Documents:
    """Keep only `column`, renamed to "text"."""
    columns = documents.column_names or list(next(iter(documents), {}))  # streams may not know theirs
    if column not in columns:
        raise DataError(f"the data has no column {column!r} (it has {columns}); set data.text_column")
    documents = documents.select_columns([column])
    return documents if column == "text" else documents.rename_column(column, "text")


def _require_texts(documents: Documents, column: str, origin: str) -> Documents:
    """`documents`, failing on the first whose text is null (a jsonl row without the column,
    say): a map-style corpus now, from arrow's null counts (before any shuffle, so the index
    is the row's place in the source); a stream as it is read."""
    if isinstance(documents, datasets.IterableDataset):
        checks = dict(column=column, origin=origin)
        return documents.map(_check_texts, batched=True, with_indices=True, fn_kwargs=checks)
    offset = 0
    for table in documents.with_format("arrow").iter(batch_size=_CHECKED_ROWS):
        texts = table["text"]
        if texts.null_count:
            raise _missing_text(offset + pc.index(pc.is_null(texts), True).as_py(), column, origin)
        offset += table.num_rows
    return documents


def _check_texts(batch: dict[str, list], indices: list[int], column: str, origin: str) -> dict[str, list]:
    for index, text in zip(indices, batch["text"]):
        if text is None:
            raise _missing_text(index, column, origin)
    return batch


def _missing_text(index: int, column: str, origin: str) -> DataError:
    return DataError(
        f"document {index} of {origin} has no {column!r} value (null or missing): "
        "fix the row or set data.text_column"
    )


def _first(documents: Documents, n: int) -> Documents:
    if isinstance(documents, datasets.IterableDataset):
        return documents.take(n)
    return documents.select(range(min(n, len(documents))))
