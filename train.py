"""Train a GPT from a Hydra config.

    python train.py                                  # mini model on the stdlib corpus, CPU-sized
    python train.py model=gpt2 data=openwebtext      # any preset, any corpus
    python train.py model/attention=mqa              # the same model with multi-query attention
    python train.py resume=true                      # continue the newest run exactly
    python train.py experiment=gpt2_fineweb          # GPT-2 small on a GPU: llm.c's recipe, cited
    torchrun --nproc_per_node=8 train.py experiment=gpt2_fineweb  # data parallel over 8 GPUs (or CPU processes)

The story of one run, top to bottom: validate the config, join the process group (under torchrun), start
the run (its directory, new or resumed, held by one writer), set_up() its data, model, a resume's state and
the step (which also builds estimate=true and max_iters=0's evaluation), loop, finish. The host reads the
steps' results only every log_interval steps, at evaluation and at a stop; every eval_interval steps all
ranks evaluate and rank 0 saves a checkpoint; a signal stops the run cleanly at such a boundary.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path

from system import quiet_interrupt_while_starting

if __name__ == "__main__":  # before the imports below, on purpose: torch alone takes seconds
    quiet_interrupt_while_starting()

import hydra
import torch
from omegaconf import DictConfig
from torch import nn

from conf import Config
from conf.cli import check_overrides, options_first
from data import BatchLoader, PreparedData, prepare
from model import GPT
from run.checkpoints import CheckpointError, load_weights
from run.distributed import (
    Ranks,
    barrier,
    broadcast_from_main,
    gather_to_main,
    init_distributed,
    main_decides,
    shutdown,
    wrap_model,
)
from run.init_from import check_model_path
from run.runtime import Precision, configure_cuda, resolve_precision, rng_state, seed_everything
from run.start import RunSpec, StartedRun, build_model, model_without_corpus, resolve_run, start_run
from system import GracefulStop, command_finished, exits
from training.budget import run_budget
from training.estimate import WARMUP_STEPS, estimate_line, estimate_steps, peak_line, tokens_line
from training.evaluate import Evaluator
from training.logger import RunLogger, check_wandb
from training.mfu import Peak, estimate_mfu, run_peak
from training.microbatch import (
    MicroBatch,
    Plan,
    choose_micro_batch,
    device_memory,
    out_of_memory_advised,
    plan_micro_batches,
)
from training.optim import build_optimizer, set_learning_rate
from training.step import Prefetcher, RandomBatches, Trainer, TrainWindow, check_finite, run_warnings, train_step


@hydra.main(config_path="conf", config_name="train", version_base=None)
def main(cfg: DictConfig) -> Path | None:
    # out_of_memory's advice is the last resort: train() gives one that fits the config
    with exits(out_of_memory="lower batch_size, model.block_size or the model's size", writing="writing the run"):
        return train(cfg)  # the run directory: Hydra hands it to callbacks (evaluation/after_training.py)


def train(cfg: DictConfig) -> Path | None:
    """Run training for a composed config; returns the run directory (None: max_iters=0 and estimate=true)."""
    # The config: a resume continues its run's own; every rule is checked here, before any heavy work.
    spec = resolve_run(cfg)
    config = spec.config
    # The processes: this one alone, or one of torchrun's.
    ranks, device = init_distributed(config.device)
    try:
        with out_of_memory_advised(config):
            main_decides(ranks, lambda: check_wandb(config.logging.wandb.mode))
            if spec.resume_from is None:
                check_model_path(config)
            if config.max_iters == 0:
                return evaluate_only(spec, ranks, device)
            plan = plan_micro_batches(config, spec.block_size, ranks.world_size, device)  # before heavy work
            if config.estimate:
                return estimate_only(spec, ranks, device, plan)
            # The run: its directory, made or a resume's, held by one writer until the run ends.
            with start_run(spec, ranks, device) as run:
                return run_training(run, plan)
    finally:
        shutdown(ranks)


@dataclass
class Setup:
    """What set_up() builds for a run, an estimate and an evaluation: each phase built once."""

    config: Config  # max_iters from the run's budget and batch_size its micro-batch (a run's, an estimate's)
    precision: Precision
    data: PreparedData | None  # None: an estimate whose vocabulary is known without the corpus
    model: GPT  # the plain model: what checkpoints hold
    vocab_size: int  # the tokenizer's, which random tokens (estimate=true) are drawn from
    origin: str  # where the weights come from ('' for fresh ones and a resume's)
    # A run's and an estimate's (None for max_iters=0's evaluation):
    compiled: nn.Module | None = None  # what evaluation runs (torch.compile'd when asked)
    trainer: Trainer | None = None
    micro: MicroBatch | None = None
    tokens_per_step: int = 0
    notes: tuple[str, ...] = ()  # the budget's reason and a resume's line, for the header
    restored: tuple[int, float] = (0, math.inf)  # the step and best val loss a resume continues from


def set_up(
    spec: RunSpec, ranks: Ranks, device: torch.device, plan: Plan | None, restore: Callable | None = None
) -> Setup:
    """The one path that builds a run (restore: its StartedRun.restore), an estimate and an evaluation (no plan)."""
    config = spec.config
    estimate = plan is not None and config.estimate
    # The device: the run's precision, CUDA's matmul mode, this rank's random streams seeded.
    precision = resolve_precision(config.precision, device, cpu_bf16=True)
    if device.type == "cuda":
        configure_cuda(config.tf32)
    seed_everything(config.weights_seed + ranks.rank)  # ranks draw different dropout masks
    # The data and the model (fresh, from init_from's weights, or in a resume's shape). An estimate
    # prepares no corpus where the vocabulary is known without it, and builds a new run's model.
    known = model_without_corpus(config, device) if estimate else None
    if known:
        (model, vocab_size), data, origin = known, None, ""
    else:
        # Every rank prepares: the first to take the data directory's lock tokenises (if needed) while
        # the others wait on that lock, not in a collective that would time out on a large corpus;
        # then they reuse its shards, checking only sizes (rank 0 hashes them).
        data = prepare(config.data if ranks.is_main else replace(config.data, verify="size"))
        tokenizer = data.tokenizer()  # a trained BPE's is read and its sha256 checked: once
        model, origin = build_model(config, None if estimate else spec.resume_from, tokenizer, device)
        vocab_size = tokenizer.vocab_size
    if plan is None:  # an evaluation: a resume's weights, no step
        if spec.resume_from:
            load_weights(model, spec.resume_from.model_state)
        return Setup(config, precision, data, model, vocab_size, origin)
    # The budget, the optimizer, a resume's training state (the run's config recorded), the model
    # evaluation runs (compiled when asked) and the step at its micro-batch (batch_size=auto's, the
    # largest that fits, tried on the device).
    tokens_per_step = plan.sequences * model.config.block_size * ranks.world_size
    budget = run_budget(config, model.config, tokens_per_step)
    config = replace(config, max_iters=budget.max_iters)
    optimizer, scaler = build_optimizer(model, config.optim, device.type), precision.grad_scaler()
    step, best_val_loss, resumed = restore(model, optimizer, scaler, config) if restore else (0, math.inf, "")
    compiled = torch.compile(model) if config.compile else model
    micro = choose_micro_batch(plan, model, compiled, config, precision, ranks, device, vocab_size)
    wrapped = wrap_model(compiled, ranks, device)  # DDP broadcasts rank 0's weights here
    trainer = Trainer(wrapped, optimizer, scaler, precision.autocast(), micro.accum, config.optim.grad_clip, ranks)
    return Setup(
        replace(config, batch_size=micro.size),
        precision,
        data,
        model,
        vocab_size,
        origin,
        compiled=compiled,
        trainer=trainer,
        micro=micro,
        tokens_per_step=tokens_per_step,
        notes=(budget.reason, resumed),
        restored=(step, best_val_loss),
    )


@dataclass
class Session:
    """What the loop works with, built once by run_training()."""

    config: Config
    ranks: Ranks
    device: torch.device
    trainer: Trainer
    batches: Prefetcher
    evaluate: Callable[..., dict[str, float]]  # the Evaluator, of the compiled model
    save: Callable[..., Path]  # Checkpoints.save, of the model, its config and the tokenizer's files
    logger: RunLogger
    tokens_per_step: int
    mfu: Callable[[float], float] | None  # of one device's tokens/s; None: the peak is unknown


def run_training(run: StartedRun, plan: Plan) -> Path:
    ranks, device = run.ranks, run.device
    setup = set_up(run.spec, ranks, device, plan, restore=run.restore)
    config, data, model, micro, precision = setup.config, setup.data, setup.model, setup.micro, setup.precision
    tokenizer, block_size, (step, best_val_loss) = data.tokenizer(), model.config.block_size, setup.restored
    # The batches, the evaluation, the checkpoints (a trained BPE's tokenizer.json beside config.yaml) and the log.
    loader = BatchLoader(
        data.data_dir,
        "train",
        block_size,
        config.batch_size,
        config.batches_seed,
        ranks.rank,
        ranks.world_size,
        device,
        micro.accum,
    )
    evaluate = partial(Evaluator.for_run(config, data, block_size, precision, ranks, device), setup.compiled)
    described = {"model": asdict(model.config), "data": asdict(config.data), "tokenizer": tokenizer.describe()}
    save = partial(run.checkpoints.save, model=model, config=described, files=tokenizer.files())
    logger = RunLogger(
        run.run_dir,
        start_step=step,
        max_iters=config.max_iters,
        progress=config.logging.progress,
        wandb_settings=asdict(config.logging.wandb),
        config=run.settings,
        enabled=ranks.is_main,
    )
    peak = run_peak(config.logging.peak_flops, device, precision.name, tf32=config.tf32) if ranks.is_main else None
    mfu = partial(estimate_mfu, model.flops_per_token(), peak_flops=peak.flops) if peak else None
    s = Session(
        config, ranks, device, setup.trainer, Prefetcher(loader), evaluate, save, logger, setup.tokens_per_step, mfu
    )
    # The loop.
    logger.print(header(setup, run, peak))
    if plan.auto:  # what batch_size=auto chose and measured, printed and in metrics.jsonl
        logger.print(micro.line(setup.tokens_per_step))
        logger.log(micro.record(step), echo=False)
    for warning in run_warnings(config, device, precision.name) if ranks.is_main else ():
        logger.print(f"warning: {warning}")
    resume_from = run.spec.resume_from
    checkpoint, step = train_loop(s, step, best_val_loss, resume_from.path if resume_from else None)
    # The end: every rank waits for the last checkpoint, then where it is and how to go on.
    logger.close()
    barrier(ranks)  # no rank leaves before rank 0 has written the last checkpoint
    command_finished()  # nothing prints after the lines below, whatever signal comes
    logger.print(f"checkpoint: {checkpoint}\nsample from it: python sample.py checkpoint={run.run_dir}")
    if step < config.max_iters:  # a signal stopped it (under torchrun, the launcher's traceback follows)
        logger.print(f"stopped cleanly at step {step} of {config.max_iters}: resume={run.run_dir} continues it")
    return run.run_dir


def evaluate_only(spec: RunSpec, ranks: Ranks, device: torch.device) -> None:
    """max_iters=0: the model (init_from's weights, or a run's checkpoint) evaluated and printed; nothing written."""
    s = set_up(spec, ranks, device, plan=None)
    block_size = s.model.config.block_size
    metrics = Evaluator.for_run(s.config, s.data, block_size, s.precision, ranks, device)(s.model, final=True)
    if not ranks.is_main:
        return
    source = (
        spec.resume_from.path if spec.resume_from else s.origin or "a freshly initialised model (init_from=scratch)"
    )
    print(
        f"evaluated {source} on {s.data.data_dir}: {metrics['train_windows']:,} train and {metrics['val_windows']:,} "
        f"val windows of {block_size} tokens, {s.precision.name}"
    )
    for split in ("train", "val"):
        loss, ppl, bpb = (metrics[f"{split}_{key}"] for key in ("loss", "ppl", "bpb"))
        print(f"{split:<5} loss {loss:.4f} | ppl {ppl:.2f} | {bpb:.4f} bits/byte")


def estimate_only(spec: RunSpec, ranks: Ranks, device: torch.device, plan: Plan) -> None:
    """estimate=true: the steps of the run this config describes (model, micro-batch, precision, compile,
    processes) timed on random tokens of its vocabulary; prints its tokens, time, cost and peak memory."""
    s = set_up(spec, ranks, device, plan)
    config, micro, tokens_per_step = s.config, s.micro, s.tokens_per_step
    batches = RandomBatches(s.vocab_size, micro.size, s.model.config.block_size, device)
    warmup, timed = estimate_steps(config.estimate_steps, micro.accum)
    timed_steps(s.trainer, batches, config, warmup)
    memory = device_memory(device)  # None on a CPU
    with memory.watch() if memory else contextlib.nullcontext():  # the peak of the run's own steps
        seconds = timed_steps(s.trainer, batches, config, timed)
    if not ranks.is_main:
        return
    source = (
        f"no data prepared: the steps run on random tokens of the {s.vocab_size:,}-token vocabulary, as a step's "
        "time does not depend on the text"
        if s.data is None
        else f"data.tokenizer={config.data.tokenizer}{'' if config.init_from == 'scratch' else ' from a checkpoint'}: "
        f"its vocabulary comes from the corpus, so {s.data.data_dir} was prepared; the steps run on random tokens"
    )
    print(
        f"estimate=true (nothing written; {source}): {s.model.num_params():,} parameters | {device} "
        f"{s.precision.name} x {ranks.world_size} process(es) | {micro.accum} micro-batch(es) of {micro.size} "
        "per process"
    )
    if plan.auto:
        print(micro.line(tokens_per_step))
    print(peak_line(memory.peak(), memory.capacity()) if memory else "peak memory: measured on a GPU only")
    print(tokens_line(config.max_iters, tokens_per_step, s.data.meta["tokens"]["train"] if s.data else None))
    rate, measured = tokens_per_step * len(timed) / seconds, (timed[0] + 1, timed[-1] + 1)
    print(estimate_line(rate, measured, config.max_iters, tokens_per_step, ranks.world_size, config.cost.gpu_hour))


def timed_steps(t: Trainer, batches: RandomBatches, config: Config, steps: range) -> float:
    """Seconds these optimizer steps take, the device's work included."""
    start = time.perf_counter()
    for step in steps:
        set_learning_rate(t.optimizer, step, config)
        result = train_step(t, batches, step)
    result.loss.item()  # waits for the device
    return time.perf_counter() - start


