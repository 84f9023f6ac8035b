"""Evaluation: the same windows for every seed, the whole val split on request, the
standard error of each loss and bits per byte, checked against plain torch on the same tokens."""

import json
import math
import statistics

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir

import train
from conf import CONF_DIR
from conftest import training_overrides
from data import BatchLoader
from model import GPT
from run.checkpoints import find_checkpoint, load_checkpoint, load_weights
from run.distributed import Ranks
from run.metrics import read_metrics
from run.runtime import resolve_precision
from training.evaluate import EVAL_SEED, Evaluator

CPU = torch.device("cpu")
BATCH, BLOCK, ITERS = 4, 32, 2


def run(directory, *overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="train", overrides=[*training_overrides(directory), *overrides])
    return train.train(cfg)


def evals(run_dir):
    return [r for r in read_metrics(run_dir) if r["kind"] == "eval"]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A trained tiny run, evaluated on the whole val split at its end only."""
    directory = tmp_path_factory.mktemp("evaluate")
    run_dir = run(
        directory, "max_iters=4", "eval_interval=2", "eval_whole_val=final", f"out_dir={directory / 'source'}"
    )
    return directory, run_dir


def trained(run_dir):
    checkpoint = load_checkpoint(find_checkpoint(run_dir, run_dir.parent))
    model = GPT(checkpoint.model_config)
    load_weights(model, checkpoint.model_state)
    return model.eval()


def window_losses(model, windows):
    """Each (T + 1)-token window's mean next-token loss, one window at a time."""
    with torch.no_grad():
        return [F.cross_entropy(model(w[None, :-1])[0][0], w[1:]).item() for w in windows]


def data_dir_of(directory):
    return next((directory / "data").rglob("meta.json")).parent


def sampled_windows(directory, split="val"):
    """The (T + 1)-token windows a sampled evaluation reads, drawn by the loader."""
    loader = BatchLoader(data_dir_of(directory), split, BLOCK, BATCH, EVAL_SEED)
    return [
        torch.from_numpy(loader.tokens[s : s + BLOCK + 1].astype(np.int64))
        for i in range(ITERS)
        for s in loader.window_starts(i)
    ]


def test_runs_of_different_seeds_are_evaluated_on_the_same_windows(source):
    """Two runs starting from the same weights under seeds 5 and 6: their step-0
    evaluations see one model, so they agree exactly only if the windows do."""
    directory, run_dir = source
    starts = [
        evals(
            run(
                directory,
                "init_from=checkpoint",
                f"model_path={run_dir}",
                "max_iters=1",
                "eval_interval=1",
                f"seed={seed}",
                f"out_dir={directory / f'seed{seed}'}",
            )
        )[0]
        for seed in (5, 6)
    ]
    for split in ("train", "val"):
        assert starts[0][f"{split}_loss"] == starts[1][f"{split}_loss"]
        assert starts[0][f"{split}_windows"] == ITERS * BATCH


def test_a_sampled_evaluation_is_the_mean_of_its_windows_with_their_standard_error(source):
    directory, run_dir = source
    model = trained(run_dir)
    losses = window_losses(model, sampled_windows(directory))
    metrics = evaluator(directory, "never")(model)
    assert metrics["val_windows"] == ITERS * BATCH
    assert metrics["val_loss"] == pytest.approx(statistics.mean(losses), rel=1e-6)
    assert metrics["val_loss_se"] == pytest.approx(statistics.stdev(losses) / math.sqrt(len(losses)), rel=1e-5)


