"""The prepare step at scale, on small corpora: bounded memory, exact pieces, the same
shards from every source kind, shuffled blocks that each give val its share; and what
the sources and the new settings accept, refuse and name. A prepare that resumes or
waits on another: test_data_scale_resume.py."""

import dataclasses
import json
import os
import random
import re
import tracemalloc

import numpy as np
import pytest

import data.hub
from data import DataConfig, DataError, Gpt2Tokenizer, prepare
from data.errors import describe_error
from data.hub import hub_corpus
from data.readers import text_pieces

EOT = "<|endoftext|>"
SEPARATOR = "\n===\n"


def documents(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "ünï", "✓", "42", "x=1;", "\t", "  ", "\n", "'s", "’"]
    return [
        f"document {i:05d}: " + " ".join(rng.choice(words) for _ in range(rng.randint(5, 80))) + "." for i in range(n)
    ]


def config(tmp_path, name="data", **overrides) -> DataConfig:
    settings = dict(name="t", source="files", data_dir=str(tmp_path / name), num_proc=1, val_fraction=0.1)
    return DataConfig(**{**settings, **overrides})


def shards(prepared) -> tuple[bytes, bytes]:
    return prepared.shard("train").read_bytes(), prepared.shard("val").read_bytes()


def write_kind(tmp_path, kind: str, texts: list[str]) -> dict:
    """The same documents as a source of `kind`: the DataConfig settings that read them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path / kind
    root.mkdir()
    if kind == "separated text file":
        (root / "all.txt").write_text(SEPARATOR.join(texts), encoding="utf-8")
        return dict(path=str(root / "all.txt"), document_separator=SEPARATOR)
    if kind == "text directory":
        for i, text in enumerate(texts):
            (root / f"{i:05d}.txt").write_text(text, encoding="utf-8")
        return dict(path=str(root))
    rows = [{"id": i, "text": text} for i, text in enumerate(texts)]
    if kind == "jsonl":
        (root / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        return dict(path=str(root / "rows.jsonl"))
    half = len(rows) // 2
    for part, chunk in enumerate((rows[:half], rows[half:])):
        pq.write_table(pa.Table.from_pylist(chunk), root / f"part{part}.parquet", row_group_size=37)
    if kind == "parquet":
        return dict(path=str(root))
    return dict(source="hub", dataset=str(root), streaming=True)  # "hub stream": a local dir stands in for the Hub


KINDS = ["separated text file", "text directory", "jsonl", "parquet", "hub stream"]


def test_pieces_tokenise_exactly_as_the_whole_text():
    encoding = Gpt2Tokenizer()
    rng = random.Random(1)
    alphabet = list("ab \n\n\t  .,'s1 2\r\n") + ["é", "日本", "\u00a0", "\u2028", "\x1c", " '", "’", "\u3000", "😀"]
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 2000)))
        pieces = [piece for _, piece in text_pieces(text, 0, rng.randint(1, 100))]
        assert "".join(pieces) == text
        assert [t for piece in pieces for t in encoding.encode(piece)] == encoding.encode(text)


def test_forced_cuts_in_text_without_safe_ones_do_not_depend_on_the_piece_size():
    from data.readers import FORCED_CUT_CHARS

    encoding = Gpt2Tokenizer()
    text = "a b " + "x" * (3 * FORCED_CUT_CHARS + 123) + " c\nd " + "y" * (FORCED_CUT_CHARS // 2) + " e"
    cuts = {limit: [offset for offset, _ in text_pieces(text, 0, limit)] for limit in (10, 5000, FORCED_CUT_CHARS)}
    forced = [offset for offset in cuts[10] if text[offset - 1 : offset + 1] == "xx"]
    assert len(forced) == 3 and all(set(forced) <= set(c) for c in cuts.values())
    tokens = {limit: [t for _, p in text_pieces(text, 0, limit) for t in encoding.encode(p)] for limit in cuts}
    assert tokens[10] == tokens[5000] == tokens[FORCED_CUT_CHARS]


def test_a_text_file_far_larger_than_a_batch_is_one_document_with_the_whole_files_tokens(tmp_path):
    text = "\n\n".join(documents(3000))
    (tmp_path / "big.txt").write_text(text, encoding="utf-8")
    cfg = config(tmp_path, path=str(tmp_path / "big.txt"), batch_mb=0.01, val_fraction=0.01)
    prepared = prepare(cfg)
    train, val = (np.frombuffer(b, dtype=np.uint16) for b in shards(prepared))
    assert prepared.meta["documents"] == 1 and len(text) > 40 * 0.01 * 2**20
    assert np.concatenate([train, val]).tolist() == Gpt2Tokenizer().encode(text)


@pytest.mark.parametrize("kind", KINDS[1:])
def test_every_source_kind_gives_the_same_shards_as_a_separated_text_file(tmp_path, kind):
    texts = documents(300)
    common = dict(shuffle_block_tokens=2000, batch_mb=0.02)
    reference = prepare(config(tmp_path, "reference", **write_kind(tmp_path, KINDS[0], texts), **common))
    prepared = prepare(config(tmp_path, **write_kind(tmp_path, kind, texts), **common))
    assert prepared.meta["documents"] == 300 and prepared.meta["tokens"] == reference.meta["tokens"]
    assert shards(prepared) == shards(reference)


def test_separated_documents_are_the_documents_split_by_hand(tmp_path):
    texts = documents(50)
    prepared = prepare(config(tmp_path, **write_kind(tmp_path, KINDS[0], texts), tokenizer="char"))
    decoded = prepared.tokenizer().decode(np.concatenate([np.frombuffer(b, np.uint16) for b in shards(prepared)]))
    assert sorted(decoded.split(EOT)) == sorted(texts)  # one block: train + val is the shuffled stream


def test_a_corpus_within_one_block_is_shuffled_and_split_as_format_2_did(tmp_path):
    """Format 2 shuffled a whole corpus with datasets' shuffle (default_rng(seed).permutation
    over all documents, empty ones included), put the separator before every non-empty
    document but the one shuffled first, and held out the last val_fraction of tokens."""
    texts = documents(200)
    empty = (7, 50, 120)
    for i in empty:
        texts[i] = ""
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    encoding = Gpt2Tokenizer()
    first_is_empty = next(s for s in range(1000) if np.random.default_rng(s).permutation(len(texts))[0] in empty)
    for seed in (1337, first_is_empty):
        prepared = prepare(config(tmp_path, f"seed{seed}", path=str(rows), split_seed=seed))
        stream = []
        for position, index in enumerate(np.random.default_rng(seed).permutation(len(texts))):
            if texts[index]:
                stream += ([encoding.eot_id] if position > 0 else []) + encoding.encode(texts[index])
        n_train = int(len(stream) * 0.9)
        train, val = (np.frombuffer(b, np.uint16).tolist() for b in shards(prepared))
        assert (stream[0] == encoding.eot_id) == (seed == first_is_empty)
        assert train == stream[:n_train] and val == stream[n_train:]


def test_shards_depend_on_neither_batch_size_nor_threads(tmp_path):
    source = write_kind(tmp_path, "jsonl", documents(400))
    small = prepare(config(tmp_path, "a", **source, batch_mb=0.005, shuffle_block_tokens=3000))
    large = prepare(config(tmp_path, "b", **source, batch_mb=64, num_proc=2, shuffle_block_tokens=3000))
    assert shards(small) == shards(large)


def test_blocks_are_shuffled_by_the_seed_and_each_gives_val_its_share(tmp_path):
    texts = documents(2000)
    source = write_kind(tmp_path, "jsonl", texts)
    block = 5000
    prepared = prepare(config(tmp_path, "a", **source, shuffle_block_tokens=block, tokenizer="char"))
    tokens = prepared.meta["tokens"]
    total = sum(tokens.values())
    document_tokens = total - (2000 - 1)  # blocks are cut before the separators go in
    blocks = prepared.meta["blocks"]
    assert blocks == -(-document_tokens // block) > 10
    assert abs(tokens["val"] - 0.1 * total) <= blocks  # each block rounds its share down
    tokenizer = prepared.tokenizer()
    train, val = (tokenizer.decode(np.frombuffer(b, np.uint16)) for b in shards(prepared))
    val_documents = [int(n) for n in re.findall(r"document (\d{5})", val)]
    assert min(val_documents) < 200 and max(val_documents) > 1800  # val samples the whole corpus
    order = [int(n) for n in re.findall(r"document (\d{5})", train)]
    seen = set(order) | set(val_documents)  # a header cut by the val boundary (one per block) is missed
    assert order != sorted(order) and seen <= set(range(2000)) and len(seen) >= 2000 - prepared.meta["blocks"]
    again = prepare(config(tmp_path, "b", **source, shuffle_block_tokens=block, tokenizer="char"))
    reseeded = prepare(config(tmp_path, "c", **source, shuffle_block_tokens=block, tokenizer="char", split_seed=7))
    assert shards(again) == shards(prepared) and shards(reseeded) != shards(prepared)


def test_memory_holds_a_batch_and_a_block_not_the_corpus(tmp_path):
    """tracemalloc sees every Python and NumPy allocation: a whole-file read, a corpus-sized
    list of ids or an unbounded batch would each show up in its peak."""
    (tmp_path / "big.txt").write_text("\n\n".join(documents(60000)), encoding="utf-8")
    jsonl = write_kind(tmp_path, "jsonl", documents(60000, seed=1))
    Gpt2Tokenizer()  # built once per process (and cached): its construction is not the corpus's memory
    for name, source in (("text", dict(path=str(tmp_path / "big.txt"))), ("jsonl", jsonl)):
        size = os.path.getsize(source["path"])
        cfg = config(tmp_path, name, **source, batch_mb=0.25, shuffle_block_tokens=1 << 16)
        tracemalloc.start()
        try:
            prepare(cfg)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert size > 11e6 and peak < 6e6, f"{name}: {peak / 1e6:.1f} MB at peak for a {size / 1e6:.0f} MB corpus"


def test_a_document_running_over_a_block_end_continues_first_in_the_next(tmp_path):
    """The long document is upper case, the others lower case: its text continuing after
    another document without a separator would show as a lower-case letter before an upper-case one."""
    texts = ["ABCDEFGHIJ" * 250 + "ABCDE"] + [f"short doc {i} text here." for i in range(300)]  # ends mid-block
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    prepared = prepare(config(tmp_path, path=str(rows), tokenizer="char", shuffle_block_tokens=1000))
    tokenizer = prepared.tokenizer()
    train, val = (tokenizer.decode(np.frombuffer(b, np.uint16)) for b in shards(prepared))
    assert prepared.meta["blocks"] > 3 and train.count("A") + val.count("A") == 251
    assert re.search(r"[a-z0-9 .][A-Z]", train) is None and re.search(r"[a-z0-9 .][A-Z]", val) is None


def test_a_json_array_file_reads_like_json_lines(tmp_path):
    rows = [{"text": text} for text in documents(30)]
    (tmp_path / "rows.json").write_text(json.dumps(rows, indent=1))
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    as_array = prepare(config(tmp_path, "a", path=str(tmp_path / "rows.json")))
    assert shards(as_array) == shards(prepare(config(tmp_path, "b", path=str(tmp_path / "rows.jsonl"))))
    (tmp_path / "bad.json").write_text('[{"text": "x"}, {"body": "y"}]')
    with pytest.raises(DataError, match=r"element 1 of the JSON array in .*bad.json has no 'text' text"):
        prepare(config(tmp_path, "c", path=str(tmp_path / "bad.json")))


def test_max_documents_reads_no_further(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"text": "one"}\n{"text": "two"}\n{"text": "three"}\nthis line is not JSON\n')
    assert prepare(config(tmp_path, path=str(rows), max_documents=3, val_fraction=0.3)).meta["documents"] == 3
    with pytest.raises(DataError, match=r"line 4 of .*rows.jsonl is not valid JSON"):
        prepare(config(tmp_path, "all", path=str(rows), val_fraction=0.3))


def test_a_hub_dataset_with_max_documents_is_streamed_not_downloaded(tmp_path, monkeypatch):
    seen = []

    def fake_load(cfg, streaming):
        seen.append(streaming)
        raise DataError("stop here")

    monkeypatch.setattr(data.hub, "_load_hub", fake_load)
    cfg = DataConfig(source="hub", dataset="someone/huge", data_dir=str(tmp_path / "d"))
    for limit in (None, 10):
        with pytest.raises(DataError, match="stop here"):
            hub_corpus(dataclasses.replace(cfg, max_documents=limit), piece_chars=1000)
    assert seen == [False, True]


def test_a_local_directory_in_place_of_a_presets_hub_id_names_the_hub_only_settings(tmp_path):
    write_kind(tmp_path, "jsonl", documents(5))
    cfg = DataConfig(
        source="hub",
        dataset=str(tmp_path / "jsonl"),
        subset="sample-10BT",
        streaming=True,
        data_dir=str(tmp_path / "d"),
    )
    with pytest.raises(
        DataError,
        match=r"a local directory replaces the Hub id here: data.subset='sample-10BT' "
        r"names a configuration the directory may lack \(set data.subset=null\)",
    ):
        prepare(cfg)
    assert prepare(dataclasses.replace(cfg, subset=None, val_fraction=0.5)).meta["documents"] == 5


def test_a_datasets_failure_names_its_innermost_cause(tmp_path):
    try:
        try:
            raise OSError("ArrowCapacityError: array cannot contain more than 2147483646 bytes")
        except OSError as capacity:
            raise RuntimeError("An error occurred while generating the dataset") from capacity
    except RuntimeError as wrapped:
        assert describe_error(wrapped) == (
            "RuntimeError: An error occurred while generating the dataset; caused by "
            "OSError: ArrowCapacityError: array cannot contain more than 2147483646 bytes"
        )
    (tmp_path / "hub").mkdir()
    (tmp_path / "hub" / "train.jsonl").write_text('{"text": "fine"}\n{"text": broken\n')
    cfg = DataConfig(source="hub", dataset=str(tmp_path / "hub"), streaming=True, data_dir=str(tmp_path / "d"))
    with pytest.raises(DataError, match=r"could not read data.dataset=.* through datasets \(ArrowInvalid: JSON parse"):
        prepare(cfg)


def test_the_default_cache_inside_the_data_directory_is_removed_unless_kept(tmp_path):
    source = write_kind(tmp_path, "hub stream", documents(20))
    for keep in (False, True):
        cfg = config(tmp_path, f"keep_{keep}", **source, keep_hf_cache=keep, val_fraction=0.3)
        cfg.resolved_hf_cache_dir().mkdir(parents=True)  # as a download would leave it
        prepare(cfg)
        assert cfg.resolved_hf_cache_dir().exists() == keep


def test_threads_default_to_the_cores_this_process_may_use(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3, 5, 7}, raising=False)
    assert DataConfig().resolved_num_proc() == 3 and DataConfig(num_proc=1).resolved_num_proc() == 1


def test_new_settings_are_checked():
    for field, value, rule in [
        ("batch_mb", 0, "> 0"),
        ("shuffle_block_tokens", 0, ">= 1"),
        ("document_separator", "", "a non-empty text"),
    ]:
        with pytest.raises(ValueError, match=f"data.{field} must be {rule}, got"):
            DataConfig(**{field: value})
