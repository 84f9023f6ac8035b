"""Corpora: each source (stdlib, files, hub) opened as a reader of text pieces.

- stdlib: the running Python's standard library sources and pydoc topics (offline).
- files: local text / JSON Lines / parquet files, read by gptlab's own streaming readers
  (no copy of the corpus is made); with no `path`, the file at `url` is downloaded once.
- hub: a Hub dataset id through `datasets` (downloaded first, or streamed), or a local
  dataset directory (a `save_to_disk` one, memory-mapped; else its data files, streamed).

Text files are decoded as UTF-8; bytes that are not UTF-8 become U+FFFD, and how many
did is counted, logged and stored in meta.json. A source that is not UTF-8 text at all is
refused as it is read (data/encoding.py).
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import sysconfig
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
from pydoc_data.topics import topics as PYDOC_TOPICS

from data.config import DataConfig
from data.errors import DataError, describe_error
from data.readers import Chain, JsonLines, Rows, Stream, TextFiles, check_utf8
from system import write_atomic

log = logging.getLogger(__name__)

_KIND_OF_SUFFIX = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}  # others: "text"
_STDLIB_SKIPPED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
_STDLIB_TOPICS_MODULE = "pydoc_data/topics.py"  # its texts come in as PYDOC_TOPICS instead
_ROWS_PER_BATCH = 1000  # rows read at once from a table


@dataclass
class Corpus:
    reader: object  # has .pieces(position) -> Iterator[Piece] (see data.readers)
    description: str  # for people reading meta.json
    origin: str  # what error messages call it: its file(s) or data.dataset


def open_corpus(cfg: DataConfig, piece_chars: int) -> Corpus:
    corpus = {"stdlib": _stdlib_corpus, "files": _files_corpus, "hub": _hub_corpus}[cfg.source](cfg, piece_chars)
    if cfg.max_documents is not None:
        corpus.description += f", first {cfg.max_documents} documents"
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


def _stdlib_corpus(cfg: DataConfig, piece_chars: int) -> Corpus:
    files = stdlib_files()
    topics = [PYDOC_TOPICS[key] for key in sorted(PYDOC_TOPICS)]
    reader = Chain([TextFiles(files, piece_chars), Rows(_list_batches(topics), "text", "pydoc topics", piece_chars)])
    description = f"Python {sysconfig.get_python_version()} standard library: {len(files)} .py files + {len(topics)} pydoc topics"
    return Corpus(reader, description, "the standard library")


def _files_corpus(cfg: DataConfig, piece_chars: int) -> Corpus:
    files = resolve_files(cfg.path) if cfg.path else [_download(cfg.url, cfg.resolved_data_dir() / "download")]
    kinds = {_KIND_OF_SUFFIX.get(f.suffix.lower(), "text") for f in files}
    if len(kinds) > 1:
        raise DataError(f"data.path={cfg.path!r} mixes file formats ({sorted(kinds)}); point it at one format")
    description = f"{len(files)} file(s): {files[0]}{' ...' if len(files) > 1 else ''}"
    origin = str(files[0]) if len(files) == 1 else f"the {len(files)} files of data.path={cfg.path!r} (in path order)"
    kind = kinds.pop()
    for path in files if kind != "parquet" else ():
        check_utf8(path)
    if kind == "text":
        reader = TextFiles(files, piece_chars, cfg.document_separator)
    elif kind == "json":
        reader = JsonLines(files, cfg.text_column, piece_chars)
    else:
        reader = Chain([_parquet_rows(f, cfg.text_column, piece_chars) for f in files])
    return Corpus(reader, description, origin)


def _parquet_rows(path: Path, column: str, piece_chars: int) -> Rows:
    with _parquet_named(path):
        columns = pq.read_schema(path).names
    _check_column(column, columns)

    def batches(first_row: int):
        with _parquet_named(path):  # a data page damaged past the footer fails here
            parquet = pq.ParquetFile(path)
            seen = 0
            for group in range(parquet.num_row_groups):
                rows = parquet.metadata.row_group(group).num_rows
                if seen + rows > first_row:
                    for batch in parquet.iter_batches(_ROWS_PER_BATCH, row_groups=[group], columns=[column]):
                        texts = batch.column(0).to_pylist()
                        yield texts[max(0, first_row - seen):]
                        seen += len(texts)
                else:
                    seen += rows

    return Rows(batches, column, str(path), piece_chars)


@contextlib.contextmanager
def _parquet_named(path: Path) -> Iterator[None]:
    """pyarrow's errors for an unreadable or damaged file (OSErrors and ArrowInvalid, a
    ValueError) name no file: name it."""
    try:
        yield
    except (OSError, pa.ArrowException) as err:
        reason = " ".join(str(err).split())  # pyarrow's messages can span lines
        raise DataError(f"cannot read {path} as parquet ({reason}); replace the file, or leave it out of "
                        "data.path") from err


def _list_batches(texts: list):
    return lambda first_row: (texts[i:i + _ROWS_PER_BATCH] for i in range(first_row, len(texts), _ROWS_PER_BATCH))


def _table_batches(table: datasets.Dataset):
    def batches(first_row: int):
        for start in range(first_row, len(table), _ROWS_PER_BATCH):
            yield table[start:start + _ROWS_PER_BATCH]["text"]
    return batches


def _hub_corpus(cfg: DataConfig, piece_chars: int) -> Corpus:
    local = Path(cfg.dataset).expanduser()
    origin = f"data.dataset={cfg.dataset!r}"
    if _is_saved_dataset(local):
        table = _text_column(_load_saved(local, cfg), cfg.text_column)
        return Corpus(Rows(_table_batches(table), cfg.text_column, origin, piece_chars),
                      f"{cfg.dataset} (saved dataset, split {cfg.split})", origin)
    # A local directory, or only the first documents, are read as a stream: no copy, no full download.
    streamed = cfg.streaming or local.is_dir() or cfg.max_documents is not None
    description = f"{cfg.dataset} ({cfg.subset or 'default'}, split {cfg.split}, {'streaming' if streamed else 'map-style'})"
    if streamed:
        opened = [_open_stream(cfg)]  # fails here, before any work, if the source cannot be read

        def open_stream():  # the stream checked above serves the first read; later reads open anew
            return opened.pop() if opened else _open_stream(cfg)

        return Corpus(Stream(open_stream, cfg.text_column, origin, piece_chars), description, origin)
    table = _text_column(_load_hub(cfg, streaming=False), cfg.text_column)
    return Corpus(Rows(_table_batches(table), cfg.text_column, origin, piece_chars), description, origin)


def _open_stream(cfg: DataConfig):
    stream = _load_hub(cfg, streaming=True)
    try:
        return _text_column(stream, cfg.text_column)  # reads the first row, for the columns
    except DataError:
        raise
    except Exception as err:  # noqa: BLE001 - datasets raises many types; all mean "did not read"
        raise DataError(f"could not read data.dataset={cfg.dataset!r} through datasets ({describe_error(err)})") from err


def _is_saved_dataset(path: Path) -> bool:
    """A directory written by datasets' save_to_disk (a Dataset or a DatasetDict)."""
    return (path / "state.json").is_file() or (path / "dataset_dict.json").is_file()


