"""Sources that are not UTF-8 text are refused, each naming what it found where it can
tell, judged on all of the source and not only its start: UTF-16 and UTF-32 (with or
without a byte-order mark, in text files, JSON Lines and parquet texts), a file that
turns into UTF-16 part-way, compressed files, random bytes, Shift-JIS. UTF-8 text of
any script passes, with its few undecodable bytes counted."""

import bz2
import gzip
import json
import lzma
import random
import re
import shutil
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from data import DataConfig, DataError, prepare
from data.encoding import SAMPLE_BYTES
from data.readers import check_utf8

TEXT = "It was the best of times, it was the worst of times, it was the age of wisdom.\n" * 20
CHINESE = "我们的生活充满了希望和挑战，每一天都是新的开始。学习使人进步，骄傲使人落后。\n" * 20
RUSSIAN = "Привет, мир! Это пример русского текста для проверки кодировки.\n" * 20
RUSSIAN_WORDS = ("приветмирэтопримеррусскоготекста" * 3 + "\n") * 20  # in UTF-16, few NULs: control bytes tell
JAPANESE = "吾輩は猫である。名前はまだ無い。どこで生れたかとんと見当がつかぬ。\n" * 40


def files_config(tmp_path, path: Path, tokenizer="char") -> DataConfig:
    return DataConfig(
        name="t",
        source="files",
        path=str(path),
        tokenizer=tokenizer,
        data_dir=str(tmp_path / "data"),
        hf_cache_dir=str(tmp_path / "hf"),
        num_proc=1,
    )


def refusal(tmp_path, path: Path, tokenizer="char") -> str:
    """prepare's error for `path`; nothing of the prepared data is left behind."""
    with pytest.raises(DataError) as refused:
        prepare(files_config(tmp_path, path, tokenizer))
    assert sorted(p.name for p in (tmp_path / "data").iterdir() if not p.name.startswith(".")) == []
    return str(refused.value)


def run_advice(message: str, tmp_path: Path, tool: str, result: Path, expected: str) -> None:
    """The command the error advises (between backticks) turns the file into the text."""
    if shutil.which(tool):
        subprocess.run(re.search(r"`([^`]+ > [^`]+)`", message).group(1), shell=True, cwd=tmp_path, check=True)
        assert result.read_text(encoding="utf-8") == expected


WIDE_ENCODINGS = {  # Python's codec: the name iconv knows it by, as the error gives it
    "utf-16": "UTF-16",
    "utf-16-le": "UTF-16LE",
    "utf-16-be": "UTF-16BE",
    "utf-32": "UTF-32",
    "utf-32-le": "UTF-32LE",
    "utf-32-be": "UTF-32BE",
}


WIDE_CASES = [("english", TEXT, codec) for codec in WIDE_ENCODINGS] + [  # other scripts without byte-order marks
    (name, text, codec)
    for name, text in [("chinese", CHINESE), ("russian", RUSSIAN), ("russian_words", RUSSIAN_WORDS)]
    for codec in ("utf-16-le", "utf-16-be", "utf-32-le")
]


@pytest.mark.parametrize("name, text, codec", WIDE_CASES, ids=[f"{name}-{codec}" for name, _, codec in WIDE_CASES])
def test_text_in_utf16_or_utf32_is_refused_naming_the_encoding_and_the_conversion(tmp_path, name, text, codec):
    """Read as UTF-8, it would 'prepare' into NULs, control characters and U+FFFD."""
    path = tmp_path / "book.txt"
    path.write_text(text, encoding=codec)  # with a byte-order mark for utf-16 and utf-32 only
    message = refusal(tmp_path, path)
    assert message.startswith(f"{path} is {WIDE_ENCODINGS[codec]} text (")
    run_advice(message, tmp_path, "iconv", tmp_path / "book.utf8.txt", text)


