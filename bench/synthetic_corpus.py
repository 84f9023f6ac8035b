"""The benchmark's corpus: real, varied text from the running Python, in every layout prepare reads.

A pool of documents, the standard library's .py files (site-packages and test
directories skipped) and its pydoc topic texts, is drawn from by a seeded stream until
it holds the asked number of bytes of UTF-8 text; each copy gets a first line
`# copy <n> of <name>` and, every other copy on average, its lines rotated by a random
offset, so the corpus never repeats itself literally. The stream is written in one pass,
never held in memory, in each layout asked for (text-file, text-dir, jsonl, parquet, and
hub-dir: links to the parquet files, read as a streamed Hub dataset). Corpora are cached
with the parameters that made them (manifest.json) and reused while those match.
"""

from __future__ import annotations

import array
import itertools
import json
import os
import platform
import random
import shutil
import sysconfig
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

KINDS = ("text-file", "text-dir", "jsonl", "parquet", "hub-dir")
GB = 10**9
SEED = 20240601
GENERATOR_VERSION = 2  # bump when the stream or a layout changes: cached corpora are then rebuilt
TEXT_DIR_FILES = 2000
PARQUET_FILES = 8
PARQUET_ROW_GROUP = 10_000  # rows
ARROW_CHUNK = 1000  # documents turned into one arrow array at a time while a row group fills
SKIPPED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


# --- the document pool and the stream drawn from it ------------------------------------


@dataclass(frozen=True)
class PoolDocument:
    name: str
    text: str  # ends with "\n", so rotating its lines keeps its length
    nbytes: int  # UTF-8 bytes of text


def load_pool() -> list[PoolDocument]:
    """The standard library's .py files (tests and site-packages skipped) and the pydoc topics."""
    from pydoc_data.topics import topics

    root = Path(sysconfig.get_paths()["stdlib"])
    pool = []
    for directory, subdirectories, names in os.walk(root):
        subdirectories[:] = sorted(d for d in subdirectories if d not in SKIPPED_DIRS)
        for name in sorted(n for n in names if n.endswith(".py")):
            path = Path(directory, name)
            relative = path.relative_to(root).as_posix()
            if relative != "pydoc_data/topics.py":  # its texts come in as the topics below
                pool.append(_pool_document(relative, path.read_text(encoding="utf-8", errors="replace")))
    pool += [_pool_document(f"pydoc topic {key}", topics[key]) for key in sorted(topics)]
    return [doc for doc in pool if doc.text.strip()]


def _pool_document(name: str, text: str) -> PoolDocument:
    text = text if text.endswith("\n") else text + "\n"
    return PoolDocument(name, text, len(text.encode("utf-8")))


def document_stream(pool: list[PoolDocument], total_bytes: int, seed: int = SEED) -> Iterator[str]:
    """Varied copies of pool documents, drawn with a seeded generator, until `total_bytes` of text."""
    rng = random.Random(seed)
    written = 0
    copy = 0
    while written < total_bytes:
        source = pool[rng.randrange(len(pool))]
        text = _varied_copy(rng, copy, source)
        written += source.nbytes + len(text) - len(source.text)  # the added line is ASCII
        copy += 1
        yield text


def _varied_copy(rng: random.Random, copy: int, source: PoolDocument) -> str:
    text = source.text
    if rng.random() < 0.5:
        lines = text[:-1].split("\n")  # text ends with "\n": the same length and ending once rotated
        if len(lines) > 1:
            offset = rng.randrange(1, len(lines))
            text = "\n".join(lines[offset:] + lines[:offset]) + "\n"
    return f"# copy {copy} of {source.name}\n{text}"


# --- layouts: one writer per kind, all fed the same stream ------------------------------