def test_the_whole_split_covers_every_non_overlapping_window_at_the_final_evaluation(source):
    directory, run_dir = source
    model = trained(run_dir)
    data_dir = data_dir_of(directory)
    dtype = json.loads((data_dir / "meta.json").read_text())["dtype"]
    tokens = np.fromfile(data_dir / "val.bin", dtype=dtype).astype(np.int64)
    count = (len(tokens) - 1) // BLOCK  # windows of BLOCK + 1 tokens, BLOCK apart
    windows = [torch.from_numpy(tokens[k * BLOCK : (k + 1) * BLOCK + 1]) for k in range(count)]
    losses = window_losses(model, windows)
    records = evals(run_dir)
    assert [r["val_windows"] for r in records] == [ITERS * BATCH] * 2 + [count]  # steps 0 and 2 sampled, 4 whole
    assert [r["train_windows"] for r in records] == [ITERS * BATCH] * 3
    final = records[-1]
    assert final["val_loss"] == pytest.approx(statistics.mean(losses), rel=1e-5)
    assert final["val_loss_se"] == pytest.approx(statistics.stdev(losses) / math.sqrt(count), rel=1e-4)
    always = evaluator(directory, "always")(model)
    assert always["val_windows"] == count and always["val_loss"] == pytest.approx(final["val_loss"], rel=1e-6)


def evaluator(directory, whole_val, ranks=None, token_bytes=(1,) * 64):
    return Evaluator(
        data_dir_of(directory),
        block_size=BLOCK,
        batch_size=BATCH,
        eval_iters=ITERS,
        whole_val=whole_val,
        token_bytes=list(token_bytes),
        precision=resolve_precision("fp32", CPU),
        ranks=ranks or Ranks(),
        device=CPU,
    )


def test_bits_per_byte_are_the_total_loss_over_the_bytes_of_the_target_tokens(source):
    """With tokens of 1 to 4 bytes in no pattern, counting the inputs' bytes (each window
    shifted by one token) gives another figure."""
    directory, run_dir = source
    model = trained(run_dir)
    token_bytes = torch.randint(1, 5, (64,), generator=torch.Generator().manual_seed(3)).tolist()
    windows = sampled_windows(directory)
    with torch.no_grad():
        total = sum(F.cross_entropy(model(w[None, :-1])[0][0], w[1:], reduction="sum").item() for w in windows)
    target_bytes = sum(token_bytes[t] for w in windows for t in w[1:].tolist())
    input_bytes = sum(token_bytes[t] for w in windows for t in w[:-1].tolist())
    assert abs(input_bytes - target_bytes) > 1e-3 * target_bytes  # the two counts are told apart
    metrics = evaluator(directory, "never", token_bytes=token_bytes)(model)
    assert metrics["val_bpb"] == pytest.approx(total / (math.log(2) * target_bytes), rel=1e-6)


def test_the_whole_split_is_shared_out_among_ranks_batch_by_batch(source):
    directory, _ = source
    alone = [x for x, _ in evaluator(directory, "always")._whole(evaluator(directory, "always").loaders["val"])]
    shares = []
    for rank in range(2):
        e = evaluator(directory, "always", Ranks(rank=rank, world_size=2))
        shares.append([x for x, _ in e._whole(e.loaders["val"])])
    assert len(shares[0]) + len(shares[1]) == len(alone) > 2
    for i, batch in enumerate(alone):
        assert torch.equal(shares[i % 2][i // 2], batch)


def test_a_batch_runs_through_the_model_a_micro_batch_at_a_time_with_the_same_figures(source):
    """eval_batch_size windows a batch, a smaller micro-batch (batch_size=auto's choice) at a time:
    the same windows, so the same figures, sampled and whole."""
    directory, run_dir = source
    model = trained(run_dir)
    for whole_val in ("never", "always"):
        whole = evaluator(directory, whole_val)(model)
        pieces = Evaluator(
            data_dir_of(directory),
            block_size=BLOCK,
            batch_size=BATCH,
            micro_batch=BATCH // 2 - 1,
            eval_iters=ITERS,
            whole_val=whole_val,
            token_bytes=[1] * 64,
            precision=resolve_precision("fp32", CPU),
            ranks=Ranks(),
            device=CPU,
        )(model)
        assert pieces.keys() == whole.keys()
        assert all(pieces[k] == pytest.approx(whole[k], rel=1e-6) for k in whole)
