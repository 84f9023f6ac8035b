"""Faults the data side must catch: damaged shards and meta.json, ids outside the
vocabulary, rows without text, killed prepare runs, and overrides read unlike train.py."""

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

import data.cli
from conf import CONF_DIR, load_config
from data import BatchLoader, DataConfig, DataError, load_tokenizer, prepare

REPO = Path(__file__).resolve().parents[1]
TEXT = "It was the best of times, it was the worst of times, it was the age of wisdom.\n" * 20


def char_config(tmp_path) -> DataConfig:
    (tmp_path / "book.txt").write_text(TEXT)
    return DataConfig(name="t", source="files", path=str(tmp_path / "book.txt"), tokenizer="char",
                      data_dir=str(tmp_path / "data"), hf_cache_dir=str(tmp_path / "hf"), num_proc=1)


def test_shard_checksums_are_recorded(tmp_path):
    prepared = prepare(char_config(tmp_path))
    for split in ("train", "val"):
        assert prepared.meta["sha256"][split] == hashlib.sha256(prepared.shard(split).read_bytes()).hexdigest()


def test_a_zeroed_shard_is_detected_and_rebuilt(tmp_path, caplog):
    cfg = char_config(tmp_path)
    first = prepare(cfg)
    original = first.shard("train").read_bytes()
    first.shard("train").write_bytes(bytes(len(original)))  # the right size, the wrong content
    with caplog.at_level(logging.WARNING):
        again = prepare(cfg)
    assert not again.reused and again.shard("train").read_bytes() == original
    assert f"{first.shard('train')} does not match the sha256 meta.json recorded: rebuilding" in caplog.text


def test_verify_size_trusts_a_shard_of_the_right_size(tmp_path):
    """verify=size skips content hashing (for huge corpora): a zeroed shard goes unnoticed, as documented."""
    cfg = char_config(tmp_path)
    first = prepare(cfg)
    zeros = bytes(first.shard("train").stat().st_size)
    first.shard("train").write_bytes(zeros)
    again = prepare(dataclasses.replace(cfg, verify="size"))
    assert again.reused and again.shard("train").read_bytes() == zeros


def reverse_chars(data_dir: Path) -> None:
    meta = json.loads((data_dir / "meta.json").read_text())
    meta["tokenizer"]["chars"] = meta["tokenizer"]["chars"][::-1]
    (data_dir / "meta.json").write_text(json.dumps(meta))


def test_a_hand_edited_meta_json_is_rebuilt_by_prepare(tmp_path, caplog):
    cfg = char_config(tmp_path)
    first = prepare(cfg)
    reverse_chars(first.data_dir)
    with caplog.at_level(logging.WARNING):
        again = prepare(cfg)
    assert not again.reused and again.meta["tokenizer"] == first.meta["tokenizer"]
    assert "meta.json does not match the meta_sha256 it records" in caplog.text and "; rebuilding" in caplog.text


def test_a_hand_edited_meta_json_is_refused_by_readers(tmp_path):
    data_dir = prepare(char_config(tmp_path)).data_dir
    reverse_chars(data_dir)
    message = r"meta.json does not match the meta_sha256 it records \(it was edited or damaged\): run the prepare step"
    with pytest.raises(DataError, match=message):
        BatchLoader(data_dir, "train", block_size=8, batch_size=2, seed=0)
    with pytest.raises(DataError, match=message):
        load_tokenizer(data_dir)
    meta = json.loads((data_dir / "meta.json").read_text())
    del meta["meta_sha256"]
    (data_dir / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match="meta.json has no meta_sha256"):
        load_tokenizer(data_dir)


def test_a_token_id_outside_the_vocabulary_is_named(tmp_path):
    ids = np.arange(200, dtype=np.uint16) % 65
    ids[::10] = 70  # every window drawn holds one
    ids.tofile(tmp_path / "train.bin")
    ids.tofile(tmp_path / "val.bin")
    meta = {"format": 1, "tokens": {"train": 200, "val": 200}, "dtype": "uint16", "vocab_size": 65,
            "tokenizer": {"name": "gpt2"}}
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    loader = BatchLoader(tmp_path, "train", block_size=16, batch_size=2, seed=0)
    with pytest.raises(DataError, match=r"train.bin holds token id 70 but the vocabulary has 65 ids .*"
                                         r"corrupt; run the prepare step again"):
        loader.get_batch(0)


ROWS = [{"text": "one"}, {"text": "two"}, {"text": "three"}, {"id": 3}, {"text": "five"}]


@pytest.mark.parametrize("tokenizer, num_proc", [("char", 1), ("gpt2", 1), ("char", 2), ("gpt2", 2)])
def test_a_row_without_text_is_named(tmp_path, tokenizer, num_proc):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    cfg = DataConfig(name="t", source="files", path=str(rows), tokenizer=tokenizer, num_proc=num_proc,
                     data_dir=str(tmp_path / "data"), hf_cache_dir=str(tmp_path / "hf"))
    with pytest.raises(DataError, match=rf"document 3 of .*{rows} has no 'text' value \(null or missing\): "
                                        "fix the row or set data.text_column"):
        prepare(cfg)
    assert prepare(dataclasses.replace(cfg, max_documents=3)).meta["documents"] == 3  # unread rows don't count