def test_a_short_file_is_judged_at_its_end(tmp_path):
    """Under one sample and too short to be tried as UTF-16 on the way: the end decides."""
    path = tmp_path / "short.txt"
    path.write_bytes("Привет, мир!\n".encode("utf-16-le"))
    assert refusal(tmp_path, path).startswith(f"{path} is UTF-16LE text (its first 26 bytes decode as UTF-16LE")


def test_a_file_that_turns_into_utf16_part_way_is_refused_before_its_shards_are_finished(tmp_path):
    """Its first sample is clean UTF-8: only reading on finds the rest (which would be 45% NUL tokens)."""
    path = tmp_path / "mixed.txt"
    head = (TEXT * 3).encode()[:SAMPLE_BYTES]
    path.write_bytes(head + (TEXT * 40).encode("utf-16-le"))
    check_utf8(path)  # the first sample passes
    message = refusal(tmp_path, path, tokenizer="gpt2")  # refused while tokenising, not when training a vocabulary
    assert re.match(
        rf"{path} is not UTF-8 throughout: its bytes [\d,]+ to [\d,]+ decode as UTF-16LE text, and gptlab "
        r"reads UTF-8: convert that text to UTF-8 \(`iconv -f UTF-16LE -t UTF-8` converts it\)",
        message,
    )


def test_utf16_far_into_a_file_is_found(tmp_path):
    """UTF-8 for two reads of 256 KiB, then a UTF-16 tail of 5% of the file."""
    path = tmp_path / "tail.txt"
    path.write_bytes((TEXT * 400).encode() + (TEXT * 10).encode("utf-16-le"))
    size = path.stat().st_size  # the sample named is the last SAMPLE_BYTES read
    assert refusal(tmp_path, path).startswith(
        f"{path} is not UTF-8 throughout: its bytes {size - SAMPLE_BYTES:,} to {size - 1:,} decode as UTF-16LE text"
    )


@pytest.mark.parametrize("codec", ["utf-16-le", "utf-16-be", "utf-32"])
def test_json_lines_in_utf16_or_utf32_are_refused(tmp_path, codec):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"text": line}) + "\n" for line in CHINESE.splitlines()), encoding=codec)
    assert refusal(tmp_path, path).startswith(f"{path} is {WIDE_ENCODINGS[codec]} text (")


def test_json_lines_that_turn_into_utf16_are_named_not_called_bad_json(tmp_path):
    path = tmp_path / "rows.jsonl"
    lines = [json.dumps({"text": line}) + "\n" for line in TEXT.splitlines()] * 3
    path.write_bytes("".join(lines).encode() + "".join(lines * 20).encode("utf-16-le"))
    assert "decode as UTF-16LE text" in refusal(tmp_path, path)


def test_json_texts_escaped_from_utf16_are_refused(tmp_path):
    """Clean ASCII on disk, but each text is UTF-16 bytes read as one character each ("\\u0000")."""
    path = tmp_path / "rows.jsonl"
    path.write_text(
        "".join(json.dumps({"text": line.encode("utf-16-le").decode("latin-1")}) + "\n" for line in TEXT.splitlines())
    )
    assert refusal(tmp_path, path).startswith(f"the texts of {path} are UTF-16LE read as if UTF-8 (")


@pytest.mark.parametrize("codec", ["utf-16-le", "utf-32-be"])
def test_parquet_texts_in_utf16_or_utf32_are_refused(tmp_path, codec):
    """Bytes stored as a string column unconverted: valid UTF-8 (ASCII and NULs), but not the text."""
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"text": [line.encode(codec).decode("utf-8") for line in TEXT.splitlines()]}), path)
    encoding = codec.upper().replace("-LE", "LE").replace("-BE", "BE")
    assert refusal(tmp_path, path) == (
        f"the texts of {path} are {encoding} read as if UTF-8 (the last one read "
        f"decodes as {encoding} text): decode them as {encoding} where they are written"
    )


