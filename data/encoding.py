"""Is a source UTF-8 text? Judged from all of it as it is read, and named when it is not.

Other encodings do not fail to decode as UTF-8 (UTF-16/32 become NULs and control characters, Shift-JIS mostly U+FFFD),
so each file (each table's texts) is refused once too much of what was read is not text: after its first SAMPLE_BYTES,
every later read and its end, before its tokens reach finished shards. The refusal names what it can tell: a byte-order
mark, a compressor's magic bytes, or a sample decoding as UTF-16/32 into readable text with spaces or line breaks.
"""

import codecs
from pathlib import Path

from data.errors import DataError

SAMPLE_BYTES = 4096  # read before the first judgement; the sample an encoding is recognised in
CONTROL_SHARE = 0.1  # refused at this share of control bytes (NUL and the like; not tab or line breaks)
NOT_TEXT_SHARE = 0.25  # or at this share of control bytes and bytes that are not UTF-8
SUSPECT_SHARE = 0.05  # a read this far from clean text is tried as UTF-16 and UTF-32
SUSPECT_MIN_BYTES = 256  # ... when it holds this much: a few NULs in a short text name nothing

_CONTROLS = bytes([*range(0x09), *range(0x0E, 0x20), 0x7F])  # tab, line breaks, \v and \f are text
_NOT_CONTROLS = bytes(b for b in range(256) if b not in _CONTROLS)  # deleted to count the controls
# iconv's names; UTF-32-LE's mark begins with UTF-16-LE's, so it comes first
_MARKS = [(getattr(codecs, f"BOM_UTF{bits}_{order}"), f"UTF-{bits}") for bits in (32, 16) for order in ("LE", "BE")]
# each tool's decompressing command is `<name> -dc`
_COMPRESSED = ((b"\x1f\x8b", "gzip"), (b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"BZh", "bzip2"))
_WIDE = (("UTF-32LE", 4), ("UTF-32BE", 4), ("UTF-16LE", 2), ("UTF-16BE", 2))  # encoding, bytes per code unit
_SPACES = frozenset(" \t\n\u3000\u3001\u3002\uff0c")  # ASCII and CJK spaces and separators


