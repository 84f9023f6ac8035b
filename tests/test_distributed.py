"""DDP on the CPU: two gloo processes launched by torchrun, against one process; and the
random streams of a run resumed on another number of processes."""

import os
import random
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

from conf import Config
from conftest import tiny_config, training_overrides
from model import GPT
from run.checkpoints import Checkpoints, find_checkpoint, load_checkpoint
from run.distributed import Ranks
from run.metrics import read_metrics
from run.runtime import resolve_precision, rng_state, set_rng_state
from training.evaluate import Evaluator
from training.optim import build_optimizer

CPU = torch.device("cpu")

REPO = Path(__file__).resolve().parents[1]
STEPS = ["max_iters=6", "eval_interval=3", "model.dropout=0.0"]


def train_command(*overrides, processes=1):
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    return [*(launcher if processes > 1 else [sys.executable]), str(REPO / "train.py"), *overrides]


def run(command, cwd):
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def final_weights(run_dir):
    return load_checkpoint(find_checkpoint(run_dir, runs_root=run_dir.parent)).model_state


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One process accumulating 4 micro-batches of 2, and 2 processes accumulating 2
    each: the same 8 sequences per step, so a sync on the wrong micro-step, or ranks
    reading overlapping windows, changes the weights."""
    directory = tmp_path_factory.mktemp("ddp")
    overrides = training_overrides(directory)
    single = directory / "single"
    run(train_command(*overrides, *STEPS, "batch_size=2", "grad_accum_steps=4", f"out_dir={single}"), directory)
    ddp_root = directory / "ddp_runs"
    run(
        train_command(*overrides, *STEPS, "batch_size=2", "grad_accum_steps=2", f"runs_root={ddp_root}", processes=2),
        directory,
    )
    return directory, overrides, single, ddp_root


def test_two_processes_leave_exactly_one_run_directory(runs):
    _, _, _, ddp_root = runs
    assert len(list(ddp_root.iterdir())) == 1  # not one per rank (hydra issue 2070)


def test_two_processes_train_the_same_weights_as_one_process_accumulating(runs):
    _, _, single, ddp_root = runs
    ddp = next(ddp_root.iterdir())
    single_state, ddp_state = final_weights(single), final_weights(ddp)
    assert single_state.keys() == ddp_state.keys()
    for name in single_state:
        # Summation order differs (4 micro-steps vs 2 x 2 ranks): ~1e-5 apart after 6
        # steps at lr 1e-2, where any mistake in the sync or the windows moves weights ~1e-2.
        torch.testing.assert_close(ddp_state[name], single_state[name], rtol=0, atol=1e-4, msg=name)
    single_losses = [r["loss"] for r in read_metrics(single) if r["kind"] == "train"]
    ddp_losses = [r["loss"] for r in read_metrics(ddp) if r["kind"] == "train"]
    assert ddp_losses == pytest.approx(single_losses, rel=1e-5)
    assert len(ddp_losses) == 6


def test_every_rank_evaluates_and_the_result_does_not_depend_on_the_number_of_ranks(runs):
    _, _, single, ddp_root = runs
    ddp = next(ddp_root.iterdir())
    evals = [
        [(r["step"], r["val_loss"], r["train_loss"]) for r in read_metrics(d) if r["kind"] == "eval"]
        for d in (single, ddp)
    ]
    assert [s for s, _, _ in evals[1]] == [0, 3, 6]
    for (_, *a), (_, *b) in zip(*evals):
        assert a == pytest.approx(b, rel=1e-5)


def test_ranks_draw_different_dropout_masks_and_resume_their_own_streams(runs, tmp_path):
    directory, overrides, _, _ = runs
    common = [*overrides, "eval_interval=2", "model.dropout=0.1", "grad_accum_steps=2"]
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    run(train_command(*common, "max_iters=4", f"out_dir={straight}", processes=2), directory)
    run(train_command(*common, "max_iters=2", f"out_dir={interrupted}", processes=2), directory)
    resumed = run(train_command(f"resume={interrupted}", "max_iters=4", processes=2), directory)
    assert f"resumed from {interrupted.resolve()}/checkpoints/step_000002 at step 2; 2 steps to go" in resumed.stdout

    streams = load_checkpoint(find_checkpoint(straight, runs_root=tmp_path)).training_state()["rng"]
    assert len(streams) == 2
    assert not torch.equal(streams[0]["torch"], streams[1]["torch"])  # each rank its own dropout masks
    train_losses = [[r["loss"] for r in read_metrics(d) if r["kind"] == "train"] for d in (straight, interrupted)]
    assert train_losses[0] == train_losses[1] and len(train_losses[0]) == 4  # each rank resumed its own stream


# --- a resume on another number of processes: fresh streams, from the right seed --------------------


def saved_by_processes(run_dir, processes):
    """A checkpoint at step 5 whose state holds `processes` ranks' random streams."""
    model = GPT(tiny_config())
    state = {
        "step": 5,
        "best_val_loss": 2.0,
        "scaler": {},
        "rng": [rng_state(CPU)] * processes,
        "optimizer": build_optimizer(model, Config().optim, "cpu").state_dict(),
    }
    config = {"model": asdict(model.config), "data": {"name": "test"}, "tokenizer": {"name": "char"}}
    return load_checkpoint(Checkpoints(run_dir).save(5, model, config, state))


