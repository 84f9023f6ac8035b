"""BatchLoader: windows from the memmap, determinism by step, disjoint ranks, clear errors."""

import json

import numpy as np
import pytest
import torch

from data import BatchLoader, DataConfig, DataError, prepare

BLOCK, BATCH = 8, 4


def write_shards(directory, n_train=5000, n_val=3000, dtype="uint16"):
    """Shards whose token at offset i is i, so a window names its own start."""
    directory.mkdir(parents=True, exist_ok=True)
    np.arange(n_train, dtype=dtype).tofile(directory / "train.bin")
    np.arange(n_val, dtype=dtype).tofile(directory / "val.bin")
    meta = {
        "format": 1,
        "tokens": {"train": n_train, "val": n_val},
        "dtype": dtype,
        "tokenizer": {"name": "gpt2"},
        "vocab_size": max(n_train, n_val),
    }  # format 1 predates digests: hand-made shards need none
    (directory / "meta.json").write_text(json.dumps(meta))
    return directory


def loader(directory, **overrides) -> BatchLoader:
    settings = dict(split="train", block_size=BLOCK, batch_size=BATCH, seed=7)
    return BatchLoader(directory, **{**settings, **overrides})


def test_x_and_y_are_windows_shifted_by_one(tmp_path):
    batches = loader(write_shards(tmp_path))
    assert isinstance(batches.tokens, np.memmap)
    x, y = batches.get_batch(0)
    assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (BATCH, BLOCK)
    starts = batches.window_starts(0)
    assert x.tolist() == [list(range(s, s + BLOCK)) for s in starts]
    assert y.tolist() == [list(range(s + 1, s + BLOCK + 1)) for s in starts]


def test_windows_reach_the_last_token_and_never_past_it(tmp_path):
    batches = loader(write_shards(tmp_path, n_train=BLOCK + 4), batch_size=4)
    assert sorted(batches.window_starts(0)) == [0, 1, 2, 3]  # every window there is, once
    _, y = batches.get_batch(0)
    assert int(y.max()) == BLOCK + 3


def test_same_step_same_batch_whether_straight_or_resumed(tmp_path):
    write_shards(tmp_path)
    straight = loader(tmp_path)
    run = [straight.get_batch(step) for step in range(10)]
    resumed = loader(tmp_path)  # a new process picking up at step 5
    for step in range(5, 10):
        assert all(torch.equal(a, b) for a, b in zip(resumed.get_batch(step), run[step]))
    assert torch.equal(straight.get_batch(3)[0], run[3][0])
    assert len({tuple(x.flatten().tolist()) for x, _ in run}) == 10, "steps draw different batches"


def test_seed_and_split_change_the_draw(tmp_path):
    write_shards(tmp_path, n_train=4000, n_val=4000)
    base = loader(tmp_path).window_starts(0)
    assert not np.array_equal(base, loader(tmp_path, seed=8).window_starts(0))
    assert not np.array_equal(base, loader(tmp_path, split="val").window_starts(0))


def test_ranks_take_disjoint_slices_of_one_global_batch(tmp_path):
    write_shards(tmp_path)
    world = 4
    single = loader(tmp_path, batch_size=BATCH * world).window_starts(11)
    per_rank = [loader(tmp_path, rank=r, world_size=world).window_starts(11) for r in range(world)]
    assert np.array_equal(np.concatenate(per_rank), single)
    assert len(set(single.tolist())) == BATCH * world, "no two ranks share a window"


def test_ranks_see_what_one_process_sees_with_accumulation(tmp_path):
    world = 2
    write_shards(tmp_path)
    accumulated = [loader(tmp_path, accum_steps=world).window_starts(5, m) for m in range(world)]
    ranks = [loader(tmp_path, rank=r, world_size=world).window_starts(5) for r in range(world)]
    assert all(np.array_equal(a, r) for a, r in zip(accumulated, ranks))
    assert not np.array_equal(accumulated[0], accumulated[1])
    with pytest.raises(AssertionError):  # an invariant of the caller, train.py
        loader(tmp_path, accum_steps=world).window_starts(5, 2)