class OneFileLayout:
    """One file: corpus.txt, documents joined by a blank line (one document to prepare), or
    corpus.jsonl, one {"text": ...} object per line and per document."""

    def __init__(self, directory: Path, total_bytes: int, suffix: str):
        self.path = directory / f"corpus.{suffix}"
        self.out = open(self.path, "wb", buffering=1 << 20)
        self.jsonl, self.copies = suffix == "jsonl", 0

    def write(self, text: str) -> None:
        if self.jsonl:
            self.out.write(json.dumps({"text": text}, ensure_ascii=False).encode("utf-8") + b"\n")
        else:
            self.out.write((b"\n" if self.copies else b"") + text.encode("utf-8"))
        self.copies += 1

    def close(self) -> dict:
        self.out.close()
        documents = self.copies if self.jsonl else 1
        return {"path": self.path.name, "files": 1, "documents": documents, "pool_copies": self.copies}


class TextDirLayout:
    """Up to TEXT_DIR_FILES .txt files of about equal size, each a run of consecutive documents:
    file k ends with the document that takes the bytes written past k shares of the total."""

    def __init__(self, directory: Path, total_bytes: int):
        self.directory = directory
        self.share = max(1, total_bytes / TEXT_DIR_FILES)
        self.out = None
        self.files = self.in_file = self.written = self.copies = 0

    def write(self, text: str) -> None:
        if self.out is None or (self.written >= self.files * self.share and self.files < TEXT_DIR_FILES):
            self._next_file()
        data = (b"\n" if self.in_file else b"") + text.encode("utf-8")
        self.out.write(data)
        self.written += len(data)
        self.in_file += 1
        self.copies += 1

    def _next_file(self) -> None:
        if self.out is not None:
            self.out.close()
        self.out = open(self.directory / f"{self.files:05d}.txt", "wb", buffering=1 << 20)
        self.files += 1
        self.in_file = 0

    def close(self) -> dict:
        if self.out is not None:
            self.out.close()
        return {"path": ".", "files": self.files, "documents": self.files, "pool_copies": self.copies}


class ParquetLayout:
    """PARQUET_FILES files of about equal size, column `text`, row groups of PARQUET_ROW_GROUP rows."""

    def __init__(self, directory: Path, total_bytes: int):
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.pa, self.pq = pa, pq
        self.directory, self.share = directory, max(1, total_bytes / PARQUET_FILES)
        self.schema = pa.schema([("text", pa.string())])
        self.writer = None
        self.files = self.written = self.documents = 0
        self.pending: list[str] = []  # documents not yet in an arrow chunk
        self.chunks: list = []  # arrow arrays of the row group being filled

    def write(self, text: str) -> None:
        if self.writer is None or (self.written >= self.files * self.share and self.files < PARQUET_FILES):
            self._next_file()
        self.pending.append(text)
        self.written += len(text)
        self.documents += 1
        if len(self.pending) == ARROW_CHUNK:
            self.chunks.append(self._string_array(self.pending))
            self.pending = []
        if len(self.chunks) * ARROW_CHUNK == PARQUET_ROW_GROUP:
            self._flush_row_group()

    def _flush_row_group(self) -> None:
        if self.pending:
            self.chunks.append(self._string_array(self.pending))
            self.pending = []
        if self.chunks:
            table = self.pa.Table.from_arrays(
                [self.pa.chunked_array(self.chunks, self.pa.string())], schema=self.schema
            )
            self.writer.write_table(table, row_group_size=PARQUET_ROW_GROUP)
            self.chunks = []
            del table
            self.pa.default_memory_pool().release_unused()  # else mimalloc keeps a row group's worth

    def _string_array(self, texts: list[str]) -> object:
        """An arrow string array over exactly-sized buffers (pa.array's growing buffers would
        leave the allocator holding about twice a row group)."""
        encoded = [text.encode("utf-8") for text in texts]
        offsets = array.array("i", [0, *itertools.accumulate(map(len, encoded))])
        data = b"".join(encoded)
        return self.pa.StringArray.from_buffers(len(encoded), self.pa.py_buffer(offsets), self.pa.py_buffer(data))

    def _next_file(self) -> None:
        if self.writer is not None:
            self._flush_row_group()
            self.writer.close()
        path = self.directory / f"part-{self.files:03d}.parquet"
        self.writer = self.pq.ParquetWriter(path, self.schema, compression="snappy", use_dictionary=False)
        self.files += 1

    def close(self) -> dict:
        if self.writer is not None:
            self._flush_row_group()
            self.writer.close()
        return {"path": ".", "files": self.files, "documents": self.documents, "pool_copies": self.documents}


