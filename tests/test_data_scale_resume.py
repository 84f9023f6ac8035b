"""A prepare that stops and runs again, or meets another: killed mid-way, between writing a
block and recording it, inside a document split across blocks, or out of disk, it resumes
to byte-identical shards; a text file's reader resumes at any piece; two preparers
serialise on a lock, and a filesystem without locks prepares with a warning."""

import errno
import json
import os

import numpy as np
import pytest

import data.preparation as prepare_module
import data.shards
from data import DataConfig, DataError, Gpt2Tokenizer, prepare
from data.readers import Stream, TextFiles
from test_data_scale import KINDS, config, documents, shards, write_kind


class Killed(BaseException):
    """Stands in for SIGKILL: nothing below catches it."""


def killed_then_resumed(monkeypatch, cfg: DataConfig, method: str, call: int):
    """prepare(cfg) killed at the `call`-th call of ShardWriter.<method>, then run again:
    (the data directory as the kill left it: its progress.json, if any), the resumed result."""
    return prepare_killed(monkeypatch, cfg, method, call), prepare(cfg)


def prepare_killed(monkeypatch, cfg: DataConfig, method: str, call: int):
    """prepare(cfg) killed at the `call`-th call of ShardWriter.<method>: its progress.json, if any."""
    real, calls = getattr(data.shards.ShardWriter, method), []

    def killed(writer, *args, **kwargs):
        calls.append(method)
        if len(calls) == call:
            raise Killed
        return real(writer, *args, **kwargs)

    monkeypatch.setattr(data.shards.ShardWriter, method, killed)
    with pytest.raises(Killed):
        prepare(cfg)
    monkeypatch.setattr(data.shards.ShardWriter, method, real)
    progress = cfg.resolved_data_dir() / "progress.json"
    left = json.loads(progress.read_text()) if progress.exists() else None
    assert not (cfg.resolved_data_dir() / "meta.json").exists()
    return left


@pytest.mark.parametrize("kind, tokenizer", [(kind, "gpt2") for kind in KINDS] + [("jsonl", "char")])
def test_a_prepare_killed_mid_way_resumes_to_byte_identical_shards(tmp_path, monkeypatch, kind, tokenizer):
    texts = documents(600)
    source = write_kind(tmp_path, kind, texts)
    common = dict(source, shuffle_block_tokens=1500, batch_mb=0.01, tokenizer=tokenizer)
    whole = prepare(config(tmp_path, "whole", **common))
    monkeypatch.setattr(Stream, "STATE_EVERY", 7)  # so a resumed stream starts from a saved state
    cfg = config(tmp_path, **common)
    left, resumed = killed_then_resumed(monkeypatch, cfg, "_write_block", call=6)
    assert left["blocks"] == 5
    assert shards(resumed) == shards(whole) and resumed.meta["tokens"] == whole.meta["tokens"]
    assert resumed.meta["documents"] == whole.meta["documents"] == 600
    assert not (cfg.resolved_data_dir() / "progress.json").exists()


def test_a_kill_between_writing_a_block_and_recording_it_resumes_without_the_extra_bytes(tmp_path, monkeypatch):
    source = write_kind(tmp_path, "jsonl", documents(300))
    common = dict(source, shuffle_block_tokens=1500, batch_mb=0.01)
    whole = prepare(config(tmp_path, "whole", **common))
    # killed before the third record: block 3 is in the partial shards, progress.json still says 2
    left, resumed = killed_then_resumed(monkeypatch, config(tmp_path, **common), "_record", call=3)
    assert left["blocks"] == 2 and shards(resumed) == shards(whole)