def train_loop(s: Session, step: int, best_val_loss: float, checkpoint: Path | None) -> tuple[Path | None, int]:
    """Step to max_iters (or a stop); returns the last checkpoint and the step it ended at."""
    config = s.config
    if step == 0:
        log_eval(s, 0, s.evaluate())
    window, window_start = TrainWindow(s.device), time.perf_counter()
    estimate_from = step + WARMUP_STEPS  # the first log window starting here or later times the estimate
    with GracefulStop(launcher=s.ranks.launcher) as stop:  # a launcher killed with -9 stops the run too
        while step < config.max_iters:
            lr = set_learning_rate(s.trainer.optimizer, step, config)
            result = train_step(s.trainer, s.batches, step, stop_requested=stop.requested is not None)
            step += 1
            window.add(step, result)
            at_eval = step % config.eval_interval == 0 or step == config.max_iters
            # Alone, a signal is acted on at once; under DDP at the next boundary, where
            # every rank reads the same all-reduced stop flag.
            stop_alone = stop.requested is not None and s.ranks.world_size == 1
            if not (step % config.logging.log_interval == 0 or at_eval or stop_alone):
                continue
            summary = window.read()  # the host waits for the device here, and only here
            check_finite(summary, config.on_nonfinite, checkpoint, s.logger, config.optim.name)
            tok_per_s = s.tokens_per_step * summary.steps / (time.perf_counter() - window_start)  # all processes
            mfu = s.mfu(tok_per_s / s.ranks.world_size) if s.mfu else None
            record = {"kind": "train", "step": step, "loss": summary.loss, "lr": lr, "tokens": step * s.tokens_per_step}
            record |= {"tok_per_s": tok_per_s, "mfu": mfu, "grad_norm": summary.grad_norm, "skipped": summary.skipped}
            s.logger.log(record)
            if step - summary.steps >= estimate_from:
                log_estimate(s, tok_per_s, measured=(step - summary.steps + 1, step))
                estimate_from = math.inf
            if at_eval or summary.stop:
                checkpoint, best_val_loss = evaluate_and_save(s, step, best_val_loss, evaluate=at_eval)
            if summary.stop:
                stopped = stop.requested or "signal on another rank"
                s.logger.print(f"{stopped}: saved {checkpoint} and stopped at step {step}")
                break
            window_start = time.perf_counter()  # evaluation and saving are not training time
    return checkpoint, step