class EncodingCheck:
    """Watches one source's bytes as read; `add` and `finish` raise DataError when it is not UTF-8 text.
    `path`: the file's (the advice converts it), or None for the texts of a table, named by `origin`."""

    def __init__(self, origin: str, path: Path | None = None):
        self.origin, self.path = origin, path
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.read = self.controls = self.invalid = 0  # bytes so far, and those not text
        self.start: int | None = None  # the offset of the first byte read (a resumed read starts past 0)
        self.sample, self.sample_at = b"", 0  # the last SAMPLE_BYTES of the latest read, and its offset

    def add(self, data: bytes, offset: int) -> None:
        """`data`, read at `offset`: from the file's start, or for a table from its document's (aligning UTF-16/32)."""
        if not data:
            return
        self.start = offset if self.start is None else self.start
        if offset == 0 and self.path is not None:
            self._check_start(data)
        controls, invalid = len(data.translate(None, _NOT_CONTROLS)), self.decoder.decode(data).count("\ufffd")
        self.read, self.controls, self.invalid = self.read + len(data), self.controls + controls, self.invalid + invalid
        self.sample, self.sample_at = data[-SAMPLE_BYTES:], offset + max(0, len(data) - SAMPLE_BYTES)
        if len(data) >= SUSPECT_MIN_BYTES and controls + invalid >= SUSPECT_SHARE * len(data):
            if (encoding := wide_encoding(self.sample, self.sample_at)) is not None:
                raise self._wide(encoding)
        if self.read >= SAMPLE_BYTES:
            self._judge()

    def finish(self) -> None:
        """The end of the source: judged on all of it, however short."""
        self.invalid += self.decoder.decode(b"", final=True).count("\ufffd")
        if self.read:
            self._judge()

    def _judge(self) -> None:
        if self.controls < CONTROL_SHARE * self.read and self.controls + self.invalid < NOT_TEXT_SHARE * self.read:
            return
        raise self._wide(encoding) if (encoding := wide_encoding(self.sample, self.sample_at)) else self._not_text()

    def _check_start(self, head: bytes) -> None:
        if (mark := next((name for bom, name in _MARKS if head.startswith(bom)), None)) is not None:
            raise self._wide(mark, f"it starts with a {mark} byte-order mark")
        tool = next((name for magic, name in _COMPRESSED if head.startswith(magic)), None)
        if tool is not None and (tool != "bzip2" or head[4:10] == b"1AY&SY"):  # "BZh" alone could be text
            suffix = self.path.suffix.lower() in (".gz", ".xz", ".zst", ".bz2")  # the decompressed copy's name
            plain = self.path.stem if suffix else f"{self.path.name}.txt"
            raise DataError(
                f"{self.path} is {tool}-compressed, and gptlab reads text: decompress it, e.g. "
                f"`{tool} -dc {self.path} > {plain}`, and point data.path at the result"
            )

    def _wide(self, encoding: str, evidence: str | None = None) -> DataError:
        first, last = self.sample_at, self.sample_at + len(self.sample) - 1
        if self.path is None:
            return DataError(
                f"the texts of {self.origin} are {encoding} read as if UTF-8 (the last one read decodes "
                f"as {encoding} text): decode them as {encoding} where they are written"
            )
        if first == 0:
            evidence = evidence or f"its first {last + 1:,} bytes decode as {encoding} text"
            return DataError(
                f"{self.path} is {encoding} text ({evidence}), and gptlab reads UTF-8: convert it, e.g. "
                f"`iconv -f {encoding} -t UTF-8 {self.path} > {self.path.stem}.utf8{self.path.suffix}`, "
                "and point data.path at the result"
            )
        return DataError(
            f"{self.path} is not UTF-8 throughout: its bytes {first:,} to {last:,} decode as {encoding} "
            f"text, and gptlab reads UTF-8: convert that text to UTF-8 (`iconv -f {encoding} -t UTF-8` "
            "converts it) and point data.path at the result"
        )

    def _not_text(self) -> DataError:
        read = f"{self.read:,}"
        span = f"its first {read} bytes" if self.start == 0 else f"its {read} bytes from byte {self.start:,} on"
        span = f"the {read} bytes of them read" if self.path is None else span
        if self.controls >= CONTROL_SHARE * self.read:
            found = f"{self.controls:,} of {span} are NUL or other control characters"
            if self.path is None:
                return DataError(f"the texts of {self.origin} are not text: {found}; fix them where they are written")
            return DataError(f"{self.path} is not text: {found}; point data.path at UTF-8 text files")
        found = f"{self.controls + self.invalid:,} of {span} are not UTF-8 or are control characters"
        if self.path is None:
            return DataError(
                f"the texts of {self.origin} are not UTF-8 text: {found}; decode them from their real "
                "encoding where they are written"
            )
        return DataError(
            f"{self.path} is not UTF-8 text: {found}; find its encoding (`file {self.path}` may name it) and convert "
            f"it, e.g. `iconv -f SHIFT_JIS -t UTF-8 {self.path} > {self.path.stem}.utf8{self.path.suffix}` for "
            "Shift-JIS, and point data.path at the result (or leave the file out if it is not text)"
        )


def wide_encoding(sample: bytes, offset: int) -> str | None:
    """The UTF-32 or UTF-16, if any, whose readable text `sample` is (read at `offset`, which aligns its code units)."""
    for encoding, unit in _WIDE:
        try:  # the incremental decoder holds back a code unit (or surrogate pair) cut at the end
            text = codecs.getincrementaldecoder(encoding)().decode(sample[-offset % unit :])
        except UnicodeDecodeError:
            continue
        readable = sum(c.isprintable() or c in "\t\n\r" for c in text)
        if text and readable >= 0.95 * len(text) and not _SPACES.isdisjoint(text):
            return encoding
    return None
