"""Corpora: each source (stdlib, files, hub) opened as a reader of text pieces (data/readers.py).

- stdlib: the running Python's standard library sources and pydoc topics (offline).
- files: local text / JSON Lines / parquet files, streamed (no copy of the corpus is made);
  with no `path`, the file at `url` is downloaded once.
- hub: a Hub dataset id through `datasets`, or a local dataset directory (data/hub.py,
  imported only for this source).
"""

import contextlib
import glob
import os
import sysconfig
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from pydoc_data.topics import topics as PYDOC_TOPICS

import pyarrow as pa
import pyarrow.parquet as pq

from data.config import DataConfig
from data.errors import DataError
from data.meta import file_sha256
from data.readers import ROWS_PER_BATCH, Chain, Corpus, JsonLines, Rows, TextFiles, check_column, check_utf8
from system import write_atomic

_KIND_OF_SUFFIX = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}  # others: "text"
_STDLIB_SKIPPED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
_STDLIB_TOPICS_MODULE = "pydoc_data/topics.py"  # its texts come in as PYDOC_TOPICS instead


def open_corpus(cfg: DataConfig, piece_chars: int) -> Corpus:
    if cfg.source == "hub":  # datasets takes half a second to import: only a Hub source pays for it
        from data.hub import hub_corpus as opened
    else:
        opened = {"stdlib": _stdlib_corpus, "files": _files_corpus}[cfg.source]
    corpus = opened(cfg, piece_chars)
    if cfg.max_documents is not None:
        corpus.description += f", first {cfg.max_documents} documents"
    return corpus


def source_signature(cfg: DataConfig) -> dict:
    """What identifies the source's content, cheaply (file stats, not file contents)."""
    if cfg.source == "files" and not cfg.path:
        return {"url": cfg.url}
    files = [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in local_source_files(cfg)]
    python = {"python": sysconfig.get_python_version()} if cfg.source == "stdlib" else {}
    return python | ({"files": files} if files else {})


def local_source_files(cfg: DataConfig) -> list[Path]:
    """The source's files on this machine: the stdlib's, data.path's or a local dataset directory's."""
    if cfg.source == "stdlib":
        return stdlib_files()
    if cfg.source == "files":
        return resolve_files(cfg.path) if cfg.path else []
    return resolve_files(cfg.dataset) if Path(cfg.dataset).expanduser().is_dir() else []


def source_digests(cfg: DataConfig) -> dict[str, str]:
    """{path: sha256} of the source's local files (the fingerprint sees only their sizes and times)."""
    return {str(path.resolve()): file_sha256(path) for path in local_source_files(cfg)}


def stdlib_files() -> list[Path]:
    """The standard library's own .py files (no tests, no site-packages), sorted by path."""
    root, found = Path(sysconfig.get_paths()["stdlib"]), []
    for directory, subdirectories, names in os.walk(root):
        subdirectories[:] = [d for d in subdirectories if d not in _STDLIB_SKIPPED_DIRS]  # prune the walk
        found += [Path(directory, name) for name in names if name.endswith(".py")]
    return sorted((p for p in found if p != root / _STDLIB_TOPICS_MODULE), key=Path.as_posix)


def _stdlib_corpus(cfg: DataConfig, piece_chars: int) -> Corpus:
    files, topics = stdlib_files(), [PYDOC_TOPICS[key] for key in sorted(PYDOC_TOPICS)]
    reader = Chain([TextFiles(files, piece_chars), Rows(_list_batches(topics), "text", "pydoc topics", piece_chars)])
    version = sysconfig.get_python_version()
    return Corpus(reader, f"Python {version} standard library: {len(files)} .py files + {len(topics)} pydoc topics")


def _files_corpus(cfg: DataConfig, piece_chars: int) -> Corpus:
    files = resolve_files(cfg.path) if cfg.path else [_download(cfg.url, cfg.resolved_data_dir() / "download")]
    kinds = {_KIND_OF_SUFFIX.get(f.suffix.lower(), "text") for f in files}
    if len(kinds) > 1:
        raise DataError(f"data.path={cfg.path!r} mixes file formats ({sorted(kinds)}); point it at one format")
    kind = kinds.pop()
    for path in files if kind != "parquet" else ():
        check_utf8(path)
    if kind == "text":
        reader = TextFiles(files, piece_chars, cfg.document_separator)
    elif kind == "json":
        reader = JsonLines(files, cfg.text_column, piece_chars)
    else:
        reader = Chain([_parquet_rows(f, cfg.text_column, piece_chars) for f in files])
    return Corpus(reader, f"{len(files)} file(s): {files[0]}{' ...' if len(files) > 1 else ''}")


def _parquet_rows(path: Path, column: str, piece_chars: int) -> Rows:
    with _parquet_named(path):
        columns = pq.read_schema(path).names
    check_column(column, columns)

    def batches(first_row: int):
        with _parquet_named(path):  # a data page damaged past the footer fails here
            parquet, seen = pq.ParquetFile(path), 0
            for group in range(parquet.num_row_groups):
                rows = parquet.metadata.row_group(group).num_rows
                if seen + rows > first_row:
                    for batch in parquet.iter_batches(ROWS_PER_BATCH, row_groups=[group], columns=[column]):
                        yield batch.column(0).to_pylist()[max(0, first_row - seen) :]
                        seen += batch.num_rows
                else:
                    seen += rows

    return Rows(batches, column, str(path), piece_chars)


@contextlib.contextmanager
def _parquet_named(path: Path) -> Iterator[None]:
    """pyarrow's errors for an unreadable or damaged file name no file: name it."""
    try:
        yield
    except (OSError, pa.ArrowException) as err:
        reason = " ".join(str(err).split())  # pyarrow's messages can span lines
        raise DataError(
            f"cannot read {path} as parquet ({reason}); replace the file, or leave it out of data.path"
        ) from err


def _list_batches(texts: list):
    return lambda first_row: (texts[i : i + ROWS_PER_BATCH] for i in range(first_row, len(texts), ROWS_PER_BATCH))


def resolve_files(pattern: str) -> list[Path]:
    """The files a path names: itself, every non-hidden file under a directory, or a glob's matches."""
    expanded = os.path.expanduser(pattern)
    base = Path(expanded)
    if base.is_dir():
        found = [p for p in base.rglob("*") if not any(part.startswith(".") for part in p.relative_to(base).parts)]
    else:
        found = [Path(p) for p in glob.glob(expanded, recursive=True)] if any(c in expanded for c in "*?[") else [base]
    if not (files := sorted(p for p in found if p.is_file())):
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
