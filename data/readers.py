"""Readers: a corpus as a stream of text pieces, in bounded memory, resumable.

Every source kind (text files, JSON Lines, parquet, a datasets table or stream) is read as `Piece`s of at most about
`piece_chars` characters, each marking whether it starts a document and the position a later reader resumes from. A
document is cut only where GPT-2's pre-tokeniser would split anyway (`cut_point`): the tokens never depend on the piece
size. Bytes that are not UTF-8 become U+FFFD, counted; a source that is not UTF-8 text is refused (data/encoding.py).
"""

import codecs
import dataclasses
import itertools
import json
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data.encoding import SAMPLE_BYTES, EncodingCheck
from data.errors import DataError, failing_as, reading

ROWS_PER_BATCH = 1000  # rows read at once from a table

log = logging.getLogger(__name__)

# A cut at index i is exact for GPT-2's pre-tokeniser when text[i] is a space, or text[i-1] a
# newline, between two non-space characters: no pre-token crosses or looks across it (Python's \s
# covers all of Unicode's White_Space, so these cuts are a subset of the exact ones).
_SAFE_CUT = re.compile(r"(?<=\S)(?= \S)|(?<=\S\n)(?=\S)")
# Text without a safe cut for this long (minified, binary-like) is cut anyway, counted from the
# last safe cut: these cuts too never depend on the piece size.
FORCED_CUT_CHARS = 1 << 16
# How surrogateescape spells an undecodable byte (and what a JSON "\\udXXX" escape can leave)
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_READ_BYTES = 1 << 18  # bytes per read from a file


@dataclass(frozen=True)
class Piece:
    text: str
    new_document: bool  # the first piece of a document (an empty document is one empty piece)
    position: dict  # JSON-able: a reader given it starts again with this very piece
    replaced_bytes: int = 0  # bytes of the source that were not UTF-8 and became U+FFFD here
    # Why this document has no text (a row without the column): raised by whoever counts documents,
    # if it gets there (data.max_documents may stop before).
    error: str | None = None


def cut_point(text: str, start: int, limit: int) -> int:
    """Where the piece starting at `start` ends: the last safe cut within `limit` characters,
    else the first one within FORCED_CUT_CHARS, else FORCED_CUT_CHARS on; len(text) if the
    rest fits. `text` must hold FORCED_CUT_CHARS + 2 characters past `start`, or all there is."""
    if len(text) - start <= limit:
        return len(text)
    end, width = start + limit, 256
    while True:  # look back from `end` in growing windows: cuts are usually a few characters apart
        low = max(start + 1, end - width)
        if matches := [m.start() for m in _SAFE_CUT.finditer(text, low, end + 2) if m.start() <= end]:
            return matches[-1]
        if low == start + 1:
            break
        width *= 4
    forced = start + FORCED_CUT_CHARS
    following = _SAFE_CUT.search(text, end + 1, forced + 2)
    return following.start() if following is not None and following.start() <= forced else min(forced, len(text))


def text_pieces(text: str, start: int, limit: int) -> Iterator[tuple[int, str]]:
    """(offset, piece) for an in-memory text from character `start` on (nothing for an empty text)."""
    while start < len(text):
        end = cut_point(text, start, limit)
        yield start, text[start:end]
        start = end


def replace_escaped(text: str) -> tuple[str, int]:
    """`text` with each lone surrogate (an undecodable byte) as U+FFFD, and how many there were."""
    return (text, 0) if text.isascii() else _LONE_SURROGATE.subn("\ufffd", text)


class TextFiles:
    """Each file is one document, or, with a separator, one document per separated part."""

    def __init__(self, files: Sequence[Path], piece_chars: int, separator: str | None = None):
        self.files, self.piece_chars, self.separator = list(files), piece_chars, separator

    def pieces(self, position: dict | None = None) -> Iterator[Piece]:
        at = position or {"file": 0, "byte": 0, "new": True}
        for index in range(at["file"], len(self.files)):
            yield from self._file_pieces(index, at["byte"], at["new"])
            at = {"byte": 0, "new": True}

    def _file_pieces(self, index: int, offset: int, new_document: bool) -> Iterator[Piece]:
        path, decoder = self.files[index], codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
        lookahead = FORCED_CUT_CHARS + 2 + self.piece_chars  # what cut_point may look at
        buffer, start, at_end, replaced_in_file = "", 0, False, 0
        chunks = source_chunks(path, offset)
        while True:
            while not at_end and len(buffer) - start < lookahead:
                chunk = next(chunks, b"")
                at_end = not chunk
                buffer, start = buffer[start:] + decoder.decode(chunk, final=at_end), 0
            if start == len(buffer) and not new_document:
                if replaced_in_file:
                    log.warning("%s: %d bytes are not valid UTF-8; they were decoded as U+FFFD", path, replaced_in_file)
                return
            end = cut_point(buffer, start, self.piece_chars)
            # a separator ends the document (it is skipped, not tokenised)
            found = buffer.find(self.separator, start, end + len(self.separator) - 1) if self.separator else -1
            end, separated = (found, True) if found >= 0 else (end, False)
            text, replaced = replace_escaped(buffer[start:end])
            replaced_in_file += replaced
            yield Piece(text, new_document, {"file": index, "byte": offset, "new": new_document}, replaced)
            offset += len(buffer[start:end].encode("utf-8", "surrogateescape"))  # the bytes it was decoded from
            start, new_document = end, separated
            if separated:
                offset += len(self.separator.encode("utf-8"))
                start += len(self.separator)