@pytest.mark.parametrize("tokenizer", ["char", "gpt2"])
def test_a_streamed_row_without_text_is_named(tmp_path, tokenizer):
    (tmp_path / "hub").mkdir()
    (tmp_path / "hub" / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    cfg = DataConfig(name="t", source="hub", dataset=str(tmp_path / "hub"), streaming=True, tokenizer=tokenizer,
                     data_dir=str(tmp_path / "data"), hf_cache_dir=str(tmp_path / "hf"), val_fraction=0.3)
    with pytest.raises(DataError, match=r"document 3 of data.dataset='.*hub' has no 'text' value"):
        prepare(cfg)


def parent_of(pid: int) -> int | None:
    """The parent of a live process; None once it is gone (or a zombie: dead, just not reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]  # the name, in parentheses, may hold spaces
    return None if state == "Z" else int(ppid)


def survivors(pids: list[int]) -> list[int]:
    return [pid for pid in pids if parent_of(pid) is not None]


@pytest.mark.skipif(sys.platform != "linux", reason="workers die with their parent through Linux's prctl")
@pytest.mark.parametrize("kill", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_prepare_takes_its_workers_with_it(tmp_path, kill):
    rows = tmp_path / "rows.jsonl"
    rows.write_text((json.dumps({"text": "lorem ipsum dolor sit amet " * 20}) + "\n") * 20_000)
    command = [sys.executable, "-m", "data", "data=files", f"data.path={rows}", "data.num_proc=2",
               f"data.data_dir={tmp_path / 'data'}", f"data.hf_cache_dir={tmp_path / 'hf'}"]
    progress = tmp_path / "stderr.txt"
    with open(progress, "wb") as stderr:
        parent = subprocess.Popen(command, cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        # Kill mid-map, once the first batch is reported: the workers are busy and datasets'
        # progress manager is up (it holds the pool's pipes open, so nothing else ends them).
        deadline = time.monotonic() + 60
        while not re.search(r"tokenizing \(num_proc=2\):[^\r]*\| [1-9]\d*/", progress.read_text(errors="replace")):
            assert parent.poll() is None and time.monotonic() < deadline, "prepare ended before it tokenised"
            time.sleep(0.02)
        children = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
                    and parent_of(int(p.name)) == parent.pid]
        assert len(children) >= 2, "no tokenising workers"
        parent.send_signal(kill)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 5
        while survivors(children) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not survivors(children), "workers outlived their killed parent"
        if kill == signal.SIGTERM:  # a signal it can see: one message, and no partial files
            assert parent.returncode == 128 + signal.SIGTERM
            assert "error: interrupted by SIGTERM while preparing" in progress.read_text()
            assert "Traceback" not in progress.read_text()
            assert not [p for p in (tmp_path / "data").iterdir() if ".tmp-" in p.name]
    finally:
        with contextlib.suppress(ProcessLookupError):  # whatever is left of its session, on failure
            os.killpg(parent.pid, signal.SIGKILL)


OVERRIDES = [
    "data=files", "data.path='/some dir/x.txt'", "data.text_column=2024", "data.name=\"2024\"",
    "data.max_documents=null", "data.num_proc=3", "data.val_fraction=0.25", "data.streaming=true",
    "data.url='https://example.com/a b.txt'",
]


def train_py_data(overrides: list[str]) -> DataConfig:
    """The DataConfig train.py runs with `overrides`: its config composed by Hydra and checked by conf."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return load_config(compose(config_name="train", overrides=overrides)).data


def test_prepare_reads_overrides_exactly_as_train_py(monkeypatch):
    expected = train_py_data(OVERRIDES)
    assert (expected.path, expected.text_column, expected.max_documents) == ("/some dir/x.txt", "2024", None)
    seen = []

    def record(cfg):
        seen.append(cfg)
        raise DataError("recorded")

    monkeypatch.setattr(data.cli, "prepare", record)
    with pytest.raises(SystemExit, match="error: recorded"):
        data.cli.main(OVERRIDES)
    assert seen == [expected]
    assert data.cli.config_from_overrides(["data=shakespeare_char"]) == train_py_data(["data=shakespeare_char"])


@pytest.mark.parametrize("override, message", [
    ("data.path='unterminated", r"data.path='unterminated"),
    ("data=owt", r"data/owt.*Available options in 'data': files"),
    ("data.val_fraction=abc", r"data.val_fraction=abc.*could not be converted to Float"),
])
def test_bad_overrides_are_one_line_naming_them(override, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        data.cli.main([override])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_info.value.code == 2 and "Config search path" not in error
    assert error.startswith("python -m data: error: ") and re.search(message, error)