def first_draws(checkpoint, rank, world_size, **settings):
    """What torch, numpy and Python's random draw first after restoring checkpoint on rank
    `rank` of world_size under the settings."""
    config, model = Config(**settings), GPT(checkpoint.model_config)
    scaler = resolve_precision("fp32", CPU).grad_scaler()
    Checkpoints(checkpoint.run_dir).restore(
        checkpoint,
        model,
        build_optimizer(model, config.optim, "cpu"),
        scaler,
        config,
        Ranks(rank, rank, world_size),
        CPU,
    )
    return torch.rand(1).item(), float(np.random.rand()), random.random()


def draws_after_seeding(seed):
    return (
        torch.rand(1, generator=torch.Generator().manual_seed(seed)).item(),
        float(np.random.RandomState(seed).rand()),
        random.Random(seed).random(),
    )


@pytest.mark.parametrize("saved_by, world_size", [(2, 1), (1, 2)])
def test_a_resume_on_another_number_of_processes_reseeds_every_stream_from_the_weights_seed(
    tmp_path, saved_by, world_size
):
    """The saved streams do not fit, so each rank seeds torch, numpy and Python afresh from
    (the seed of weights and dropout, its rank, the step): seed_scope=data leaves that seed
    at 0 whatever `seed` is, seed_scope=weights makes it `seed`."""
    checkpoint = saved_by_processes(tmp_path, saved_by)
    kept = rng_state(CPU)
    try:
        for rank in range(world_size):
            expected = {
                seed: draws_after_seeding(int(np.random.SeedSequence([seed, rank, 5]).generate_state(1)[0]))
                for seed in (0, 7)
            }
            assert first_draws(checkpoint, rank, world_size, seed=7, seed_scope="data") == expected[0]
            assert first_draws(checkpoint, rank, world_size, seed=8, seed_scope="data") == expected[0]
            assert first_draws(checkpoint, rank, world_size, seed=7, seed_scope="weights") == expected[7]
            assert first_draws(checkpoint, rank, world_size, seed=7, seed_scope="all") == expected[7]
    finally:
        set_rng_state(kept, CPU)


def _evaluate_on_rank(rank, world_size, port, data_dir, out_dir):
    import json

    import torch.distributed as dist

    from run.runtime import resolve_precision
    from training.evaluate import Evaluator

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        torch.manual_seed(0)
        model = GPT(tiny_config(vocab_size=64, block_size=32))
        evaluate = Evaluator(
            data_dir,
            block_size=32,
            batch_size=2,
            whole_val="never",
            eval_iters=5,
            token_bytes=[1] * 64,
            precision=resolve_precision("fp32", CPU),
            ranks=Ranks(rank, 0, world_size),
            device=CPU,
        )
        asked = []
        for loader in evaluate.loaders.values():
            original = loader.get_batch
            loader.get_batch = lambda i, _original=original: (asked.append(i), _original(i))[1]
        metrics = evaluate(model)
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps({"asked": asked, "metrics": metrics}))
    finally:
        dist.destroy_process_group()


def test_each_rank_evaluates_its_own_share_of_the_batches(runs, tmp_path):
    """Batch i goes to rank i mod 2, and the all-reduced result is one process's."""
    import json
    import socket

    import torch.multiprocessing as mp

    directory = runs[0]
    data_dir = next((directory / "data").rglob("meta.json")).parent
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_evaluate_on_rank, args=(2, port, data_dir, tmp_path), nprocs=2)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["asked"] == [0, 2, 4] * 2 and ranks[1]["asked"] == [1, 3] * 2  # train and val splits

    torch.manual_seed(0)
    alone = Evaluator(
        data_dir,
        block_size=32,
        batch_size=2,
        whole_val="never",
        eval_iters=5,
        token_bytes=[1] * 64,
        precision=resolve_precision("fp32", CPU),
        ranks=Ranks(),
        device=CPU,
    )
    expected = alone(GPT(tiny_config(vocab_size=64, block_size=32)))
    for rank in ranks:
        assert rank["metrics"] == pytest.approx(expected, rel=1e-6)


def test_mfu_under_ddp_is_per_device(runs):
    _, _, _, ddp_root = runs
    ddp = next(ddp_root.iterdir())
    config = load_checkpoint(find_checkpoint(ddp, runs_root=ddp_root)).model_config
    flops_per_token = GPT(config).flops_per_token(config.block_size)
    for record in (r for r in read_metrics(ddp) if r["kind"] == "train"):
        # tok_per_s counts both processes; each device does half of it (peak_flops=1e12 per device)
        assert record["mfu"] == pytest.approx(flops_per_token * record["tok_per_s"] / 2 / 1e12)


def test_shutdown_frees_the_group_before_the_interpreter_exits(tmp_path):
    """DDP holds the process group through reference cycles; if the group outlived
    shutdown(), gloo would tear it down during interpreter finalization, where it can
    abort a run that had finished (SIGABRT after the last checkpoint)."""
    import gc
    import weakref

    import torch.distributed as dist

    from run.distributed import shutdown

    def wrapped_model_goes_out_of_scope():
        ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
        ddp(torch.randn(2, 4)).sum().backward()
        # DDP builds its own cycle in a fresh process, but not after an earlier test in this
        # process has run a fused optimizer step: the cycle is made explicit here.
        ddp.held_by_a_cycle = [ddp]
        return weakref.ref(ddp)

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    gc.disable()  # only shutdown's own collections may free the cycle
    try:
        ddp = wrapped_model_goes_out_of_scope()
        assert ddp() is not None  # held by its cycle, as in train.py
        shutdown(Ranks())
        assert ddp() is None and not dist.is_initialized()
    finally:
        gc.enable()
        if dist.is_initialized():
            dist.destroy_process_group()