def test_a_big_document_split_across_blocks_resumes_inside_it(tmp_path, monkeypatch):
    (tmp_path / "one.txt").write_text(" ".join(documents(400)), encoding="utf-8")
    common = dict(path=str(tmp_path / "one.txt"), shuffle_block_tokens=1000, batch_mb=0.003)
    whole = prepare(config(tmp_path, "whole", **common))
    assert whole.meta["blocks"] > 10 and whole.meta["documents"] == 1
    tokens = np.concatenate([np.frombuffer(b, np.uint16) for b in shards(whole)])
    assert Gpt2Tokenizer().eot_id not in tokens  # one document: no separator at any block boundary
    left, resumed = killed_then_resumed(monkeypatch, config(tmp_path, **common), "add", call=40)
    assert 0 < left["blocks"] < whole.meta["blocks"] and shards(resumed) == shards(whole)


def test_a_full_disk_keeps_the_blocks_written_and_the_rerun_resumes(tmp_path, monkeypatch, caplog):
    source = write_kind(tmp_path, "jsonl", documents(500))
    common = dict(source, shuffle_block_tokens=2000, batch_mb=0.01)
    whole = prepare(config(tmp_path, "whole", **common))
    real_fsync, calls = os.fsync, []

    def full_after_three_blocks(fd):
        calls.append(fd)
        if len(calls) > 6:  # two shards per block
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(data.shards.os, "fsync", full_after_three_blocks)
    cfg = config(tmp_path, **common)
    with pytest.raises(
        DataError,
        match=r"no space left on device writing .*train.bin.partial: free some space and "
        r"run the same command again: it resumes after the 3 block\(s\) already written",
    ):
        prepare(cfg)
    monkeypatch.undo()
    caplog.set_level("INFO", logger="data.preparation")
    assert shards(prepare(cfg)) == shards(whole)
    assert f"resuming the prepare of {cfg.resolved_data_dir()} after block 3" in caplog.text


def test_text_file_reader_resumes_at_any_piece(tmp_path):
    (tmp_path / "a.txt").write_bytes(" ".join(documents(200)).encode() + b"\xff tail")
    reader = TextFiles([tmp_path / "a.txt"], piece_chars=500)
    pieces = list(reader.pieces())
    assert len(pieces) > 20 and sum(p.replaced_bytes for p in pieces) == 1
    for i in (1, len(pieces) // 2, len(pieces) - 1):
        assert [p.text for p in reader.pieces(pieces[i].position)] == [p.text for p in pieces[i:]]


def test_lock_serialises_two_preparers(tmp_path):
    import threading

    source = write_kind(tmp_path, "jsonl", documents(200))
    cfg = config(tmp_path, **source)
    results = []
    threads = [threading.Thread(target=lambda: results.append(prepare(cfg))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(r.reused for r in results) == [False, True]
    assert prepare_module.LOCK_FILE in os.listdir(cfg.resolved_data_dir())


def test_a_filesystem_without_locks_prepares_with_a_warning(tmp_path, monkeypatch, caplog):
    import fcntl

    def no_locks(*args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    source = write_kind(tmp_path, "jsonl", documents(20))
    assert not prepare(config(tmp_path, **source, val_fraction=0.3)).reused
    assert "preparing without the lock" in caplog.text and "No locks available" in caplog.text


@pytest.mark.parametrize("damage", ["delete", "truncate"])
def test_a_resumed_prepare_whose_trained_tokenizer_is_gone_or_damaged_starts_afresh(tmp_path, monkeypatch, damage):
    """The trained tokenizer.json is written before progress.json names it; without it intact,
    the partial shards cannot be continued, and the rerun rebuilds them instead of failing each time."""
    source = write_kind(tmp_path, "jsonl", documents(600))
    common = dict(source, shuffle_block_tokens=1500, batch_mb=0.01, tokenizer="bpe", vocab_size=300)
    whole = prepare(config(tmp_path, "whole", **common))
    cfg = config(tmp_path, **common)
    assert prepare_killed(monkeypatch, cfg, "_write_block", call=3)["blocks"] == 2
    tokenizer_file = cfg.resolved_data_dir() / "tokenizer.json"
    if damage == "delete":
        tokenizer_file.unlink()
    else:
        tokenizer_file.write_text(tokenizer_file.read_text()[:100])
    assert shards(prepare(cfg)) == shards(whole)
