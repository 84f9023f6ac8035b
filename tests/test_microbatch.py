"""batch_size=auto on the CPU: the search of training/microbatch.py, run against an injected
memory limit (bench/memory_fit.py's CountedMemory: every allocation counted,
torch.OutOfMemoryError past the limit), so the code that runs is the code CUDA runs; the
plan's micro-batches; the refused settings; the out-of-memory advice."""

import math
import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import train
from bench.memory_fit import CountedMemory
from conf import CONF_DIR, Config, load_config
from conftest import tiny_config
from model import GPT
from run.distributed import Ranks
from run.metrics import read_metrics
from run.runtime import resolve_precision
from system import UserError
from test_train import run_in_process
from training import microbatch
from training.microbatch import (
    MARGIN,
    Plan,
    Trial,
    choose_micro_batch,
    largest_that_fits,
    out_of_memory_advice,
    plan_micro_batches,
)
from training.optim import build_optimizer
from training.step import RandomBatches, Trainer, train_step

CUDA = torch.device("cuda")  # plan_micro_batches only reads its type


def config(**settings) -> Config:
    base = dict(batch_size="auto", tokens_per_step=16 * 16, device="cpu", precision="fp32")
    return Config(**{**base, **settings})


def measured_peaks(model: GPT, sizes, accum: int = 2) -> dict[int, int]:
    """Each micro-batch's peak, measured by an independent step: forward and backward over two
    micro-batches, AdamW's update, twice (the second with its moments), with no limit."""
    peaks = {}
    for size in sizes:
        meter = CountedMemory()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randint(model.config.vocab_size, (size, model.config.block_size))
        with meter.watch():
            for _ in range(2):
                for _ in range(accum):
                    model(x, x)[1].backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            del optimizer
        peaks[size] = meter.peak()
    return peaks


def test_the_plan_keeps_tokens_per_step_with_every_micro_batch_it_may_choose():
    plan = plan_micro_batches(config(tokens_per_step=96 * 16 * 2), block_size=16, world_size=2, device=CUDA)
    assert plan.sizes == tuple(s for s in range(96, 0, -1) if 96 % s == 0) and plan.auto
    assert all(size * plan.accum(size) * 16 * 2 == 96 * 16 * 2 for size in plan.sizes)
    fixed = plan_micro_batches(config(batch_size=8, tokens_per_step=96 * 16), 16, 1, torch.device("cpu"))
    assert (fixed.sizes, fixed.accum(8), fixed.auto) == ((8,), 12, False)
    with pytest.raises(ValueError, match=r"batch_size=auto searches a GPU's memory, and this run is on cpu"):
        plan_micro_batches(config(), 16, 1, torch.device("cpu"))
    with pytest.raises(ValueError, match=r"tokens_per_step \(100\) must be a multiple of block_size \* world_size"):
        plan_micro_batches(config(tokens_per_step=100), 16, 1, CUDA)


def test_bisection_finds_the_largest_size_that_fits_in_few_trials():
    rng = random.Random(0)
    for _ in range(200):
        sizes = tuple(sorted(rng.sample(range(1, 600), rng.randint(1, 30)), reverse=True))
        threshold = rng.randint(0, 650)
        tried = []
        chosen = largest_that_fits(sizes, lambda s: tried.append(s) or s <= threshold)
        assert chosen == max((s for s in sizes if s <= threshold), default=None)  # brute force
        assert len(tried) <= math.ceil(math.log2(len(sizes) + 1))


@pytest.mark.parametrize("fits", [1, 2, 4, 8])
def test_auto_chooses_the_largest_micro_batch_under_an_injected_limit(fits, monkeypatch):
    torch.manual_seed(0)
    model = GPT(tiny_config())
    peaks = measured_peaks(model, (1, 2, 4, 8, 16))
    # The margin's line falls midway between the peaks of `fits` and the next size.
    limit = (peaks[fits] + peaks[fits * 2]) / 2 / (1 - MARGIN)
    monkeypatch.setattr(microbatch, "device_memory", lambda device: CountedMemory(limit))
    cfg = config()
    plan = Plan((16, 8, 4, 2, 1), sequences=16, auto=True)
    chosen = choose_micro_batch(
        plan,
        model,
        model,
        cfg,
        resolve_precision("fp32", torch.device("cpu")),
        Ranks(),
        torch.device("cpu"),
        vocab_size=97,
    )
    assert chosen.size == fits and chosen.size * chosen.accum == 16  # tokens_per_step kept
    assert chosen.peak == chosen.tried[fits] <= (1 - MARGIN) * limit and chosen.capacity == int(limit)
    assert any(peak is None for peak in chosen.tried.values())  # a trial ran out of memory on the way


