"""The measured stages of the GPU acceptance run (bench/gpu_check.py): training
throughput and KV-cached decode. Each variant and each decode mode runs on its own:
an error in one (an Inductor or Triton failure, a CUDA-graph capture that breaks) is
recorded in its row, and the other rows keep their figures. Rows go to a `Rows` sink
that saves the report after each one, and a variant that the time left cannot hold is
recorded as skipped instead of started."""

from __future__ import annotations

import statistics
import time
import traceback
from collections.abc import Callable
from typing import Any, Protocol

import torch

from bench.decode import random_prompts, timed_generation
from bench.train_throughput import FixedBatch, build_trainers, timed_steps, training_flops_per_token
from conf import model_preset
from model import GPT, KVCache
from run.runtime import resolve_precision, synchronize
from training.mfu import estimate_mfu, peak_flops

# variant: its overrides of the gpt2 preset (12 heads). Decode measures the attention layouts;
# throughput also trains Llama's block (rotary, RMSNorm, SwiGLU), eagerly: no extra cold compile.
ATTENTION = {"MHA": ("model.n_kv_head=null",), "GQA-4": ("model.n_kv_head=4",), "MQA": ("model.n_kv_head=1",)}
TRAINING = {**ATTENTION, "Llama GQA-4": ("model/block=llama", "model.n_kv_head=4")}
VARIANTS = {"throughput": TRAINING, "decode": ATTENTION}  # what a stage with a row per variant measures


class Rows(Protocol):
    def add(self, row: dict) -> None: ...  # record one row and save the report
    def left(self) -> float: ...  # seconds left in the run's budget


def error_text(err: BaseException) -> str:
    return f"{type(err).__name__}: {str(err).strip()[:2000]}\n{traceback.format_exc()[-1500:]}"


def matmul_rate(device: torch.device, dtype: torch.dtype, size: int, repeats: int) -> float:
    """FLOP/s of a size^3 matrix product on this device: the mean of `repeats` timed
    products after three untimed ones."""
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    for _ in range(3):
        a @ b
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    synchronize(device)
    return 2 * size**3 * repeats / (time.perf_counter() - start)