def test_a_prepared_corpus_batches_back_to_its_text(tmp_path):
    text = "It is a truth universally acknowledged, that a single man in possession of a good fortune...\n" * 3
    (tmp_path / "book.txt").write_text(text)
    cfg = DataConfig(
        name="book",
        source="files",
        path=str(tmp_path / "book.txt"),
        tokenizer="char",
        data_dir=str(tmp_path / "data"),
        hf_cache_dir=str(tmp_path / "hf"),
        num_proc=1,
    )
    prepared = prepare(cfg)
    x, y = BatchLoader(prepared.data_dir, "val", block_size=16, batch_size=2, seed=0).get_batch(0)
    tokenizer = prepared.tokenizer()
    for row_x, row_y in zip(x.tolist(), y.tolist()):
        assert tokenizer.decode(row_x) in text and tokenizer.decode(row_x)[1:] == tokenizer.decode(row_y)[:-1]


@pytest.mark.cuda
def test_cuda_batches_arrive_on_the_device_unchanged(tmp_path):
    write_shards(tmp_path)
    x_cpu, y_cpu = loader(tmp_path).get_batch(2)
    x, y = loader(tmp_path, device="cuda").get_batch(2)
    assert x.is_cuda and torch.equal(x.cpu(), x_cpu) and torch.equal(y.cpu(), y_cpu)


def test_missing_or_malformed_meta_json(tmp_path):
    with pytest.raises(DataError, match=r"meta.json does not exist: run the prepare step"):
        loader(tmp_path)
    write_shards(tmp_path)
    (tmp_path / "meta.json").write_text("{not json")
    with pytest.raises(DataError, match="is not valid JSON"):
        loader(tmp_path)
    (tmp_path / "meta.json").write_text(json.dumps({"tokens": {"train": 5}, "dtype": "float32"}))
    with pytest.raises(DataError, match="lacks valid 'format', 'tokens', 'dtype', 'tokenizer' or 'vocab_size'"):
        loader(tmp_path)


def test_missing_or_corrupt_shard(tmp_path):
    write_shards(tmp_path)
    (tmp_path / "val.bin").unlink()
    with pytest.raises(DataError, match=r"val.bin is missing although meta.json describes it"):
        loader(tmp_path, split="val")
    with open(tmp_path / "train.bin", "r+b") as f:
        f.truncate(9999)
    with pytest.raises(
        DataError, match=r"train.bin is 9999 bytes but meta.json promises 5000 uint16 tokens \(10000 bytes\)"
    ):
        loader(tmp_path)


def test_unreadable_shard(tmp_path, monkeypatch):
    write_shards(tmp_path)

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(np, "memmap", refuse)
    with pytest.raises(DataError, match=r"cannot memory-map .*train.bin: .*Permission denied"):
        loader(tmp_path)


@pytest.mark.parametrize("n_train", [0, BLOCK])
def test_corpus_shorter_than_a_window(tmp_path, n_train):
    write_shards(tmp_path, n_train=n_train)
    with pytest.raises(DataError, match=rf"train split has {n_train} tokens, fewer than block_size \+ 1 = {BLOCK + 1}"):
        loader(tmp_path)


def test_too_few_windows_for_a_step(tmp_path):
    write_shards(tmp_path, n_train=BLOCK + 6)
    with pytest.raises(DataError, match=r"6 distinct windows .* batch_size \* world_size \* accum_steps = 8"):
        loader(tmp_path, batch_size=4, world_size=2)


@pytest.mark.parametrize(
    "overrides", [dict(block_size=0), dict(batch_size=0), dict(seed=-1), dict(rank=2, world_size=2)]
)
def test_sizes_are_the_callers_invariants(tmp_path, overrides):  # train.py's config refuses bad ones, naming them
    write_shards(tmp_path)
    with pytest.raises(AssertionError):
        loader(tmp_path, **overrides)
    with pytest.raises(AssertionError):
        loader(tmp_path).get_batch(-1)


def test_an_unknown_split_is_refused(tmp_path):
    write_shards(tmp_path)
    with pytest.raises(ValueError, match=r"split must be one of \('train', 'val'\)"):
        loader(tmp_path, split="test")