LAYOUTS = {
    "text-file": partial(OneFileLayout, suffix="txt"),
    "text-dir": TextDirLayout,
    "jsonl": partial(OneFileLayout, suffix="jsonl"),
    "parquet": ParquetLayout,
}


# --- generating and caching the corpora -------------------------------------------------


def generation_params(gb: float) -> dict:
    """What decides the corpora's content: a cached corpus is reused only when these match."""
    return {
        "generator": GENERATOR_VERSION,
        "gb": gb,
        "seed": SEED,
        "python": platform.python_version(),
        "stdlib": sysconfig.get_paths()["stdlib"],
        "text_dir_files": TEXT_DIR_FILES,
        "parquet_files": PARQUET_FILES,
        "parquet_row_group": PARQUET_ROW_GROUP,
    }


def prepare_corpora(corpus_dir: Path, gb: float, kinds: list[str], pool: list[PoolDocument]) -> dict:
    """{kind: manifest entry} for `kinds`, generating those that corpus_dir does not hold yet."""
    manifest_path = corpus_dir / "manifest.json"
    params = generation_params(gb)
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else None
    if manifest is None or manifest.get("params") != params:
        shutil.rmtree(corpus_dir, ignore_errors=True)
        manifest = {"params": params, "kinds": {}}
    needed = [k for k in kinds if k != "hub-dir"] + (["parquet"] if "hub-dir" in kinds else [])
    missing = sorted({k for k in needed if k not in manifest["kinds"]}, key=KINDS.index)
    if missing:
        start = time.perf_counter()
        manifest["kinds"].update(write_layouts(corpus_dir, missing, int(gb * GB), pool))
        print(f"generated {', '.join(missing)} ({gb:g} GB each) in {time.perf_counter() - start:.1f} s", flush=True)
    if "hub-dir" in kinds and "hub-dir" not in manifest["kinds"]:
        manifest["kinds"]["hub-dir"] = link_hub_dir(corpus_dir, manifest["kinds"]["parquet"])
    corpus_dir.mkdir(parents=True, exist_ok=True)
    temp = manifest_path.with_suffix(".tmp")
    temp.write_text(json.dumps(manifest, indent=2))
    os.replace(temp, manifest_path)
    return {kind: manifest["kinds"][kind] for kind in kinds}


def write_layouts(corpus_dir: Path, kinds: list[str], total_bytes: int, pool: list[PoolDocument]) -> dict:
    """One pass over the stream, written in every layout of `kinds`; their manifest entries."""
    writers = {}
    for kind in kinds:
        directory = corpus_dir / kind
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        writers[kind] = LAYOUTS[kind](directory, total_bytes)
    text_bytes = 0
    for text in document_stream(pool, total_bytes):
        text_bytes += len(text.encode("utf-8"))
        for writer in writers.values():
            writer.write(text)
    entries = {}
    for kind, writer in writers.items():
        entry = writer.close()
        entry.update(text_bytes=text_bytes, file_bytes=tree_file_bytes(corpus_dir / kind))
        entries[kind] = entry
    return entries


def link_hub_dir(corpus_dir: Path, parquet_entry: dict) -> dict:
    """hub-dir/: relative links to the parquet layout's files, so both read the same bytes."""
    directory = corpus_dir / "hub-dir"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    for target in sorted((corpus_dir / "parquet").glob("*.parquet")):
        (directory / target.name).symlink_to(Path("..", "parquet", target.name))
    return dict(parquet_entry, path=".")


def corpus_path(corpus_dir: Path, kind: str, entry: dict) -> Path:
    return (corpus_dir / kind / entry["path"]).resolve() if entry["path"] != "." else corpus_dir / kind


def tree_file_bytes(path: Path) -> int:
    """Apparent size of the files under `path` (links followed), or of `path` itself."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
