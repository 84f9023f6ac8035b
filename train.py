"""Train a GPT from a Hydra config.

    python train.py                                  # mini model on the stdlib corpus, CPU-sized
    python train.py model=gpt2 data=openwebtext      # any preset, any corpus
    python train.py model/attention=mqa              # the same model with multi-query attention
    python train.py resume=true                      # continue the newest run exactly

The story of one run, top to bottom: validate the config, find or create the run
directory, prepare the data, build the model (fresh or from a checkpoint), then
step: forward under autocast, backward with gradient accumulation, clip, update;
evaluate and checkpoint every eval_interval steps; stop cleanly on a signal.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict, replace
from datetime import datetime
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from conf import Config, load_config
from data import BatchLoader, DataError, prepare
from model import GPT
from training.checkpoint import Checkpoint, CheckpointError, find_checkpoint, load_checkpoint, load_weights, save_checkpoint
from training.logger import RunLogger
from training.mfu import estimate_mfu, peak_flops
from training.runtime import Precision, configure_cuda, resolve_device, resolve_precision, rng_state, seed_everything, set_rng_state
from training.schedule import learning_rate
from training.signals import GracefulStop

RUN_CONFIG = "config.yaml"
RUN_GROUPS = "groups.yaml"  # the config-group choices (model=nano, ...) the run was started with
EVAL_SEED_OFFSET = 1_000_003


class NonFiniteLoss(RuntimeError):
    pass


@hydra.main(config_path="conf", config_name="train", version_base=None)
def main(cfg: DictConfig) -> None:
    try:
        train(cfg)
    except (ValueError, DataError, CheckpointError, NonFiniteLoss) as err:
        sys.exit(f"error: {err}")


def train(cfg: DictConfig) -> Path:
    cfg, resume_from = resolve_resume(cfg)
    config = load_config(cfg)  # every rule checked here, before any heavy work
    device = resolve_device(config.device)
    precision = resolve_precision(config.precision, device)
    if device.type == "cuda":
        configure_cuda()
    run_dir = resume_from.run_dir if resume_from else new_run_dir(config)
    accum = grad_accum_steps(config, config.model.block_size)
    seed_everything(config.seed)

    data = prepare(config.data)
    tokenizer = data.tokenizer()
    model_config = replace(config.model, vocab_size=padded(tokenizer.vocab_size, config.pad_vocab_to))
    model = GPT(model_config).to(device)
    optimizer = model.configure_optimizer(
        config.optim.weight_decay, config.optim.learning_rate, (config.optim.beta1, config.optim.beta2), device.type
    )
    scaler = precision.grad_scaler()
    step, best_val_loss = 0, math.inf
    if resume_from:
        step, best_val_loss = restore(resume_from, model, optimizer, scaler)
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(cfg, run_dir / RUN_CONFIG)
        OmegaConf.save(OmegaConf.create(group_choices()), run_dir / RUN_GROUPS)
    checkpoint_config = {"model": asdict(model_config), "data": asdict(config.data), "tokenizer": tokenizer.describe()}
    train_model = torch.compile(model) if config.compile else model

    train_loader = BatchLoader(data.data_dir, "train", model_config.block_size, config.batch_size, config.seed, device=device)
    # Evaluation reads the same eval_iters batches of each split every time (its own seed),
    # so successive evaluations differ only by the model.
    eval_loaders = {
        split: BatchLoader(data.data_dir, split, model_config.block_size, config.batch_size, config.seed + EVAL_SEED_OFFSET, device=device)
        for split in ("train", "val")
    }
    tokens_per_step = config.batch_size * model_config.block_size * accum
    flops_per_token = model.flops_per_token(model_config.block_size)
    peak = config.logging.peak_flops or peak_flops(device, precision.name)
    logger = RunLogger(
        run_dir, start_step=step, max_iters=config.max_iters, progress=config.logging.progress,
        wandb_settings=asdict(config.logging.wandb), config=OmegaConf.to_container(cfg, resolve=True),
    )
    logger.print(
        f"run {run_dir} | {model.num_params():,} parameters ({model_config.attention_kind}, "
        f"{model_config.n_head} heads, {model_config.n_kv_head} kv heads) | {device} {precision.name} | "
        f"{tokens_per_step:,} tokens/step ({accum} micro-batches) | "
        + (f"MFU against a peak of {peak / 1e9:,.0f} GFLOP/s" if peak else "MFU not reported: unknown peak")
    )
    if step == 0:
        logger.log({"kind": "eval", "step": 0, **evaluate(train_model, eval_loaders, config.eval_iters, precision)})

    checkpoint = None
    window_start, window_steps = time.perf_counter(), 0
    with GracefulStop() as stop:
        while step < config.max_iters:
            lr = learning_rate(
                step, max_lr=config.optim.learning_rate, min_lr=config.optim.min_lr,
                warmup_iters=config.optim.warmup_iters, decay_iters=config.optim.decay_iters or config.max_iters,
            )
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss = train_step(train_model, optimizer, scaler, train_loader, step, accum, precision, config.optim.grad_clip)
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
                elapsed = time.perf_counter() - window_start
                tok_per_s = tokens_per_step * window_steps / elapsed
                logger.log({
                    "kind": "train", "step": step, "loss": loss, "lr": lr, "tokens": step * tokens_per_step,
                    "tok_per_s": tok_per_s, "mfu": estimate_mfu(flops_per_token, tok_per_s, peak) if peak else None,
                })
                window_start, window_steps = time.perf_counter(), 0

            at_eval = step % config.eval_interval == 0 or step == config.max_iters
            if at_eval or stop.requested:
                if at_eval:
                    metrics = evaluate(train_model, eval_loaders, config.eval_iters, precision)
                    logger.log({"kind": "eval", "step": step, **metrics})
                    is_best = metrics["val_loss"] < best_val_loss
                    best_val_loss = min(best_val_loss, metrics["val_loss"])
                else:
                    is_best = False
                state = {
                    "step": step, "best_val_loss": best_val_loss, "optimizer": optimizer.state_dict(),
                    "scaler": scaler.state_dict(), "rng": rng_state(),
                }
                checkpoint = save_checkpoint(run_dir, step, model, checkpoint_config, state, config.keep_last, is_best)
                window_start = time.perf_counter()  # evaluation and saving are not training time
            if stop.requested:
                logger.print(f"{stop.requested}: saved {checkpoint} and stopped at step {step}")
                break
    logger.close()
    print(f"checkpoint: {checkpoint}\nsample from it: python sample.py checkpoint={run_dir}")
    return run_dir


def train_step(model, optimizer, scaler, loader, step, accum, precision: Precision, grad_clip: float) -> float | None:
    """One optimizer step over `accum` micro-batches. Returns the mean loss, or None
    (and no update) when the loss is not finite."""
    total = 0.0
    for micro in range(accum):
        x, y = loader.get_batch(step * accum + micro)
        with precision.autocast():
            _, loss = model(x, y)
        scaler.scale(loss / accum).backward()
        total += loss.detach()
    # One host sync per step: the price of never applying (or saving) a NaN update.
    mean_loss = float(total) / accum
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


def restore(checkpoint: Checkpoint, model: GPT, optimizer, scaler) -> tuple[int, float]:
    if checkpoint.model_config != model.config:
        raise CheckpointError(
            f"checkpoint {checkpoint.path} is a different model shape: {checkpoint.model_config} vs {model.config}"
        )
    load_weights(model, checkpoint.model_state)
    state = checkpoint.training_state()
    optimizer.load_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    set_rng_state(state["rng"])
    return state["step"], state["best_val_loss"]


def resolve_resume(cfg: DictConfig) -> tuple[DictConfig, Checkpoint | None]:
    """With resume set, continue the saved run's own config. Overrides of single
    values (max_iters=5000) still apply; group choices (model=nano) must be the ones
    the run started with, so repeating the original command line works."""
    if cfg.resume is None:
        return cfg, None
    target = None if str(cfg.resume).lower() in ("true", "latest") else cfg.resume
    checkpoint = load_checkpoint(find_checkpoint(target, cfg.runs_root))
    run_dir = checkpoint.run_dir
    if not (run_dir / RUN_CONFIG).is_file():
        raise CheckpointError(f"{run_dir} has no {RUN_CONFIG}: it is not a run directory of train.py")
    saved_groups = OmegaConf.to_container(OmegaConf.load(run_dir / RUN_GROUPS)) if (run_dir / RUN_GROUPS).is_file() else {}
    values = []
    for override in HydraConfig.get().overrides.task if HydraConfig.initialized() else []:
        key, _, value = override.lstrip("+").partition("=")
        if key == "resume":
            continue
        if key in group_choices() or override.startswith("~"):
            if str(saved_groups.get(key, "<not recorded>")) != value:
                raise ValueError(
                    f"cannot apply '{override}' when resuming {run_dir}: it was started with "
                    f"{key}={saved_groups.get(key, '<not recorded>')}; a run keeps its config groups "
                    "(start a new run instead)"
                )
            continue
        values.append(f"{key}={value}")
    merged = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.load(run_dir / RUN_CONFIG), OmegaConf.from_dotlist(values))
    merged.resume = cfg.resume
    return merged, checkpoint


def group_choices() -> dict[str, str | None]:
    """Which option of each config group this run uses, e.g. {"model": "nano", ...}."""
    if not HydraConfig.initialized():
        return {}
    return {k: v for k, v in HydraConfig.get().runtime.choices.items() if not k.startswith("hydra")}


def new_run_dir(config: Config) -> Path:
    if config.out_dir:
        path = Path(config.out_dir)
        if (path / RUN_CONFIG).exists():
            raise ValueError(f"out_dir={path} already holds a run; pass resume={path} to continue it")
        return path
    base = Path(config.runs_root) / datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    path, n = base, 1
    while path.exists():
        path, n = base.with_name(f"{base.name}_{n}"), n + 1
    return path


def grad_accum_steps(config: Config, block_size: int, world_size: int = 1) -> int:
    if config.tokens_per_step is None:
        return config.grad_accum_steps
    per_micro_step = config.batch_size * block_size * world_size
    if config.tokens_per_step % per_micro_step:
        raise ValueError(
            f"tokens_per_step ({config.tokens_per_step}) must be a multiple of batch_size * block_size * "
            f"world_size ({config.batch_size} * {block_size} * {world_size} = {per_micro_step})"
        )
    return config.tokens_per_step // per_micro_step


def padded(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


if __name__ == "__main__":
    main()