def test_a_trial_that_runs_out_of_memory_leaves_the_run_as_it_was(monkeypatch):
    torch.manual_seed(0)
    model = GPT(tiny_config(dropout=0.1))
    cpu = torch.device("cpu")
    precision = resolve_precision("fp32", cpu)
    optimizer = build_optimizer(model, config().optim, "cpu")  # the run's, with a resume's moments
    trainer = Trainer(
        model, optimizer, precision.grad_scaler(), precision.autocast(), accum_steps=1, grad_clip=1.0, ranks=Ranks()
    )
    train_step(trainer, RandomBatches(97, 2, 16, cpu), 0)
    memory = CountedMemory(measured_peaks(model, (2,))[2] * 1.05)  # the first trial, 4, raises
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    moments = {k: v.clone() for k, v in optimizer.state_dict()["state"][0].items()}
    rng = torch.get_rng_state()
    monkeypatch.setattr(microbatch, "device_memory", lambda device: memory)
    live = memory.live
    chosen = choose_micro_batch(Plan((16, 8, 4, 2, 1), 16, True), model, model, config(), precision, Ranks(), cpu, 97)
    assert chosen.tried[4] is None and chosen.size < 4
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(v, moments[k]) for k, v in optimizer.state_dict()["state"][0].items())
    assert torch.equal(torch.get_rng_state(), rng)  # dropout's stream: a resume restored it
    assert memory.live == live  # the trials' gradients, moments and activations are all freed


def test_a_trial_out_of_memory_with_gradients_accumulated_frees_them():
    torch.manual_seed(0)
    model = GPT(tiny_config())
    cpu = torch.device("cpu")
    trial = Trial(model, model, config().optim, resolve_precision("fp32", cpu), cpu, vocab_size=97, block_size=16)
    alone, accumulating = (trial.peak(8, accum, CountedMemory()) for accum in (1, 2))
    # Past one micro-batch's step, short of the second micro-batch's, which meets the first's gradients.
    memory = CountedMemory((alone + accumulating) / 2)
    assert trial.peak(8, 2, memory) is None
    assert all(p.grad is None for p in model.parameters()) and memory.live == 0


def test_the_trial_is_the_runs_own_step(monkeypatch):
    """The trial calls training/step.py's train_step: a step that raises there raises here."""
    monkeypatch.setattr(microbatch, "train_step", lambda *args: (_ for _ in ()).throw(torch.OutOfMemoryError("x")))
    model = GPT(tiny_config())
    trial = Trial(
        model,
        model,
        config().optim,
        resolve_precision("fp32", torch.device("cpu")),
        torch.device("cpu"),
        vocab_size=97,
        block_size=16,
    )
    assert trial.peak(1, 1, CountedMemory()) is None


@pytest.mark.parametrize(
    "settings, advice",
    [
        (dict(batch_size="auto", tokens_per_step=256), "batch_size=auto already chose the largest micro-batch"),
        (dict(batch_size=8, tokens_per_step=256), "lower batch_size (tokens_per_step=256 keeps the tokens per step"),
        (dict(batch_size=8, tokens_per_step=None), "lower batch_size and raise grad_accum_steps"),
    ],
)
def test_the_out_of_memory_advice_names_what_to_change_under_each_way_of_batching(settings, advice):
    line = out_of_memory_advice(config(**settings))
    assert advice in line and "model.block_size" in line and "compile=true" in line and "precision=bf16" in line
    assert "compile=true" not in out_of_memory_advice(replace(config(**settings), compile=True))


def test_a_run_with_auto_steps_with_the_largest_micro_batch_under_the_limit_and_records_it(
    train_overrides, monkeypatch, capsys
):
    auto = [*train_overrides, "batch_size=auto", "tokens_per_step=256", "max_iters=2", "eval_interval=2"]  # 8 x 32
    monkeypatch.setattr(microbatch, "device_memory", lambda device: CountedMemory(1e12))
    measured = next(r for r in read_metrics(run_in_process(*auto)) if r["kind"] == "micro_batch")
    assert measured["batch_size"] == 8 and measured["accum"] == 1  # nothing stops it at 8
    limit = (measured["tried"]["4"] + measured["tried"]["8"]) / 2 / (1 - MARGIN)  # 4 fits, 8 does not
    monkeypatch.setattr(microbatch, "device_memory", lambda device: CountedMemory(limit))
    capsys.readouterr()
    run_dir = run_in_process(*auto)
    out = capsys.readouterr().out
    record = next(r for r in read_metrics(run_dir) if r["kind"] == "micro_batch")
    assert (record["batch_size"], record["accum"], record["peak_bytes"]) == (4, 2, measured["tried"]["4"])
    assert "256 tokens/step (2 micro-batches per process)" in out
    assert "batch_size=auto: 4 sequences per micro-batch, 2 per step keep tokens_per_step=256 | peak" in out
    assert OmegaConf.load(run_dir / "config.yaml").batch_size == "auto"  # a resume tries again


