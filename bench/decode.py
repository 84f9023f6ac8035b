"""Decode speed of the KV-cached generation engine for the gpt2 preset as MHA, GQA and MQA,
with its weights in fp32, bf16 and int8.

    python bench/decode.py --threads 1                  # the full table (about 12 minutes on a CPU)
    python bench/decode.py --variants MHA --batch 1     # the weight formats side by side at batch 1
    python bench/decode.py --weights fp32 --batch 1 --long 256   # shorter
    python bench/decode.py --json decode.json           # also write the figures as JSON

How it is measured. Each model is the gpt2 preset (random weights: speed does not depend on their
values) computing in fp32 on one device, its Linear weights in each --weights format
(`to_weight_format`: bf16, or int8 with a scale per output channel), in the layout sample.py uses
(`to_decode_layout`). The formats of one variant are measured side by side: at each batch and
context they take turns, --rounds times. For every batch size and context length, `model.stream`
generates greedily from random prompts of that length, and each decode step is timed from one
yielded token to the next: sampling and Python overhead count, the prefill and --warmup steps do
not. ms/token is the fastest step over the rounds (one new token for every row): on a shared machine
it is the step least slowed by other processes, and the bandwidth below is taken the same way.
tokens/s counts all rows. prefill ms is the time from the call to the first token (the prompts'
prefill), the fastest of the rounds.

Batch-1 decode reads every weight once per token, so its ceiling is the memory read bandwidth over
the bytes read per step: the weights in their format (the position table counts one row) plus the
cached keys and values; bf16 and int8 have ceilings 2x and about 4x fp32's. The bandwidth is
measured as a large fp32 matrix-vector product (the fastest of --repeats, of a square and a wide 256
MiB matrix, each read in both layouts), in huge pages like the decode weights. A plain sum over the
same matrices is printed beside it: it reads faster than BLAS's matrix-vector product does, and with
several threads faster than one core can, so "% read" gives each row's share of that harder ceiling
too (bf16 and int8 kernels use every thread; fp32 matrix-vector products run on one core). At batch
8 a CPU is compute-bound, so that ceiling is far away. The full-recompute figure runs the whole
sequence through the model for each token, as a loop without a cache does.

Last, each weight's matrix-vector product of the first variant is timed alone, in the model's order
(so each weight comes from memory), as a rate against the bandwidth: this shows which matrix shapes
BLAS streams slower than the large one.

On a shared CPU, --threads 1 gives steady figures: batch-1 decode is as fast with one thread (BLAS
runs matrix-vector products on one core), and two threads stall whenever another process holds the
second core.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout

from conf import model_preset  # noqa: E402
from model import (  # noqa: E402
    GPT,
    WEIGHT_FORMATS,
    KVCache,
    Sampling,
    huge_page_zeros,
    stream,
    to_decode_layout,
    to_weight_format,
)
from run.load import check_inference_settings  # noqa: E402
from run.runtime import describe_machine, synchronize  # noqa: E402
from training.provenance import provenance  # noqa: E402

VARIANTS = {"MHA": 12, "GQA": 4, "MQA": 1}  # name: n_kv_head of the gpt2 preset (12 heads)
GREEDY = Sampling(temperature=0)


@dataclass
class Row:
    variant: str
    weights: str
    n_kv_head: int
    batch: int
    context: int
    kv_cache_mib: float  # for block_size positions
    ms_per_token: float
    tokens_per_s: float
    ceiling_tokens_per_s: float  # memory read bandwidth / bytes read per decode step
    read_ceiling_tokens_per_s: float  # the same with a plain read's bandwidth
    prefill_ms: float  # the prompts' prefill and the first token


def measure_bandwidth(device: torch.device, repeats: int) -> tuple[float, float]:
    """Memory read bandwidth in bytes/s, two ways, over matrices far larger than any
    cache (256 MiB on CPU, in huge pages like the decode weights; 2 GiB on GPU): an fp32
    matrix-vector product, which reads each element once (the fastest of a square and
    a wide matrix, each read row-major and column-major: BLAS streams long rows or
    columns fastest), and a plain sum, the fastest read there is."""
    fastest_mv, plain_read = 0.0, 0.0
    for rows, cols in ((8192, 8192), (1024, 65536)):
        rows *= 1 if device.type == "cpu" else 8
        matrix = (
            huge_page_zeros((rows, cols)).normal_() if device.type == "cpu" else torch.randn(rows, cols, device=device)
        )
        # .t() reads the same bytes as a column-major (cols, rows) matrix
        for m, v in ((matrix, torch.randn(cols, device=device)), (matrix.t(), torch.randn(rows, device=device))):
            fastest_mv = max(fastest_mv, matrix.nbytes / fastest_seconds(lambda: torch.mv(m, v), device, repeats))
        plain_read = max(plain_read, matrix.nbytes / fastest_seconds(matrix.sum, device, repeats))
        del matrix
    return fastest_mv, plain_read


def fastest_seconds(fn, device: torch.device, repeats: int) -> float:
    seconds = []
    for _ in range(repeats + 2):  # the first two warm up
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        seconds.append(time.perf_counter() - start)
    return min(seconds[2:])


def bytes_per_step(model: GPT, batch: int, context: int) -> int:
    """Bytes a decode step must read: every weight once in its format (the position
    table, where the model has one: one row) and the cached keys and values of every row."""
    stored = list(model.parameters()) + list(model.buffers())
    weights = sum(t.nbytes for t in stored)
    if "wpe" in model.transformer:  # rotary models have no table
        wpe = model.transformer.wpe.weight
        weights += wpe[0].nbytes - wpe.nbytes
    cache = KVCache(model.config, batch, max_len=context, device="meta")
    return weights + cache.nbytes


def random_prompts(batch: int, length: int, vocab_size: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab_size, (batch, length), generator=generator).tolist()


def timed_generation(
    model: GPT, prompts: list[list[int]], steps: int, warmup: int, decode: str = "eager"
) -> tuple[float, list[float]]:
    """Seconds from the call to the first token (the prefill and one sampling), and
    of each decode step after `warmup` more."""
    start = time.perf_counter()
    stamps = [time.perf_counter() for _ in stream(model, prompts, warmup + steps + 1, GREEDY, decode=decode)]
    return stamps[0] - start, [b - a for a, b in zip(stamps[warmup:], stamps[warmup + 1 :])]


@torch.inference_mode()
def recompute_step_seconds(model: GPT, prompt: list[int], steps: int) -> float:
    """Seconds of the fastest token of a loop without a cache: the whole sequence each time."""
    idx = torch.tensor([prompt], device=model.lm_head.weight.device)
    model(idx, last_only=True)  # warm-up
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        logits, _ = model(idx, last_only=True)
        idx = torch.cat([idx[:, 1:], logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        synchronize(idx.device)
        seconds.append(time.perf_counter() - start)
    return min(seconds)


@torch.inference_mode()
def matrix_rates(model: GPT, passes: int) -> dict[str, tuple[str, float]]:
    """Where batch-1 decode loses to the ceiling: each weight's matrix-vector product
    timed alone, in the model's order so that each weight comes from memory as in a
    decode step. Returns {role: ("out x in", bytes/s)}, the median over passes."""
    linears = [
        (re.sub(r"^transformer\.h\.\d+\.", "", name), m)
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear)
    ]
    device = model.lm_head.weight.device
    inputs = {id(m): torch.randn(1, m.in_features, device=device) for _, m in linears}
    seconds: dict[str, list[float]] = {}
    for _ in range(passes):
        for role, linear in linears:
            synchronize(device)
            start = time.perf_counter()
            linear(inputs[id(linear)])
            synchronize(device)
            seconds.setdefault(role, []).append(time.perf_counter() - start)
    weights = {role: m.weight for role, m in linears}
    return {
        role: ("x".join(map(str, weights[role].shape)), weights[role].nbytes / statistics.median(times))
        for role, times in seconds.items()
    }


def build_model(n_kv_head: int, device: torch.device, huge_pages: bool, weights: str = "fp32") -> GPT:
    torch.manual_seed(0)
    with device:
        model = GPT(model_preset("gpt2", f"model.n_kv_head={n_kv_head}")).eval()
    return to_decode_layout(to_weight_format(model, weights), huge_pages)


def run(
    args: argparse.Namespace, device: torch.device, bandwidth: tuple[float, float]
) -> tuple[list[Row], dict[str, float]]:
    rows, recompute_ratio = [], {}
    for name in args.variants:
        models = {
            weights: build_model(VARIANTS[name], device, not args.small_pages, weights) for weights in args.weights
        }
        for batch in args.batch:
            for context in (args.short, args.long):
                rows += measure_formats(models, name, batch, context, args, bandwidth)
        if args.recompute_steps:
            recompute_ratio[name] = measure_recompute(models[args.weights[0]], name, rows, args)
        del models
    return rows, recompute_ratio


def measure_formats(
    models: dict[str, GPT],
    name: str,
    batch: int,
    context: int,
    args: argparse.Namespace,
    bandwidth: tuple[float, float],
) -> list[Row]:
    """Every weight format's decode at this batch and context, the formats taking turns
    for --rounds rounds, so that a slow moment of a shared machine does not fall on one
    format alone. Each figure is the fastest over all rounds."""
    first = next(iter(models.values()))
    prompts = random_prompts(batch, context, first.config.vocab_size)
    prefills: dict[str, list[float]] = {weights: [] for weights in models}
    steps: dict[str, list[float]] = {weights: [] for weights in models}
    for _ in range(args.rounds):
        for weights, model in models.items():
            prefill, seconds = timed_generation(model, prompts, args.tokens, args.warmup)
            prefills[weights].append(prefill)
            steps[weights] += seconds
    kv_mb = KVCache(first.config, batch, first.config.block_size, device="meta").megabytes
    rows = []
    for weights, model in models.items():
        seconds = min(steps[weights])
        ceilings = (batch * rate / bytes_per_step(model, batch, context) for rate in bandwidth)
        ms, prefill_ms = 1e3 * seconds, 1e3 * min(prefills[weights])
        row = Row(name, weights, VARIANTS[name], batch, context, kv_mb, ms, batch / seconds, *ceilings, prefill_ms)
        rows.append(row)
        print(format_row(rows[-1]), flush=True)
    return rows


def measure_recompute(model: GPT, name: str, rows: list[Row], args: argparse.Namespace) -> float:
    """How many times slower a loop without a cache is than the cached decode, batch 1."""
    prompt = random_prompts(1, args.long, model.config.vocab_size)[0]
    cached = next(r for r in rows if (r.variant, r.batch, r.context) == (name, 1, args.long))
    recomputed = recompute_step_seconds(model, prompt, args.recompute_steps)
    ratio = 1e3 * recomputed / cached.ms_per_token
    print(
        f"{name}: full recompute at context {args.long}: {1e3 * recomputed:.0f} ms/token, "
        f"{ratio:.1f}x slower than cached ({cached.weights} weights)",
        flush=True,
    )
    return ratio


HEADER = (
    f"{'variant':<8}{'weights':>8}{'kv heads':>9}{'batch':>7}{'context':>9}{'KV MiB':>9}{'ms/token':>10}"
    f"{'tok/s':>9}{'ceiling':>9}{'% ceil':>8}{'% read':>8}{'prefill ms':>12}"
)


def format_row(r: Row) -> str:
    return (
        f"{r.variant:<8}{r.weights:>8}{r.n_kv_head:>9}{r.batch:>7}{r.context:>9}{r.kv_cache_mib:>9.1f}{r.ms_per_token:>10.1f}"
        f"{r.tokens_per_s:>9.1f}{r.ceiling_tokens_per_s:>9.1f}{100 * r.tokens_per_s / r.ceiling_tokens_per_s:>7.0f}%"
        f"{100 * r.tokens_per_s / r.read_ceiling_tokens_per_s:>7.0f}%{r.prefill_ms:>12.0f}"
    )


def mqa_speedup(rows: list[Row], batch: int, context: int) -> float | None:
    """MQA's tokens/s over MHA's at this batch and context (first weight format), when both were measured."""
    speed = {
        r.variant: r.tokens_per_s for r in rows if (r.batch, r.context, r.weights) == (batch, context, rows[0].weights)
    }
    return speed["MQA"] / speed["MHA"] if {"MQA", "MHA"} <= speed.keys() else None


def format_speedups(rows: list[Row]) -> dict[str, float]:
    """Each weight format's batch-1 tokens/s over the first format's, per variant and context."""
    base = {(r.variant, r.context): r.tokens_per_s for r in rows if r.batch == 1 and r.weights == rows[0].weights}
    return {
        f"{r.variant} {r.weights} context {r.context}": r.tokens_per_s / base[(r.variant, r.context)]
        for r in rows
        if r.batch == 1 and r.weights != rows[0].weights and (r.variant, r.context) in base
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, help="CPU threads (default: torch's choice)")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument(
        "--weights",
        nargs="+",
        choices=WEIGHT_FORMATS,
        default=list(WEIGHT_FORMATS),
        help="weight formats, side by side (the first is the reference of the speed-ups)",
    )
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--short", type=int, default=32, help="short context: prompt tokens")
    parser.add_argument("--long", type=int, default=960, help="long context: prompt tokens")
    parser.add_argument("--tokens", type=int, default=24, help="timed decode steps per measurement")
    parser.add_argument("--warmup", type=int, default=4, help="untimed decode steps before them")
    parser.add_argument("--rounds", type=int, default=2, help="rounds in which the weight formats take turns")
    parser.add_argument("--recompute-steps", type=int, default=2, help="timed full-recompute steps (0: skip)")
    parser.add_argument("--repeats", type=int, default=20, help="bandwidth measurements (the fastest counts)")
    parser.add_argument(
        "--small-pages",
        action="store_true",
        help="decode weights in ordinary 4 KiB pages, to compare with the huge-page default",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    if args.long + args.warmup + args.tokens + 1 > 1024:
        parser.error("--long + --warmup + --tokens must stay below the preset's block_size (1024)")
    return args


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    for weights in args.weights:
        check_inference_settings(device, weights)  # int8 on the CPU only
    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    bandwidth, plain_read = measure_bandwidth(device, args.repeats)
    pages = "4 KiB pages" if args.small_pages else "huge pages"
    print(
        f"gpt2 preset, fp32 activations, weights {'/'.join(args.weights)}, {device.type} "
        f"({describe_machine(device)}), torch {torch.__version__}, stored in {pages}"
    )
    print(
        f"memory read bandwidth {bandwidth / 1e9:.1f} GB/s (fp32 matrix-vector product, fastest of {args.repeats}); "
        f"a plain sum reads {plain_read / 1e9:.1f} GB/s"
    )
    print(
        f"greedy decode, the fastest of {args.tokens} steps after {args.warmup} warm-up steps; "
        "ceiling = bandwidth / bytes read per step (weights + KV cache); % read: the same share "
        "against the plain sum's bandwidth"
    )
    print(f"load average before: {load_before:.2f} (other busy processes make every figure slower)")
    print(HEADER)
    rows, recompute_ratio = run(args, device, (bandwidth, plain_read))
    speedup = mqa_speedup(rows, max(args.batch), args.long)
    if speedup is not None:
        print(f"MQA vs MHA at batch {max(args.batch)}, context {args.long}: {speedup:.2f}x the tokens/s")
    speedups = format_speedups(rows)
    for label, ratio in speedups.items():
        print(f"batch 1, {label}: {ratio:.2f}x the tokens/s of {args.weights[0]} weights")
    variant = args.variants[0]
    rates = matrix_rates(build_model(VARIANTS[variant], device, huge_pages=not args.small_pages), args.repeats)
    print(
        f"{variant} batch 1: each weight's matrix-vector product timed alone "
        f"(median over its layers and {args.repeats} passes)"
    )
    for role, (shape, rate) in rates.items():
        print(f"  {role:<12}{shape:>11}{rate / 1e9:>7.1f} GB/s{100 * rate / bandwidth:>5.0f}% of the bandwidth")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "provenance": provenance(device),
                    "device": f"{device.type} ({describe_machine(device)})",
                    "torch": torch.__version__,
                    "huge_pages": not args.small_pages,
                    "bandwidth_gb_s": bandwidth / 1e9,
                    "plain_read_gb_s": plain_read / 1e9,
                    "rows": [asdict(r) for r in rows],
                    "recompute_over_cached": recompute_ratio,
                    "mqa_over_mha_tokens_per_s": speedup,
                    "over_first_weights_tokens_per_s": speedups,
                    "matrix_gb_s": {role: rate / 1e9 for role, (_, rate) in rates.items()},
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