def _load_saved(path: Path, cfg: DataConfig) -> datasets.Dataset:
    try:
        saved = datasets.load_from_disk(str(path))
    except Exception as err:  # noqa: BLE001 - datasets raises many types; all mean "did not load"
        raise DataError(f"could not load the saved dataset {path} ({describe_error(err)})") from err
    if isinstance(saved, datasets.DatasetDict):
        if cfg.split not in saved:
            raise DataError(f"the saved dataset {path} has no split {cfg.split!r} (it has {sorted(saved)}); set data.split")
        saved = saved[cfg.split]
    return saved


def _load_hub(cfg: DataConfig, streaming: bool):
    options = dict(name=cfg.subset, split=cfg.split, revision=cfg.revision, streaming=streaming)
    if not streaming:
        options["num_proc"] = cfg.resolved_num_proc()
    return _load(cfg.dataset, f"data.dataset={cfg.dataset!r}", cfg, hint=_local_hint(cfg), **options)


def _local_hint(cfg: DataConfig) -> str:
    """For a local directory standing in for a Hub id: the Hub-only settings a preset may carry."""
    if not Path(cfg.dataset).expanduser().is_dir():
        return ""
    hints = [f"data.subset={cfg.subset!r} names a configuration the directory may lack (set data.subset=null)"] if cfg.subset else []
    hints.append(f"data.split={cfg.split!r} must be a split the directory has")
    return "; a local directory replaces the Hub id here: " + ", and ".join(hints)


def _load(path: str, what: str, cfg: DataConfig, hint: str = "", **options):
    """datasets.load_dataset, with its failures (offline, missing, malformed) explained.
    A local directory loads without datasets' progress bars: they would say "Downloading data"."""
    try:
        with _no_usage_ping(), _quiet(local=Path(path).expanduser().is_dir()):
            return datasets.load_dataset(path, cache_dir=str(cfg.resolved_hf_cache_dir()), **options)
    except Exception as err:  # noqa: BLE001 - datasets raises many types; all mean "did not load"
        raise DataError(f"could not load {what} through datasets ({describe_error(err)}){hint}") from err


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
    write_atomic(target, content)
    return target


def _text_column(documents, column: str):
    """Keep only `column`, renamed to "text"."""
    columns = documents.column_names or list(next(iter(documents), {}))  # streams may not know theirs
    _check_column(column, columns)
    documents = documents.select_columns([column])
    return documents if column == "text" else documents.rename_column(column, "text")


def _check_column(column: str, columns: list[str]) -> None:
    if column not in columns:
        raise DataError(f"the data has no column {column!r} (it has {columns}); set data.text_column")