@pytest.mark.parametrize(
    "settings, advice",
    [
        (["batch_size=4"], "lower batch_size and raise grad_accum_steps"),
        (["batch_size=4", "tokens_per_step=256"], "lower batch_size (tokens_per_step=256 keeps"),
        (["batch_size=auto", "tokens_per_step=256"], "batch_size=auto already chose the largest micro-batch"),
    ],
)
def test_an_out_of_memory_in_a_run_says_what_to_change_under_its_batching(
    train_overrides, monkeypatch, settings, advice
):
    monkeypatch.setattr(microbatch, "device_memory", lambda device: CountedMemory(1e12))  # a GPU's, for auto
    monkeypatch.setattr(
        train,
        "choose_micro_batch",
        lambda *args, **kwargs: (_ for _ in ()).throw(
            torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore")
        ),
    )
    with pytest.raises(UserError, match=r"^out of memory \(CUDA out of memory. Tried to allocate 2.00 GiB\): ") as err:
        run_in_process(*train_overrides, "estimate=true", *settings)
    assert advice in str(err.value)


@pytest.mark.parametrize(
    "overrides, problem",
    [
        (
            ["tokens_per_step=1024", "grad_accum_steps=2", "batch_size=4"],  # the issue's: 4 micro-batches, 2 ignored
            "grad_accum_steps=2 and tokens_per_step=1024 both set the micro-batches per step",
        ),
        (
            ["batch_size=auto"],
            "batch_size=auto keeps the tokens per step through accumulation, so it needs tokens_per_step",
        ),
        (
            ["batch_size=auto", "tokens_per_step=4096", "max_iters=0"],
            "batch_size=auto has no step to try: set eval_batch_size",
        ),
        (["batch_size=many"], "batch_size must be auto or a whole number >= 1, got 'many'"),
        (["batch_size=0"], "batch_size must be auto or a whole number >= 1, got 0"),
    ],
)
def test_batching_settings_that_would_be_ignored_or_cannot_work_are_refused_by_name(overrides, problem):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="train", overrides=overrides)
    with pytest.raises(ValueError) as err:
        load_config(cfg)
    assert problem in str(err.value)
    assert len(str(err.value).splitlines()) == 1


def test_grad_accum_steps_alone_still_accumulates():
    plan = plan_micro_batches(
        config(batch_size=4, tokens_per_step=None, grad_accum_steps=3), 16, 1, torch.device("cpu")
    )
    assert (plan.sizes, plan.accum(4)) == ((4,), 3)


def _choose_on_rank(rank, world_size, port, limits, out_dir):
    import json
    import os

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        microbatch.device_memory = lambda device: CountedMemory(limits[rank])
        torch.manual_seed(0)
        model = GPT(tiny_config())
        cpu = torch.device("cpu")
        chosen = choose_micro_batch(
            Plan((16, 8, 4, 2, 1), 16, True),
            model,
            model,
            config(),
            resolve_precision("fp32", cpu),
            Ranks(rank, 0, world_size),
            cpu,
            vocab_size=97,
        )
        fitting = [size for size, peak in chosen.tried.items() if peak is not None and peak <= 0.9 * limits[rank]]
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps({"size": chosen.size, "own": max(fitting)}))
    finally:
        dist.destroy_process_group()


def test_under_ddp_every_rank_takes_the_smallest_choice(tmp_path):
    import json
    import socket

    import torch.multiprocessing as mp

    torch.manual_seed(0)
    peaks = measured_peaks(GPT(tiny_config()), (2, 4))
    buckets = sum(p.numel() * 4 for p in GPT(tiny_config()).parameters())  # DDP's, added to a rank's peak
    limits = [1e12, (peaks[2] + peaks[4]) / 2 / 0.9 + buckets]  # rank 1 holds 2, not 4
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_choose_on_rank, args=(2, port, limits, str(tmp_path)), nprocs=2)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["own"] == 16 and ranks[1]["own"] == 2  # each alone would differ
    assert ranks[0]["size"] == ranks[1]["size"] == 2