def log_estimate(s: Session, tok_per_s: float, measured: tuple[int, int]) -> None:
    """The time (and, with cost.gpu_hour, the cost) of the steps to max_iters at the measured rate."""
    to_go, gpu_hour = s.config.max_iters - measured[1], s.config.cost.gpu_hour
    s.logger.print(estimate_line(tok_per_s, measured, to_go, s.tokens_per_step, s.ranks.world_size, gpu_hour))


def log_eval(s: Session, step: int, metrics: dict[str, float]) -> None:
    s.logger.log({"kind": "eval", "step": step, "tokens": step * s.tokens_per_step, **metrics})


def evaluate_and_save(s: Session, step: int, best_val_loss: float, *, evaluate: bool) -> tuple[Path | None, float]:
    """Evaluate on every rank (when due), then rank 0 writes the checkpoint."""
    is_best = False
    if evaluate:
        metrics = s.evaluate(final=step == s.config.max_iters)
        log_eval(s, step, metrics)
        is_best = metrics["val_loss"] < best_val_loss
        best_val_loss = min(best_val_loss, metrics["val_loss"])
    rng_states = gather_to_main(s.ranks, rng_state(s.device))
    checkpoint, failure = None, None
    if s.ranks.is_main:
        state = {"step": step, "best_val_loss": best_val_loss, "optimizer": s.trainer.optimizer.state_dict()}
        state |= {"scaler": s.trainer.scaler.state_dict(), "rng": rng_states}
        try:
            checkpoint = s.save(step, state=state, is_best=is_best)
        except CheckpointError as err:
            failure = str(err)
    failure = broadcast_from_main(s.ranks, failure)  # a failed save stops every rank, not only rank 0
    if failure:
        raise CheckpointError(failure)
    return checkpoint, best_val_loss


def header(setup: Setup, run: StartedRun, peak: Peak | None) -> str:
    c, tokens_per_step = setup.model.config, setup.tokens_per_step
    mfu = f"MFU against {peak.flops / 1e12:,.3g} TFLOP/s ({peak.source})" if peak else "MFU not reported: unknown peak"
    lines = [
        f"run {run.run_dir} | {setup.model.num_params():,} parameters ({c.attention_kind}, {c.n_head} heads, "
        f"{c.kv_heads} kv heads, context {c.block_size}) | {run.device} {setup.precision.name} x "
        f"{run.ranks.world_size} process(es) | {tokens_per_step:,} tokens/step ({setup.micro.accum} "
        f"micro-batches per process) | {mfu}",
        tokens_line(setup.config.max_iters, tokens_per_step, setup.data.meta["tokens"]["train"]),
        *(run.takeover, setup.origin, *setup.notes),
    ]
    return "\n".join(line for line in lines if line)


if __name__ == "__main__":
    sys.argv[1:] = options_first(sys.argv[1:])
    check_overrides(sys.argv[1:], Config, "train")
    main()