def test_parquet_texts_of_replacement_characters_are_refused(tmp_path):
    path = tmp_path / "rows.parquet"
    texts = [line.encode("shift_jis").decode("utf-8", "replace") for line in JAPANESE.splitlines()]
    pq.write_table(pa.table({"text": texts}), path)
    assert re.match(
        rf"the texts of {path} are not UTF-8 text: [\d,]+ of the [\d,]+ bytes of them read are not UTF-8 "
        "or are control characters; decode them from their real encoding",
        refusal(tmp_path, path),
    )


COMPRESSORS = {"gzip": (".gz", gzip.compress), "bzip2": (".bz2", bz2.compress), "xz": (".xz", lzma.compress)}


@pytest.mark.parametrize("tool", sorted(COMPRESSORS))
def test_a_compressed_file_is_named_with_how_to_decompress_it(tmp_path, tool):
    suffix, compress = COMPRESSORS[tool]
    path = tmp_path / f"book.txt{suffix}"
    path.write_bytes(compress(TEXT.encode()))
    message = refusal(tmp_path, path)
    assert message == (
        f"{path} is {tool}-compressed, and gptlab reads text: decompress it, e.g. `{tool} -dc {path} > "
        "book.txt`, and point data.path at the result"
    )
    run_advice(message, tmp_path, tool, tmp_path / "book.txt", TEXT)


def test_text_that_starts_like_bzip2s_magic_is_read_as_text(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("BZh9 is how a bzip2 file starts; this file is only about it.\n" * 20)
    prepare(files_config(tmp_path, path, "char"))  # prepared, not refused as compressed


def test_shift_jis_is_refused_as_not_utf8_with_a_conversion(tmp_path):
    path = tmp_path / "neko.txt"
    path.write_bytes(JAPANESE.encode("shift_jis"))
    message = refusal(tmp_path, path)
    assert re.match(
        rf"{path} is not UTF-8 text: [\d,]+ of its first [\d,]+ bytes are not UTF-8 or are control "
        rf"characters; find its encoding \(`file {path}` may name it\)",
        message,
    )
    run_advice(message, tmp_path, "iconv", tmp_path / "neko.utf8.txt", JAPANESE)


QUIET_AUDIO = bytes(b for sample in random.Random(0).randbytes(5000) for b in (sample, 0))  # 16-bit samples, < 256


@pytest.mark.parametrize(
    "content", [random.Random(0).randbytes(20_000), bytes(1000), QUIET_AUDIO], ids=["random", "nul", "audio"]
)
def test_binary_files_are_refused_as_not_text(tmp_path, content):
    """Not named as UTF-16 even where they decode as such (the audio): they do not read as text."""
    path = tmp_path / "blob.txt"
    path.write_bytes(content)
    assert re.match(
        rf"{path} is not text: [\d,]+ of its first [\d,]+ bytes are NUL or other control characters; "
        "point data.path at UTF-8 text files$",
        refusal(tmp_path, path),
    )


def test_utf8_with_a_few_bad_bytes_and_nuls_prepares(tmp_path):
    """Many reads of mixed scripts, a stray Latin-1 byte and a NUL in each line: text, counted."""
    path = tmp_path / "ok.txt"
    line = "Grüße, мир, 世界, κόσμε, naïve\t\f\n".encode() + b"caf\xe9\x00 ok\n"
    path.write_bytes(line * 8000)  # about 2 reads of 256 KiB
    prepared = prepare(files_config(tmp_path, path))
    assert prepared.meta["replaced_bytes"] == 8000


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    text=st.text(st.characters(blacklist_categories=["Cs", "Cc"]), min_size=30, max_size=300), nuls=st.integers(0, 2)
)
def test_utf8_text_of_any_script_is_never_mistaken_for_a_wider_encoding(tmp_path_factory, text, nuls):
    """NUL is a legal UTF-8 character: a few are text; only a large share is not (nor of
    other control characters, left out here)."""
    path = tmp_path_factory.mktemp("utf8") / "any.txt"
    path.write_text(text[:15] + "\0" * nuls + text[15:], encoding="utf-8")
    check_utf8(path)
