"""Faults the data side must catch: damaged shards and meta.json, ids outside the
vocabulary, rows without text, killed prepare runs, and overrides read unlike train.py."""

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

import prepare as prepare_command
from conf import CONF_DIR, load_config
from data import BatchLoader, DataConfig, DataError, load_tokenizer, prepare

REPO = Path(__file__).resolve().parents[1]
TEXT = "It was the best of times, it was the worst of times, it was the age of wisdom.\n" * 20


def char_config(tmp_path) -> DataConfig:
    (tmp_path / "book.txt").write_text(TEXT)
    return DataConfig(
        name="t",
        source="files",
        path=str(tmp_path / "book.txt"),
        tokenizer="char",
        data_dir=str(tmp_path / "data"),
        hf_cache_dir=str(tmp_path / "hf"),
        num_proc=1,
    )


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
    meta = {
        "format": 1,
        "tokens": {"train": 200, "val": 200},
        "dtype": "uint16",
        "vocab_size": 65,
        "tokenizer": {"name": "gpt2"},
    }
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    loader = BatchLoader(tmp_path, "train", block_size=16, batch_size=2, seed=0)
    with pytest.raises(
        DataError,
        match=r"train.bin holds token id 70 but the vocabulary has 65 ids .*"
        r"corrupt; run the prepare step again",
    ):
        loader.get_batch(0)


ROWS = [{"text": "one"}, {"text": "two"}, {"text": "three"}, {"id": 3}, {"text": "five"}]


@pytest.mark.parametrize("tokenizer, num_proc", [("char", 1), ("gpt2", 1), ("char", 2), ("gpt2", 2)])
def test_a_row_without_text_is_named(tmp_path, tokenizer, num_proc):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    cfg = DataConfig(
        name="t",
        source="files",
        path=str(rows),
        tokenizer=tokenizer,
        num_proc=num_proc,
        data_dir=str(tmp_path / "data"),
        hf_cache_dir=str(tmp_path / "hf"),
    )
    with pytest.raises(
        DataError,
        match=rf"line 4 of .*{rows} has no 'text' text \(its fields: \['id'\]\): "
        "null, missing or not a string; fix the row or set data.text_column",
    ):
        prepare(cfg)
    assert prepare(dataclasses.replace(cfg, max_documents=3)).meta["documents"] == 3  # unread rows don't count


