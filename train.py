"""Train a GPT from a Hydra config.

    python train.py                                  # mini model on the stdlib corpus, CPU-sized
    python train.py model=gpt2 data=openwebtext      # any preset, any corpus
    python train.py model/attention=mqa              # the same model with multi-query attention
    python train.py resume=true                      # continue the newest run exactly
    torchrun --nproc_per_node=8 train.py model=gpt2  # data parallel over 8 GPUs (or CPU processes)

The story of one run, top to bottom: validate the config, join the process group
(under torchrun), find or create the run directory, prepare the data, build the
model (fresh or from a checkpoint), then step: forward under autocast, backward with
gradient accumulation, clip, update; evaluate and checkpoint every eval_interval
steps; stop cleanly on a signal. Rank 0 alone evaluates, logs and writes files.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from conf import Config, load_config
from data import BatchLoader, DataError, prepare
from model import GPT
from training.checkpoint import Checkpoint, CheckpointError, load_weights, save_checkpoint
from training.distributed import (
    Distributed, all_ranks_mean, any_rank, barrier, broadcast_from_main, gather_to_main, gradient_sync,
    init_distributed, shutdown, wrap_model,
)
from training.init_from import initial_model
from training.logger import RunLogger
from training.mfu import estimate_mfu, peak_flops
from training.run_dir import new_run_dir, resolve_resume, save_run_config
from training.runtime import Precision, configure_cuda, resolve_precision, rng_state, seed_everything, set_rng_state
from training.schedule import learning_rate
from training.signals import GracefulStop

EVAL_SEED_OFFSET = 1_000_003  # evaluation batches come from their own draw


class NonFiniteLoss(RuntimeError):
    pass


@hydra.main(config_path="conf", config_name="train", version_base=None)
def main(cfg: DictConfig) -> None:
    try:
        train(cfg)
    except (ValueError, DataError, CheckpointError, NonFiniteLoss) as err:
        sys.exit(f"error: {err}")


def train(cfg: DictConfig) -> Path:
    """Run training for a composed config; returns the run directory."""
    cfg, resume_from = resolve_resume(cfg)
    config = load_config(cfg)  # every rule checked here, before any heavy work
    group, device = init_distributed(config.device)
    try:
        return run(cfg, config, resume_from, group, device)
    finally:
        shutdown(group)


def run(cfg: DictConfig, config: Config, resume_from: Checkpoint | None, group: Distributed, device: torch.device) -> Path:
    precision = resolve_precision(config.precision, device)
    if device.type == "cuda":
        configure_cuda()
    accum = grad_accum_steps(config, config.model.block_size, group.world_size)
    if resume_from:
        run_dir = resume_from.run_dir
    else:  # only rank 0 chooses: a timestamp read on each rank could differ
        run_dir = broadcast_from_main(group, new_run_dir(config) if group.is_main else None)
    seed_everything(config.seed + group.rank)  # ranks draw different dropout masks

    data = prepare_on_main_first(config, group)
    tokenizer = data.tokenizer()
    if resume_from and config.init_from != "scratch":
        model_config, initial_state = resume_from.model_config, None  # the imported shape, as saved
    else:
        model_config, initial_state = initial_model(config, cfg.model.n_kv_head, tokenizer)
    model = GPT(model_config).to(device)
    if initial_state is not None and not resume_from:
        load_weights(model, initial_state)
    optimizer = model.configure_optimizer(
        config.optim.weight_decay, config.optim.learning_rate, (config.optim.beta1, config.optim.beta2), device.type
    )
    scaler = precision.grad_scaler()
    step, best_val_loss = 0, math.inf
    if resume_from:
        step, best_val_loss = restore(resume_from, model, optimizer, scaler, group)
    elif group.is_main:
        save_run_config(run_dir, cfg)
    checkpoint_config = {"model": asdict(model_config), "data": asdict(config.data), "tokenizer": tokenizer.describe()}
    compiled = torch.compile(model) if config.compile else model
    train_model = wrap_model(compiled, group, device)  # DDP broadcasts rank 0's weights here

    train_loader = BatchLoader(
        data.data_dir, "train", model_config.block_size, config.batch_size, config.seed,
        rank=group.rank, world_size=group.world_size, device=device, accum_steps=accum,
    )
    # The same eval_iters batches of each split every time: evaluations differ only by the model.
    eval_loaders = {
        split: BatchLoader(data.data_dir, split, model_config.block_size, config.batch_size,
                           config.seed + EVAL_SEED_OFFSET, device=device)
        for split in ("train", "val")
    }
    tokens_per_step = config.batch_size * model_config.block_size * accum * group.world_size
    flops_per_token = model.flops_per_token(model_config.block_size)
    peak = (config.logging.peak_flops or peak_flops(device, precision.name)) if group.is_main else None
    logger = RunLogger(
        run_dir, start_step=step, max_iters=config.max_iters, progress=config.logging.progress,
        wandb_settings=asdict(config.logging.wandb), config=OmegaConf.to_container(cfg, resolve=True),
        enabled=group.is_main,
    )
    logger.print(
        f"run {run_dir} | {model.num_params():,} parameters ({model_config.attention_kind}, "
        f"{model_config.n_head} heads, {model_config.n_kv_head} kv heads) | {device} {precision.name} x "
        f"{group.world_size} process(es) | {tokens_per_step:,} tokens/step ({accum} micro-batches per process) | "
        + (f"MFU against a peak of {peak / 1e9:,.0f} GFLOP/s" if peak else "MFU not reported: unknown peak")
    )
    if step == 0 and group.is_main:
        logger.log({"kind": "eval", "step": 0, "tokens": 0, **evaluate(compiled, eval_loaders, config.eval_iters, precision)})

    checkpoint = None
    window_start, window_steps = time.perf_counter(), 0
    with GracefulStop() as stop:
        while step < config.max_iters:
            lr = learning_rate(
                step, max_lr=config.optim.learning_rate, min_lr=config.optim.min_lr,
                warmup_iters=config.optim.warmup_iters, decay_iters=config.optim.decay_iters or config.max_iters,
            )
            for param_group in optimizer.param_groups:
                param_group["lr"] = lr
            loss = train_step(train_model, optimizer, scaler, train_loader, step, accum, precision, config.optim.grad_clip, group)
            if loss is None:
                if config.on_nonfinite == "stop":
                    raise NonFiniteLoss(
                        f"the loss became non-finite at step {step + 1}; the last good checkpoint "
                        f"({checkpoint or 'none yet'}) is untouched. Lower optim.learning_rate, or set "
                        "on_nonfinite=skip to skip such steps"
                    )
                logger.print(f"step {step + 1}: non-finite loss, update skipped (on_nonfinite=skip)")
            step += 1
            window_steps += 1

            if step % config.logging.log_interval == 0 or step == config.max_iters:
                tok_per_s = tokens_per_step * window_steps / (time.perf_counter() - window_start)
                logger.log({
                    "kind": "train", "step": step, "loss": loss, "lr": lr, "tokens": step * tokens_per_step,
                    "tok_per_s": tok_per_s, "mfu": estimate_mfu(flops_per_token, tok_per_s, peak) if peak else None,
                })
                window_start, window_steps = time.perf_counter(), 0

            at_eval = step % config.eval_interval == 0 or step == config.max_iters
            stopping = any_rank(group, stop.requested is not None, device)  # all ranks stop at the same step
            if at_eval or stopping:
                rng_states = gather_to_main(group, rng_state())
                if group.is_main:
                    is_best = False
                    if at_eval:
                        metrics = evaluate(compiled, eval_loaders, config.eval_iters, precision)
                        logger.log({"kind": "eval", "step": step, "tokens": step * tokens_per_step, **metrics})
                        is_best = metrics["val_loss"] < best_val_loss
                        best_val_loss = min(best_val_loss, metrics["val_loss"])
                    state = {
                        "step": step, "best_val_loss": best_val_loss, "optimizer": optimizer.state_dict(),
                        "scaler": scaler.state_dict(), "rng": rng_states,
                    }
                    checkpoint = save_checkpoint(run_dir, step, model, checkpoint_config, state, config.keep_last, is_best)
                window_start = time.perf_counter()  # evaluation and saving are not training time
            if stopping:
                logger.print(f"{stop.requested or 'signal on another rank'}: saved {checkpoint} and stopped at step {step}")
                break
    logger.close()
    barrier(group)  # no rank leaves before rank 0 has written the last checkpoint
    logger.print(f"checkpoint: {checkpoint}\nsample from it: python sample.py checkpoint={run_dir}")
    return run_dir


def train_step(model, optimizer, scaler, loader: BatchLoader, step: int, accum: int, precision: Precision,
               grad_clip: float, group: Distributed) -> float | None:
    """One optimizer step over `accum` micro-batches (per process). Returns the mean loss
    over all ranks, or None (and no update anywhere) when it is not finite."""
    total = 0.0
    for micro in range(accum):
        x, y = loader.get_batch(step, micro)
        with gradient_sync(model, sync=micro == accum - 1):
            with precision.autocast():
                _, loss = model(x, y)
            scaler.scale(loss / accum).backward()
        total += loss.detach()
    # One host sync per step (and one tiny all-reduce under DDP): the price of never
    # applying, or saving, a NaN update, and of every rank deciding the same way.
    mean_loss = all_ranks_mean(group, float(total) / accum, loader.device)
    if not math.isfinite(mean_loss):
        optimizer.zero_grad(set_to_none=True)
        return None
    if grad_clip > 0:
        scaler.unscale_(optimizer)  # clip the true gradients, not the fp16-scaled ones
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return mean_loss


@torch.no_grad()
def evaluate(model, loaders: dict[str, BatchLoader], eval_iters: int, precision: Precision) -> dict[str, float]:
    """Mean loss and perplexity over the same eval_iters batches of each split every time."""
    model.eval()
    metrics = {}
    for split, loader in loaders.items():
        losses = []
        for i in range(eval_iters):
            x, y = loader.get_batch(i)
            with precision.autocast():
                losses.append(model(x, y)[1].item())
        mean = sum(losses) / len(losses)
        metrics[f"{split}_loss"] = mean
        metrics[f"{split}_ppl"] = math.exp(min(mean, 50.0))
    model.train()
    return metrics


def restore(checkpoint: Checkpoint, model: GPT, optimizer, scaler, group: Distributed) -> tuple[int, float]:
    if checkpoint.model_config != model.config:
        raise CheckpointError(
            f"checkpoint {checkpoint.path} is a different model shape: {checkpoint.model_config} vs {model.config}"
        )
    load_weights(model, checkpoint.model_state)
    state = checkpoint.training_state()
    optimizer.load_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    # Each rank continues its own random stream; a different number of ranks reuses rank 0's.
    rng_states = state["rng"]
    set_rng_state(rng_states[group.rank] if group.rank < len(rng_states) else rng_states[0])
    return state["step"], state["best_val_loss"]


def prepare_on_main_first(config: Config, group: Distributed):
    """Rank 0 tokenises (if needed) while the others wait, then they reuse its shards."""
    if group.is_main:
        data = prepare(config.data)
    barrier(group)
    return data if group.is_main else prepare(config.data)


def grad_accum_steps(config: Config, block_size: int, world_size: int) -> int:
    if config.tokens_per_step is None:
        return config.grad_accum_steps
    per_micro_step = config.batch_size * block_size * world_size
    if config.tokens_per_step % per_micro_step:
        raise ValueError(
            f"tokens_per_step ({config.tokens_per_step}) must be a multiple of batch_size * block_size * "
            f"world_size ({config.batch_size} * {block_size} * {world_size} = {per_micro_step})"
        )
    return config.tokens_per_step // per_micro_step


if __name__ == "__main__":
    main()