class JsonLines:
    """One JSON object per line, its text in `column`; or a JSON array of them (up to JSON_ARRAY_BYTES), read whole."""

    JSON_ARRAY_BYTES = 1 << 28

    def __init__(self, files: Sequence[Path], column: str, piece_chars: int):
        self.files, self.column, self.piece_chars = list(files), column, piece_chars

    def pieces(self, position: dict | None = None) -> Iterator[Piece]:
        at = position or {"file": 0, "byte": 0, "char": 0, "line": 1}
        for index in range(at["file"], len(self.files)):
            start = (at["byte"], at["char"], at["line"], at.get("element", 0))
            yield from checked_texts(self._file_pieces(index, *start), str(self.files[index]))
            at = {"byte": 0, "char": 0, "line": 1}

    def _file_pieces(self, index: int, offset: int, skip_chars: int, line_number: int, first: int) -> Iterator[Piece]:
        path = self.files[index]
        with reading(path), open(path, "rb") as f:
            is_array = f.read(4096).lstrip()[:1] == b"["
        if not is_array:
            for number, (line, line_offset) in enumerate(_lines(path, offset), start=line_number):
                if line.strip():
                    position, where = {"file": index, "byte": line_offset, "line": number}, f"line {number} of {path}"
                    text = lambda: document_text(json_row(line, where), where, self.column)  # noqa: E731
                    yield from row_pieces(text, position, skip_chars if number == line_number else 0, self.piece_chars)
            return
        if path.stat().st_size > self.JSON_ARRAY_BYTES:
            raise DataError(
                f"{path} is one JSON array of {path.stat().st_size:,} bytes, too large to read at once: "
                "convert it to JSON Lines (one object per line), which is read as a stream"
            )
        rows = json_row(b"".join(source_chunks(path, 0)).decode("utf-8", "surrogateescape"), str(path))
        for element in range(first, len(rows)):
            where = f"element {element} of the JSON array in {path}"
            text = lambda: document_text(rows[element], where, self.column)  # noqa: E731
            position = {"file": index, "byte": 0, "line": 1, "element": element}
            yield from row_pieces(text, position, skip_chars if element == first else 0, self.piece_chars)


@dataclass
class Corpus:
    reader: object  # has .pieces(position) -> Iterator[Piece]
    description: str  # for people reading meta.json


def check_column(column: str, columns: list[str]) -> None:
    if column not in columns:
        raise DataError(f"the data has no column {column!r} (it has {columns}); set data.text_column")


class Rows:
    """Documents as rows of a table: a datasets.Dataset, a parquet file's batches, or a list.
    `source(first_row)` yields lists of texts (None for a missing one) from that row on."""

    def __init__(self, source, column: str, origin: str, piece_chars: int):
        self.source, self.column, self.origin, self.piece_chars = source, column, origin, piece_chars

    def pieces(self, position: dict | None = None) -> Iterator[Piece]:
        return checked_texts(self._pieces(position), self.origin)

    def _pieces(self, position: dict | None) -> Iterator[Piece]:
        at = position or {"row": 0, "char": 0}
        for row, text in enumerate(itertools.chain.from_iterable(self.source(at["row"])), start=at["row"]):
            checked = lambda: document_text(text, f"row {row + 1} of {self.origin}", self.column)  # noqa: E731
            yield from row_pieces(checked, {"row": row}, at["char"] if row == at["row"] else 0, self.piece_chars)