def throughput(device: torch.device, sizes, rows: Rows) -> None:
    """Training tokens/s and MFU per attention variant, each trainer variant on its own."""
    precision = resolve_precision(sizes.precision, device)
    peak = peak_flops(device, precision.name)
    measured, _ = _guarded(lambda: matmul_rate(device, precision.dtype, *sizes.matmul))  # None: no 'of matmul'
    per_variant = sizes.estimate_s["throughput"] / len(TRAINING)
    for variant, overrides in TRAINING.items():
        if rows.left() < per_variant:
            rows.add({"attention": variant, "skipped": f"needs ~{per_variant:.0f} s, {rows.left():.0f} s left"})
            continue
        config = model_preset(sizes.preset, *overrides)
        compiled = variant == "MHA" or (sizes.compile_every_variant and variant in ATTENTION)
        names = ["gptlab-compiled", "gptlab-eager"] if compiled else ["gptlab-eager"]
        names += sizes.reference_variants if variant == "MHA" else []
        try:
            batch = largest_batch(config, sizes.batches, precision, device)
            measured_rows = _measure_variants(config, names, batch, precision, device, sizes)
        except Exception as err:  # nothing of this attention variant could be measured
            measured_rows = [{"variant": name, "error": error_text(err)} for name in names]
        flops = training_flops_per_token(config)
        for row in _ratios(measured_rows):
            row.update(attention=variant, context=config.block_size, matmul_flops=measured)
            if "tokens_per_s" in row:
                row["mfu"] = round(estimate_mfu(flops, row["tokens_per_s"], peak.flops), 4) if peak else None
                row["of_matmul"] = round(estimate_mfu(flops, row["tokens_per_s"], measured), 4) if measured else None
            rows.add(row)
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _measure_variants(config, names: list[str], batch: int, precision, device: torch.device, sizes) -> list[dict]:
    """One row per trainer variant: warmed up alone (compiling), then timed step by step
    in turns with the others that warmed up; a variant that fails keeps its error."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    trainers = build_trainers(config, names, precision, device)
    batches = FixedBatch(config, batch, device)
    rows = {name: {"variant": name, "batch": batch} for name in names}
    for name in names:  # gptlab-compiled first: the graph breaks counted are its own
        _, failure = _guarded(lambda: timed_steps({name: trainers[name]}, batches, sizes.warmup, 0))
        if failure:
            rows[name]["error"] = failure
        elif name == "gptlab-compiled":
            rows[name]["graph_breaks"] = sum(counters["graph_break"].values())
    alive = {name: trainers[name] for name in names if "error" not in rows[name]}
    graphs = counters["stats"]["unique_graphs"]
    together, failure = _guarded(lambda: timed_steps(alive, batches, 0, sizes.timed))
    seconds = {name: (times, None) for name, times in (together or {}).items()}
    if failure:  # one of them broke while timed: time each alone, to know which
        seconds = {
            name: _guarded(lambda: timed_steps({name: trainer}, batches, 0, sizes.timed)[name])
            for name, trainer in alive.items()
        }
    recompiles = counters["stats"]["unique_graphs"] - graphs
    for name, (times, failure) in seconds.items():
        if failure:
            rows[name]["error"] = failure
            continue
        rows[name].update(
            tokens_per_s=round(batch * config.block_size / statistics.median(times)),
            peak_memory_gib=_guarded(lambda: _step_memory(alive[name], batches, device))[0],
        )
        if name.endswith("compiled"):
            rows[name]["recompiles_after_warmup"] = recompiles
    return list(rows.values())


def _guarded(call: Callable) -> tuple[Any, str | None]:
    """(call()'s result, None), or (None, the error) when it raises."""
    try:
        return call(), None
    except Exception as err:
        return None, error_text(err)


def largest_batch(config, candidates: tuple[int, ...], precision, device: torch.device) -> int:
    """The largest candidate batch whose eager training step fits in memory."""
    for batch in candidates:
        try:
            trainers = build_trainers(config, ["gptlab-eager"], precision, device)
            timed_steps(trainers, FixedBatch(config, batch, device), 1, 0)
            return batch
        except torch.OutOfMemoryError:
            pass
        finally:
            trainers = None
            if device.type == "cuda":
                torch.cuda.empty_cache()
    raise RuntimeError(f"not even batch {candidates[-1]} fits")


def _step_memory(trainer, batches: FixedBatch, device: torch.device) -> float | None:
    """GiB allocated at the peak of one more step of this variant (every variant's weights
    and optimizer state are resident meanwhile)."""
    if device.type != "cuda":
        return None
    torch.cuda.reset_peak_memory_stats(device)
    timed_steps({"one more step": trainer}, batches, 1, 0)
    return round(torch.cuda.max_memory_allocated(device) / 2**30, 2)


def _ratios(rows: list[dict]) -> list[dict]:
    """gptlab over the reference at the same mode (eager/compiled), where both have figures."""
    reference = {
        r["variant"].split("-")[1]: r["tokens_per_s"]
        for r in rows
        if r["variant"].startswith("reference") and "tokens_per_s" in r
    }
    for row in rows:
        base = reference.get(row["variant"].split("-")[1])
        if row["variant"].startswith("gptlab") and base and "tokens_per_s" in row:
            row["over_reference"] = round(row["tokens_per_s"] / base, 3)
    return rows


def decode(device: torch.device, sizes, rows: Rows) -> None:
    """Greedy KV-cached decode per attention variant, batch and context: eager, and with
    each step replayed as a CUDA graph (on a CPU the static cache it replays), each mode
    measured on its own."""
    dtype = torch.float32 if sizes.smoke else torch.bfloat16
    graph = "graph" if device.type == "cuda" else "static"
    per_variant = sizes.estimate_s["decode"] / len(ATTENTION)
    for variant, overrides in ATTENTION.items():
        if rows.left() < per_variant:
            rows.add({"attention": variant, "skipped": f"needs ~{per_variant:.0f} s, {rows.left():.0f} s left"})
            continue
        torch.manual_seed(0)
        with device:
            model = GPT(model_preset(sizes.preset, *overrides)).to(dtype).eval()
        for batch in sizes.decode_batches:
            cache_bytes = KVCache(model.config, batch, model.config.block_size, device="meta", dtype=dtype).nbytes
            for context in sizes.decode_contexts:
                row = {
                    "attention": variant,
                    "batch": batch,
                    "context": context,
                    "graph_mode": graph,
                    "kv_cache_bytes_full_context": cache_bytes,
                }
                prompts = random_prompts(batch, context, model.config.vocab_size)
                for mode, prefix in (("eager", ""), (graph, "graph_")):
                    row.update(_decode_mode(model, prompts, mode, prefix, sizes.decode_steps))
                if "ms_per_token" in row and "graph_ms_per_token" in row:
                    row["graph_over_eager"] = round(row["ms_per_token"] / row["graph_ms_per_token"], 2)
                rows.add(row)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _decode_mode(model: GPT, prompts: list[list[int]], mode: str, prefix: str, steps: int) -> dict:
    """ms/token (median step) and tokens/s of one decode mode, or its error."""
    seconds, failure = _guarded(lambda: statistics.median(timed_generation(model, prompts, steps, 3, mode)[1]))
    if failure:
        return {f"{prefix or 'eager_'}error": failure}
    return {f"{prefix}ms_per_token": round(1e3 * seconds, 3), f"{prefix}tokens_per_s": round(len(prompts) / seconds, 1)}
