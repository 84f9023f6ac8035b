"""The prepare step: shards and meta.json, reuse by fingerprint, safety under interruption."""

import dataclasses
import json
import os
import re

import numpy as np
import pytest

import data.preparation as prepare_module
import data.readers
from data import BatchLoader, DataConfig, DataError, Gpt2Tokenizer, load_tokenizer, prepare
from prepare import config_from_overrides, main

EOT = "<|endoftext|>"
DOCUMENTS = ["alpha beta gamma\n", "the second document, longer than the first one\n", "third: ünïcödé ✓\n"]


def config(tmp_path, path, **overrides) -> DataConfig:
    settings = dict(
        name="t",
        source="files",
        path=path and str(path),
        data_dir=str(tmp_path / "data"),
        hf_cache_dir=str(tmp_path / "hf"),
        num_proc=1,
    )
    return DataConfig(**{**settings, **overrides})


def write_documents(directory, texts) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i, text in enumerate(texts):
        (directory / f"doc{i}.txt").write_text(text, encoding="utf-8")


def token_stream(prepared) -> np.ndarray:
    dtype = prepared.meta["dtype"]
    return np.concatenate([np.fromfile(prepared.shard(split), dtype=dtype) for split in ("train", "val")])


def test_shards_hold_every_document_once_separated_by_eot(tmp_path):
    write_documents(tmp_path / "docs", DOCUMENTS)
    prepared = prepare(config(tmp_path, tmp_path / "docs", tokenizer="char", val_fraction=0.25))
    meta = prepared.meta
    stream = token_stream(prepared)
    assert meta["dtype"] == "uint16" and meta["documents"] == 3 and meta["replaced_bytes"] == 0
    assert meta["tokens"]["train"] == int(len(stream) * 0.75) and sum(meta["tokens"].values()) == len(stream)
    tokenizer = prepared.tokenizer()
    assert tokenizer.name == "char" and meta["vocab_size"] == tokenizer.vocab_size == len(set("".join(DOCUMENTS))) + 1
    assert sorted(tokenizer.decode(stream.tolist()).split(EOT)) == sorted(DOCUMENTS)


def test_one_document_is_tokenised_exactly_with_no_separator(tmp_path):
    text = "Hello <|endoftext|> world.\n\n  def f(x): return x  # 🤖\n" * 20
    (tmp_path / "input.txt").write_text(text, encoding="utf-8")
    prepared = prepare(config(tmp_path, tmp_path / "input.txt", tokenizer="gpt2"))
    assert token_stream(prepared).tolist() == Gpt2Tokenizer().encode(text)
    assert prepared.meta["tokenizer"] == {"name": "gpt2"} and prepared.meta["eot_id"] == 50256


def test_second_run_reuses_the_shards(tmp_path):
    write_documents(tmp_path / "docs", DOCUMENTS)
    first = prepare(config(tmp_path, tmp_path / "docs"))
    files = [first.shard("train"), first.shard("val"), first.data_dir / "meta.json"]
    stamps = [f.stat().st_mtime_ns for f in files]
    again = prepare(config(tmp_path, tmp_path / "docs", num_proc=2, hf_cache_dir=str(tmp_path / "other")))
    assert not first.reused and again.reused
    assert again.meta == first.meta and [f.stat().st_mtime_ns for f in files] == stamps


@pytest.mark.parametrize("change", ["source", "damaged shard"])
def test_a_changed_source_or_a_damaged_shard_rebuilds_with_a_warning(tmp_path, change, caplog):
    write_documents(tmp_path / "docs", DOCUMENTS)
    cfg = config(tmp_path, tmp_path / "docs", tokenizer="char")
    first = prepare(cfg)
    if change == "source":
        (tmp_path / "docs" / "doc0.txt").write_text("a changed first document\n", encoding="utf-8")
        warning = "holds data of the same settings, but its source's files changed since"
    else:
        with open(first.shard("train"), "ab") as f:
            f.write(b"\0\0")
        warning = "but meta.json promises"
    with caplog.at_level("WARNING"):
        second = prepare(cfg)
    assert not second.reused and warning in caplog.text and "rebuilding" in caplog.text
    assert (second.meta["fingerprint"] == first.meta["fingerprint"]) == (change == "damaged shard")
    assert second.shard("train").stat().st_size == second.meta["tokens"]["train"] * 2