@pytest.mark.parametrize("tokenizer", ["char", "gpt2"])
def test_a_streamed_row_without_text_is_named(tmp_path, tokenizer):
    (tmp_path / "hub").mkdir()
    (tmp_path / "hub" / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    cfg = DataConfig(
        name="t",
        source="hub",
        dataset=str(tmp_path / "hub"),
        streaming=True,
        tokenizer=tokenizer,
        data_dir=str(tmp_path / "data"),
        hf_cache_dir=str(tmp_path / "hf"),
        val_fraction=0.3,
    )
    with pytest.raises(DataError, match=r"row 4 of data.dataset='.*hub' has no 'text' text"):
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


@pytest.mark.skipif(sys.platform != "linux", reason="forked processes die with their parent through Linux's prctl")
def test_processes_forked_while_preparing_die_with_it(tmp_path):
    """datasets' download processes (num_proc, for a Hub dataset) are forked like this one."""
    script = (
        "import os, time\n"
        "from pathlib import Path\n"
        "from data.preparation import _building\n"
        "with _building(Path('unused')):\n"
        "    child = os.fork()\n"
        "    if child == 0:\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "    print(child, flush=True)\n"
        "    time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, start_new_session=True)
    try:
        child = int(parent.stdout.readline())
        assert survivors([child]) == [child]
        parent.kill()
        parent.wait(timeout=30)
        deadline = time.monotonic() + 5
        while survivors([child]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not survivors([child]), "a forked process outlived its killed parent"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(parent.pid, signal.SIGKILL)


def test_sigterm_stops_prepare_at_once_and_the_same_command_resumes(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(json.dumps({"text": f"row {i}: " + "lorem ipsum dolor sit amet " * 30}) + "\n" for i in range(6000))
    )
    settings = [f"data.path={rows}", "data.shuffle_block_tokens=20000", "data.batch_mb=0.05", "data.num_proc=1"]
    command = [sys.executable, "prepare.py", "data=files", *settings, f"data.data_dir={tmp_path / 'data'}"]
    with open(tmp_path / "stderr.txt", "wb") as stderr:
        parent = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr)
    progress = tmp_path / "data" / "progress.json"
    deadline = time.monotonic() + 60
    while not (progress.exists() and json.loads(progress.read_text())["blocks"] >= 3):
        assert parent.poll() is None and time.monotonic() < deadline, "prepare ended before its third block"
        time.sleep(0.01)
    parent.send_signal(signal.SIGTERM)
    parent.wait(timeout=30)
    printed = (tmp_path / "stderr.txt").read_text()
    assert parent.returncode == 128 + signal.SIGTERM and "Traceback" not in printed
    assert (
        "error: interrupted by SIGTERM while preparing" in printed
        and "resumes after the last complete block" in printed
    )
    assert not (tmp_path / "data" / "meta.json").exists()
    blocks_done = json.loads(progress.read_text())["blocks"]

    resumed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming the prepare of {tmp_path / 'data'} after block {blocks_done}" in resumed.stderr
    whole = subprocess.run(
        [*command[:-1], f"data.data_dir={tmp_path / 'whole'}"], cwd=REPO, capture_output=True, timeout=120
    )
    assert whole.returncode == 0
    for name in ("train.bin", "val.bin"):
        assert (tmp_path / "data" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()
    assert not progress.exists()


OVERRIDES = [
    "data=files",
    "data.path='/some dir/x.txt'",
    "data.text_column=2024",
    'data.name="2024"',
    "data.max_documents=null",
    "data.num_proc=3",
    "data.val_fraction=0.25",
    "data.keep_hf_cache=true",
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

    monkeypatch.setattr(prepare_command, "prepare", record)
    with pytest.raises(SystemExit, match="error: recorded"):
        prepare_command.main(OVERRIDES)
    assert seen == [expected]
    assert prepare_command.config_from_overrides(["data=shakespeare_char"]) == train_py_data(["data=shakespeare_char"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("data.path='unterminated", "error: data.path='unterminated: Hydra cannot read this value ("),
        ("data=owt", "error: data=owt: there is no preset conf/data/owt.yaml; presets: files, fineweb_edu"),
        ("data.val_fraction=abc", "error: data.val_fraction must be a number, got 'abc'"),
        ("max_iters=-1", "error: max_iters must be >= 0, got -1"),  # a rule, checked when the config is built
        ("data.path=${nope}", "error: Interpolation key 'nope' not found (at data.path)"),
    ],
)
def test_bad_overrides_are_one_line_naming_them(override, message):
    with pytest.raises(SystemExit) as exit_info:  # train.py's message, before Hydra composes
        prepare_command.main([override])
    assert exit_info.value.code.startswith(message) and "\n" not in exit_info.value.code


@pytest.mark.parametrize("in_the_way", ["file", "file/below"])
def test_a_data_directory_that_cannot_be_made_is_named(tmp_path, in_the_way):
    (tmp_path / "file").write_text("not a directory")
    data_dir = tmp_path / in_the_way
    with pytest.raises(SystemExit) as exit_info:
        prepare_command.main(["data=files", f"data.path={tmp_path / 'file'}", f"data.data_dir={data_dir}"])
    assert exit_info.value.code.startswith(f"error: data.data_dir={data_dir}: cannot create that directory (")


@pytest.mark.parametrize("name", ["meta.json", "train.bin", "val.bin"])
def test_a_directory_where_a_file_of_the_data_belongs_is_named(tmp_path, name):
    cfg = char_config(tmp_path)
    prepare(cfg)
    in_the_way = Path(cfg.data_dir) / name
    in_the_way.unlink()
    (in_the_way / "kept").mkdir(parents=True)
    with pytest.raises(SystemExit) as exit_info:  # python prepare.py, on train.py's settings
        prepare_command.main(
            ["data=files", f"data.path={cfg.path}", "data.tokenizer=char", f"data.data_dir={cfg.data_dir}"]
        )
    assert exit_info.value.code == (
        f"error: {in_the_way} is a directory, where prepare keeps a file of the prepared "
        "data: move it away (or delete it), or set another data.data_dir"
    )
    assert (in_the_way / "kept").is_dir()  # nothing in it touched


def damaged_parquet(path: Path, where: str) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": [TEXT] * 8}), path)
    content = bytearray(path.read_bytes())
    if where == "footer":  # cut short: the footer and its magic bytes are gone
        content = content[: len(content) // 2]
    else:  # the first data page's header overwritten; the footer (and the schema) intact
        content[4:64] = b"\x55" * 60
    path.write_bytes(bytes(content))
    return path


@pytest.mark.parametrize("where", ["footer", "page"])
def test_a_damaged_parquet_file_is_named(tmp_path, where):
    path = damaged_parquet(tmp_path / "rows.parquet", where)
    cfg = dataclasses.replace(char_config(tmp_path), path=str(path))
    with pytest.raises(
        DataError,
        match=rf"^cannot read {path} as parquet \(.+\); replace the file, or leave it out "
        r"of data.path$",
    ):
        prepare(cfg)