class Stream(Rows):
    """Documents as the rows of a datasets.IterableDataset, resumable through its state_dict.
    `source()` returns the stream afresh, its rows dicts with a "text" entry."""

    STATE_EVERY = 1000  # rows between the stream states a position refers to

    def _pieces(self, position: dict | None) -> Iterator[Piece]:
        at = position or {"state": None, "since": 0, "row": 0, "char": 0}
        stream = self.source()
        if at["state"] is not None:
            stream.load_state_dict(at["state"])
        state, row, skip_chars = at["state"], at["row"] - at["since"], at["char"]
        for texts in _batches_of(stream, self.STATE_EVERY, self.origin):
            for since, text in enumerate(texts[at["since"] :], start=at["since"]):
                checked = lambda: document_text(text, f"row {row + since + 1} of {self.origin}", self.column)  # noqa: E731
                position = {"state": state, "since": since, "row": row + since}
                yield from row_pieces(checked, position, skip_chars, self.piece_chars)
                skip_chars = 0
            at = {"since": 0}
            state, row = stream.state_dict(), row + len(texts)  # after this batch: before the next one


class Chain:
    def __init__(self, parts: Sequence):
        self.parts = list(parts)

    def pieces(self, position: dict | None = None) -> Iterator[Piece]:
        at = position or {"part": 0, "at": None}
        for index in range(at["part"], len(self.parts)):
            for piece in self.parts[index].pieces(at["at"] if index == at["part"] else None):
                yield dataclasses.replace(piece, position={"part": index, "at": piece.position})


def row_pieces(row_text: Callable[[], str], position: dict, skip_chars: int, piece_chars: int) -> Iterator[Piece]:
    """One document held in memory (a row), as pieces; its position gains each piece's "char".
    `row_text()` gives its text, or raises the DataError that the piece then carries."""
    error = None
    try:
        clean, replaced = replace_escaped(row_text())
    except DataError as err:
        clean, error = "", str(err)
    if not clean:
        yield Piece("", True, {**position, "char": 0}, error=error)
        return
    for offset, piece in text_pieces(clean, skip_chars, piece_chars):
        yield Piece(piece, offset == 0, {**position, "char": offset}, replaced if offset == 0 else 0)


def document_text(row: Any, where: str, column: str) -> str:
    """The text of a row (a dict, or the text itself); DataError naming the row when there is none."""
    text = row.get(column) if isinstance(row, dict) else row
    if not isinstance(text, str):
        fields = f" (its fields: {list(row)})" if isinstance(row, dict) and column not in row else ""
        raise DataError(
            f"{where} has no {column!r} text{fields}: null, missing or not a string; "
            "fix the row or set data.text_column"
        )
    return text


def json_row(line: str, where: str) -> Any:
    try:
        return json.loads(line)
    except ValueError as err:
        raise DataError(
            f"{where} is not valid JSON ({err}): each line must be one JSON object (JSON Lines), "
            "or the whole file one JSON array"
        ) from err


def _lines(path: Path, offset: int) -> Iterator[tuple[str, int]]:
    """(line, its byte offset) from `offset` on, decoded with undecodable bytes kept as surrogates."""
    rest = b""
    for chunk in source_chunks(path, offset):
        *lines, rest = (rest + chunk).split(b"\n")
        for line in lines:
            yield line.decode("utf-8", "surrogateescape"), offset
            offset += len(line) + 1
    if rest:
        yield rest.decode("utf-8", "surrogateescape"), offset


def _batches_of(stream, rows: int, origin: str) -> Iterator[list]:
    """The stream's texts, `rows` at a time; a failure reading it (network, bad file) is a DataError."""
    batches = stream.iter(batch_size=rows)
    while True:
        with failing_as(f"reading {origin} through datasets failed"):
            if (batch := next(batches, None)) is None:
                return
        yield batch["text"]


def check_utf8(path: Path) -> None:
    """Refuse a file that is not UTF-8 text by its first SAMPLE_BYTES, before any work."""
    with reading(path), open(path, "rb") as f:
        head = f.read(SAMPLE_BYTES)
    check = EncodingCheck(str(path), path)
    check.add(head, 0)
    check.finish()


def source_chunks(path: Path, offset: int) -> Iterator[bytes]:
    """The file's bytes from `offset` on, a read at a time, each checked as UTF-8 text before it is yielded."""
    check = EncodingCheck(str(path), path)
    with reading(path), open(path, "rb") as f:
        f.seek(offset)
        while chunk := f.read(_READ_BYTES):
            check.add(chunk, offset)
            offset += len(chunk)
            yield chunk
    check.finish()


def checked_texts(pieces: Iterator[Piece], origin: str) -> Iterator[Piece]:
    """Pieces of rows, their texts checked as UTF-8 bytes aligned at each document's start."""
    check, offset = EncodingCheck(origin), 0
    for piece in pieces:
        data, offset = piece.text.encode("utf-8"), 0 if piece.new_document else offset
        check.add(data, offset)
        offset += len(data)
        yield piece
    check.finish()