@pytest.mark.parametrize("verify", ["sha256", "size"])
def test_a_source_edited_in_place_with_size_and_time_kept_is_rebuilt_under_verify_sha256(tmp_path, verify, caplog):
    """cp -p / rsync -t of a same-size file: the fingerprint's sizes and times cannot see it; the
    sources' sha256, which meta.json records, can (data.verify=size skips that read, and reuses)."""
    write_documents(tmp_path / "docs", ["the first document\n", "a second one\n"] * 20)
    cfg = config(tmp_path, tmp_path / "docs", tokenizer="char", verify=verify)
    first = prepare(cfg)
    edited = tmp_path / "docs" / "doc0.txt"
    stat = edited.stat()
    edited.write_text("THE FIRST DOCUMENT\n", encoding="utf-8")  # the same size
    os.utime(edited, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with caplog.at_level("WARNING"):
        second = prepare(cfg)
    assert second.reused == (verify == "size")
    if verify == "sha256":
        assert "whose content changed since, their sizes and modification times kept" in caplog.text
        assert "THE FIRST DOCUMENT" in second.tokenizer().decode(token_stream(second).tolist())
    assert sorted(first.meta["source_sha256"]) == sorted(str(p.resolve()) for p in (tmp_path / "docs").iterdir())


@pytest.mark.parametrize(
    "change, named",
    [
        (dict(tokenizer="gpt2"), 'data.tokenizer="gpt2" (it holds "char")'),
        (
            dict(val_fraction=0.3, split_seed=7),
            "data.split_seed=7 (it holds 1337), data.val_fraction=0.3 (it holds 0.1)",
        ),
    ],
)
def test_other_token_settings_are_refused_by_name_and_nothing_is_rewritten(tmp_path, change, named):
    write_documents(tmp_path / "docs", DOCUMENTS)
    first = prepare(config(tmp_path, tmp_path / "docs", tokenizer="char"))
    files = [first.shard("train"), first.shard("val"), first.data_dir / "meta.json"]
    stamps = [(f.stat().st_ino, f.stat().st_mtime_ns) for f in files]
    with pytest.raises(
        DataError,
        match=f"other settings than this run's {re.escape(named)}: give this data a "
        "directory of its own \\(another data.data_dir\\), or delete ",
    ):
        prepare(config(tmp_path, tmp_path / "docs", **{"tokenizer": "char", **change}))
    assert [(f.stat().st_ino, f.stat().st_mtime_ns) for f in files] == stamps


def test_an_unfinished_prepare_of_other_settings_is_refused_not_discarded(tmp_path, monkeypatch):
    write_documents(tmp_path / "docs", DOCUMENTS * 40)
    cfg = config(tmp_path, tmp_path / "docs", shuffle_block_tokens=64)
    real_tokenized = prepare_module._tokenized

    def killed_after_some_blocks(*args):
        for index, item in enumerate(real_tokenized(*args)):
            if index == 60:
                raise KeyboardInterrupt
            yield item

    monkeypatch.setattr(prepare_module, "_tokenized", killed_after_some_blocks)
    with pytest.raises(KeyboardInterrupt):
        prepare(cfg)
    monkeypatch.undo()
    progress = cfg.resolved_data_dir() / "progress.json"
    written = progress.read_text()
    with pytest.raises(
        DataError,
        match=r"holds an unfinished prepare with other settings than this run's "
        r"data.max_documents=5 \(it holds null\)",
    ):
        prepare(dataclasses.replace(cfg, max_documents=5))
    assert progress.read_text() == written
    assert not prepare(cfg).reused  # the same settings resume it


def test_parallel_tokenising_writes_the_same_bytes(tmp_path):
    texts = [f"document {i}: " + "word " * (i % 7) + "\n" for i in range(60)]
    write_documents(tmp_path / "docs", texts)
    serial = prepare(config(tmp_path / "a", tmp_path / "docs", num_proc=1))
    parallel = prepare(config(tmp_path / "b", tmp_path / "docs", num_proc=2))
    assert np.array_equal(token_stream(serial), token_stream(parallel))
    assert serial.meta == parallel.meta


def test_a_crash_mid_write_leaves_no_complete_looking_shards(tmp_path, monkeypatch):
    write_documents(tmp_path / "docs", DOCUMENTS)
    cfg = config(tmp_path, tmp_path / "docs")
    clean = prepare(config(tmp_path / "clean", tmp_path / "docs"))
    prepare(cfg)
    (tmp_path / "docs" / "doc3.txt").write_text("a new document\n", encoding="utf-8")
    real_tokenized = prepare_module._tokenized

    def crash_after_first_piece(*args):
        yield next(real_tokenized(*args))
        raise RuntimeError("power cut")

    monkeypatch.setattr(prepare_module, "_tokenized", crash_after_first_piece)
    with pytest.raises(RuntimeError, match="power cut"):
        prepare(cfg)
    data_dir = cfg.resolved_data_dir()
    assert not (data_dir / "meta.json").exists()
    with pytest.raises(DataError, match="meta.json does not exist"):
        BatchLoader(data_dir, "train", 4, 2, seed=0)

    monkeypatch.undo()
    (tmp_path / "docs" / "doc3.txt").unlink()
    (data_dir / "train.bin.tmp-4242").write_bytes(b"left by a killed process")
    rebuilt = prepare(cfg)
    assert not rebuilt.reused and not list(data_dir.glob("*.tmp-*"))
    assert np.array_equal(token_stream(rebuilt), token_stream(clean))


def test_shards_without_their_meta_json_are_rebuilt(tmp_path, monkeypatch):
    write_documents(tmp_path / "docs", DOCUMENTS)
    cfg = config(tmp_path, tmp_path / "docs")

    def crash(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare_module, "write_json_atomic", crash)
    with pytest.raises(KeyboardInterrupt):
        prepare(cfg)
    assert cfg.resolved_data_dir().joinpath("train.bin").exists()
    assert not cfg.resolved_data_dir().joinpath("meta.json").exists()
    monkeypatch.undo()
    assert not prepare(cfg).reused


def test_stdlib_corpus_is_sources_then_topics_in_a_fixed_order(tmp_path):
    from pydoc_data.topics import topics

    from data.sources import open_corpus, stdlib_files

    files = stdlib_files()
    names = [f.as_posix() for f in files]
    assert names == sorted(names) and len(files) > 100
    assert not [n for n in names if "/site-packages/" in n or "/test/" in n or n.endswith("pydoc_data/topics.py")]
    cfg = DataConfig(data_dir=str(tmp_path / "data"), hf_cache_dir=str(tmp_path / "hf"), num_proc=1)
    documents = []
    for piece in open_corpus(cfg, piece_chars=1 << 16).reader.pieces():
        if piece.new_document:
            documents.append("")
        documents[-1] += piece.text
    assert len(documents) == len(files) + len(topics)
    assert documents[0] == files[0].read_text(encoding="utf-8")
    assert documents[len(files)] == topics[sorted(topics)[0]]

    prepared = prepare(dataclasses.replace(cfg, max_documents=30))
    assert prepared.meta["documents"] == 30 and "standard library" in prepared.meta["source"]


def test_jsonl_and_parquet_read_the_configured_column(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [{"id": i, "body": text} for i, text in enumerate(DOCUMENTS)]
    (tmp_path / "jsonl").mkdir()
    (tmp_path / "jsonl" / "part.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (tmp_path / "parquet").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "parquet" / "part.parquet")
    streams = []
    for kind in ("jsonl", "parquet"):
        prepared = prepare(config(tmp_path / kind, tmp_path / kind / f"*.{kind}", text_column="body"))
        assert prepared.meta["documents"] == 3
        streams.append(token_stream(prepared))
    assert np.array_equal(*streams)
    with pytest.raises(DataError, match=r"line 1 of .*part.jsonl has no 'text' text \(its fields: \['id', 'body'\]\)"):
        prepare(config(tmp_path / "x", tmp_path / "jsonl" / "part.jsonl"))
    with pytest.raises(DataError, match=r"no column 'text' \(it has \['id', 'body'\]\); set data.text_column"):
        prepare(config(tmp_path / "x", tmp_path / "parquet" / "part.parquet"))


def test_path_problems_are_explained(tmp_path):
    write_documents(tmp_path / "docs", DOCUMENTS)
    (tmp_path / "docs" / "rows.jsonl").write_text('{"text": "x"}\n')
    with pytest.raises(DataError, match=r"data.path='.*nothing\*.txt' matched no files"):
        prepare(config(tmp_path, tmp_path / "nothing*.txt"))
    with pytest.raises(DataError, match=r"mixes file formats \(\['json', 'text'\]\)"):
        prepare(config(tmp_path, tmp_path / "docs"))


def test_non_utf8_bytes_become_replacement_characters_and_are_counted(tmp_path, caplog):
    (tmp_path / "latin1.txt").write_bytes("café crème, naïve\n".encode("latin-1") + b"\xff\xfe ok\n")
    prepared = prepare(config(tmp_path, tmp_path / "latin1.txt", tokenizer="char"))
    assert prepared.meta["replaced_bytes"] == 5
    assert "5 bytes are not valid UTF-8" in caplog.text and "latin1.txt" in caplog.text
    assert (
        prepared.tokenizer().decode(token_stream(prepared).tolist())
        == "caf\ufffd cr\ufffdme, na\ufffdve\n\ufffd\ufffd ok\n"
    )


def test_unreadable_file_is_named(tmp_path, monkeypatch):
    write_documents(tmp_path / "docs", DOCUMENTS)
    secret = tmp_path / "docs" / "doc1.txt"

    def guarded_open(path, *args, **kwargs):
        if str(path) == str(secret):
            raise PermissionError(13, "Permission denied", str(path))
        return open(path, *args, **kwargs)

    monkeypatch.setattr(data.readers, "open", guarded_open, raising=False)
    with pytest.raises(DataError, match=r"cannot read .*doc1.txt: Permission denied"):
        prepare(config(tmp_path, tmp_path / "docs"))


@pytest.mark.parametrize("texts, message", [(["", ""], "the corpus is empty"), (["a"], "too few to hold out")])
def test_empty_or_tiny_corpus_is_explained(tmp_path, texts, message):
    write_documents(tmp_path / "docs", texts)
    with pytest.raises(DataError, match=message):
        prepare(config(tmp_path, tmp_path / "docs", tokenizer="char"))
    left = [p.name for p in (tmp_path / "data").iterdir() if p.name != prepare_module.LOCK_FILE]
    assert not left, "a failed prepare leaves nothing behind"


def test_url_is_downloaded_once_when_no_path_is_given(tmp_path):
    (tmp_path / "input.txt").write_text("To be, or not to be: that is the question.\n" * 5)
    cfg = config(tmp_path, None, url=(tmp_path / "input.txt").as_uri())
    prepared = prepare(cfg)
    assert (prepared.data_dir / "download" / "input.txt").read_bytes() == (tmp_path / "input.txt").read_bytes()
    assert prepared.tokenizer().decode(token_stream(prepared).tolist()) == (tmp_path / "input.txt").read_text()


def test_failed_download_names_data_path(tmp_path):
    cfg = config(tmp_path, None, url=(tmp_path / "missing.txt").as_uri())
    with pytest.raises(DataError, match=r"data.path is not set and .*missing.txt could not be downloaded"):
        prepare(cfg)


@pytest.mark.parametrize("streaming", [False, True])
def test_hub_code_path_on_a_local_dataset_directory(tmp_path, streaming):
    """openwebtext / fineweb_edu go through this path; a local dataset directory stands in for the Hub."""
    texts = [f"web page {i}: " + "text " * (i % 5) + "\n" for i in range(40)]
    (tmp_path / "hub").mkdir()
    (tmp_path / "hub" / "train.jsonl").write_text("\n".join(f'{{"content": "{t.strip()}"}}' for t in texts))
    cfg = DataConfig(
        name="hub",
        source="hub",
        dataset=str(tmp_path / "hub"),
        streaming=streaming,
        text_column="content",
        max_documents=25,
        num_proc=2,
        val_fraction=0.2,
        data_dir=str(tmp_path / "data"),
        hf_cache_dir=str(tmp_path / "hf"),
    )
    prepared = prepare(cfg)
    decoded = prepared.tokenizer().decode(token_stream(prepared).tolist()).split(EOT)
    assert sorted(decoded) == sorted(t.strip() for t in texts[:25])
    assert prepared.meta["documents"] == 25 and "streaming" in prepared.meta["source"]  # a local directory streams
    assert prepare(cfg).reused


def test_missing_hub_dataset_is_explained(tmp_path):
    cfg = DataConfig(source="hub", dataset=str(tmp_path / "no_such_dataset"), data_dir=str(tmp_path / "d"))
    with pytest.raises(DataError, match=r"could not load data.dataset='.*no_such_dataset' through datasets"):
        prepare(cfg)


def test_vocabularies_over_65535_use_uint32(tmp_path):
    text = "".join(chr(0x10000 + i) for i in range(70_000))  # 70,000 distinct characters
    write_documents(tmp_path / "docs", [text, text[::-1]])
    prepared = prepare(config(tmp_path, tmp_path / "docs", tokenizer="char", val_fraction=0.5))
    assert prepared.meta["dtype"] == "uint32" and prepared.meta["vocab_size"] == 70_001
    train = np.fromfile(prepared.shard("train"), dtype=np.uint32)
    assert train.max() > 65535
    loader = BatchLoader(prepared.data_dir, "train", 8, 2, seed=0)
    x, _ = loader.get_batch(0)
    assert x.tolist() == [train[s : s + 8].tolist() for s in loader.window_starts(0)]


def test_command_line_prepares_then_reuses(tmp_path, capsys):
    (tmp_path / "input.txt").write_text("O Romeo, Romeo! wherefore art thou Romeo?\n" * 10)
    argv = [
        "data=shakespeare_char",
        f"data.path={tmp_path / 'input.txt'}",
        f"data.data_dir={tmp_path / 'd'}",
        "data.num_proc=1",
    ]
    main(argv)
    assert capsys.readouterr().out.startswith(
        f"wrote {tmp_path / 'd'}: train 378 and val 42 uint16 tokens, tokenizer char"
    )
    main(argv)
    assert capsys.readouterr().out.startswith("reused")
    assert load_tokenizer(tmp_path / "d").decode([0]) == "\n"


def test_command_line_errors_are_messages_not_tracebacks(tmp_path):
    with pytest.raises(SystemExit, match=r"error: data.colour is not a setting of DataConfig; known: name, source"):
        main(["data.colour=blue"])
    with pytest.raises(SystemExit) as exit_info:
        main(["data=files", f"data.path={tmp_path}/*.nothing", f"data.data_dir={tmp_path / 'd'}"])
    assert "matched no files" in str(exit_info.value.code)


def test_overrides_parse_like_hydra():
    overrides = [
        "data=shakespeare",
        "data.path=2024",
        "data.val_fraction=0.2",
        "data.max_documents=null",
        "data.keep_hf_cache=true",
    ]
    cfg = config_from_overrides(overrides)
    assert (cfg.name, cfg.path, cfg.val_fraction, cfg.max_documents, cfg.keep_hf_cache) == (
        "shakespeare",
        "2024",
        0.2,
        None,
        True,
    )
    with pytest.raises(ValueError, match="Could not find 'data/owt'"):
        config_from_overrides(["data=owt"])


def test_tiny_shakespeare_char_matches_nanogpt(tmp_path):
    shakespeare = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "tinyshakespeare.txt")
    if not os.path.exists(shakespeare):
        pytest.skip("tinyshakespeare.txt is only in the project's shared folder")
    prepared = prepare(config(tmp_path, shakespeare, name="shakespeare_char", tokenizer="char"))
    assert prepared.meta["vocab_size"] == 65 and prepared.meta["tokens"] == {"train": 1_003_854, "val": 111_540}


def test_local_sources_never_touch_the_network(tmp_path, monkeypatch):
    import socket

    attempts = []
    real_connect = socket.socket.connect

    def record_connect(sock, address):
        if sock.family == socket.AF_UNIX:  # worker processes talk over local sockets
            return real_connect(sock, address)
        attempts.append(address)
        raise OSError("no network in this test")

    def record_lookup(host, *args, **kwargs):
        attempts.append(host)
        raise OSError("no network in this test")

    monkeypatch.setattr(socket.socket, "connect", record_connect)
    monkeypatch.setattr(socket, "getaddrinfo", record_lookup)
    write_documents(tmp_path / "docs", DOCUMENTS)
    (tmp_path / "rows.jsonl").write_text('{"text": "one"}\n{"text": "two"}\n')
    prepare(config(tmp_path / "a", tmp_path / "docs"))
    prepare(config(tmp_path / "b", tmp_path / "rows.jsonl", val_fraction=0.5))
    assert attempts == []


def test_local_files_load_without_datasets_download_bars(tmp_path, capfd):
    import datasets

    write_documents(tmp_path / "docs", DOCUMENTS)
    prepare(config(tmp_path, tmp_path / "docs"))
    printed = capfd.readouterr().err
    assert "Downloading data" not in printed and "Generating train split" not in printed
    assert "tokenizing" in printed  # our own progress still shows
    assert not datasets.are_progress_bars_disabled()  # and the setting is given back
