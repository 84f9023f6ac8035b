"""Training throughput (tokens/s) and MFU of gptlab, side by side with a minimal reference GPT-2.

    python bench/train_throughput.py                        # README's table: ~3 min on 2 CPU cores, ~8 the first time
    python bench/train_throughput.py --presets gpt2 --variants gptlab-compiled --no-json
    python bench/train_throughput.py --json /tmp/now.json   # compare with bench/results/train_throughput_cpu.json

How it is measured. A training step is train.py's own `train_step`
(forward with the loss under autocast, backward, gradient norm and clipping at 1.0,
the fused AdamW step that skips a non-finite update on the device, zero_grad with
set_to_none), fed the same random batch every step: data loading is not timed.
For each preset and precision, every variant (gptlab's GPT eager or torch.compiled,
and the reference GPT-2 of bench/reference_gpt.py, all starting from the same
weights) runs --warmup untimed steps (compilation, optimizer state allocation) and
then --steps timed steps. The variants take turns step by step, so a change in the
machine's load hits them all alike. A step's figure is batch * context / its
wall-clock seconds (CUDA is synchronised around it); a row reports the fastest
timed step, as other processes on a shared machine only ever slow a step down (the
median is in the JSON too). MFU = model FLOPs per token (`GPT.flops_per_token`, the
same for both models) * tokens/s / peak; the peak is a known GPU's datasheet
figure, or on a CPU the measured rate of large matmuls in that precision.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout

from bench.reference_gpt import ReferenceGPT  # noqa: E402
from conf import OptimConfig, model_preset  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from run.distributed import Ranks  # noqa: E402
from run.runtime import (  # noqa: E402
    DTYPES,
    Precision,
    configure_cuda,
    describe_machine,
    resolve_device,
    resolve_precision,
    synchronize,
)
from training.mfu import estimate_mfu, measure_matmul_flops, peak_flops  # noqa: E402
from training.optim import build_optimizer  # noqa: E402
from training.provenance import provenance  # noqa: E402
from training.step import Trainer, train_step  # noqa: E402

# Sequences per step: the reference configs of issue 8 (gpt2 at 1 x 1024, small at 8 x 256).
DEFAULT_BATCH = {"nano": 8, "mini": 8, "small": 8, "gpt2": 1}
MODELS = {"gptlab": GPT, "reference": ReferenceGPT}
VARIANTS = ("gptlab-eager", "gptlab-compiled", "reference-eager", "reference-compiled")
BASELINE = "reference-eager"  # what the target compares gptlab against
# Large enough that a matmul runs at the CPU's full rate: 1024 reads low on two
# threads when another process holds a core.
CPU_PEAK_MATMUL_SIZE = 2048
OPTIM = OptimConfig(learning_rate=6e-4, min_lr=6e-5, weight_decay=0.1, beta1=0.9, beta2=0.95, grad_clip=1.0)


@dataclass
class Row:
    preset: str
    batch: int
    context: int
    vocab: int
    precision: str
    variant: str
    flops_per_token: float
    tokens_per_s: float  # fastest timed step
    median_tokens_per_s: float
    mfu: float | None
    over_reference_eager: float | None = None


class FixedBatch:
    """The batch source train_step expects (a Prefetcher's get and fetch_after), always
    answering with the same batch."""

    def __init__(self, config: GPTConfig, batch: int, device: torch.device) -> None:
        generator = torch.Generator().manual_seed(0)
        shape = (batch, config.block_size)
        self.x = torch.randint(config.vocab_size, shape, generator=generator).to(device)
        self.y = torch.randint(config.vocab_size, shape, generator=generator).to(device)
        self.device = device

    def get(self, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x, self.y

    def fetch_after(self, step: int, micro: int) -> None:
        pass


def variant_trainer(model: torch.nn.Module, compiled: bool, precision: Precision, device: torch.device) -> Trainer:
    """One variant: a model with its own optimizer, stepped exactly as train.py steps one."""
    if isinstance(model, GPT):  # train.py's AdamW; the reference builds its own, as nanoGPT does
        optimizer = build_optimizer(model, OPTIM, device.type)
    else:
        optimizer = model.configure_optimizer(
            OPTIM.weight_decay, OPTIM.learning_rate, (OPTIM.beta1, OPTIM.beta2), device.type
        )
    return Trainer(
        torch.compile(model) if compiled else model,
        optimizer,
        precision.grad_scaler(),
        precision.autocast(),
        accum_steps=1,
        grad_clip=OPTIM.grad_clip,
        ranks=Ranks(),
    )


def build_trainers(
    config: GPTConfig, variants: list[str], precision: Precision, device: torch.device
) -> dict[str, Trainer]:
    torch.manual_seed(0)
    with device:
        weights = GPT(config).state_dict()
        trainers = {}
        for variant in variants:
            name, mode = variant.split("-")
            model = MODELS[name](config)
            model.load_state_dict(weights)
            trainers[variant] = variant_trainer(model, mode == "compiled", precision, device)
    return trainers


def timed_steps(trainers: dict[str, Trainer], loader: FixedBatch, warmup: int, steps: int) -> dict[str, list[float]]:
    """Seconds of each timed step, per variant; the variants take turns step by step."""
    seconds: dict[str, list[float]] = {variant: [] for variant in trainers}
    for step in range(warmup + steps):
        for variant, trainer in trainers.items():
            synchronize(loader.device)
            start = time.perf_counter()
            train_step(trainer, loader, step)
            synchronize(loader.device)
            if step >= warmup:
                seconds[variant].append(time.perf_counter() - start)
    return seconds


def measure(
    preset: str, precision_name: str, peak: float | None, device: torch.device, args: argparse.Namespace
) -> list[Row]:
    """One row per variant for this preset and precision."""
    torch._dynamo.reset()  # compile each preset afresh instead of piling up recompilations
    config = model_preset(preset)
    batch = args.batch or DEFAULT_BATCH[preset]
    precision = resolve_precision(precision_name, device)
    seconds = timed_steps(
        build_trainers(config, args.variants, precision, device),
        FixedBatch(config, batch, device),
        args.warmup,
        args.steps,
    )
    tokens = batch * config.block_size
    flops = training_flops_per_token(config)
    rows = []
    for variant, times in seconds.items():
        rate = tokens / min(times)
        rows.append(
            Row(
                preset,
                batch,
                config.block_size,
                config.vocab_size,
                precision_name,
                variant,
                flops,
                rate,
                tokens / statistics.median(times),
                estimate_mfu(flops, rate, peak) if peak else None,
            )
        )
    baseline = next((r.tokens_per_s for r in rows if r.variant == BASELINE), None)
    for row in rows:
        row.over_reference_eager = row.tokens_per_s / baseline if baseline else None
    return rows


def training_flops_per_token(config: GPTConfig) -> float:
    return GPT.shapes_only(config).flops_per_token()


def precisions_for(preset: str, asked: list[str] | None, device: torch.device) -> list[str]:
    """fp32 and bf16 everywhere, except that by default a CPU runs bf16 for the mini
    preset only: without AVX512-BF16 or AMX a CPU's bf16 matmuls are many times slower
    than its fp32 ones, and a bf16 gpt2 step would take minutes."""
    if asked:
        return asked
    return ["fp32", "bf16"] if device.type == "cuda" or preset == "mini" else ["fp32"]


def measure_peak(device: torch.device, precision: str) -> float | None:
    if device.type == "cpu":
        return measure_matmul_flops(size=CPU_PEAK_MATMUL_SIZE, dtype=DTYPES[precision])
    peak = peak_flops(device, precision)
    return peak.flops if peak else None


HEADER = (
    f"{'preset':<7}{'batch':>6}{'context':>8}{'vocab':>7}  {'prec':<6}{'variant':<20}"
    f"{'tok/s':>9}{'MFU':>8}{'vs reference eager':>20}"
)


def format_row(r: Row) -> str:
    mfu = f"{100 * r.mfu:.1f}%" if r.mfu is not None else "-"
    ratio = f"{r.over_reference_eager:.2f}x" if r.over_reference_eager is not None else "-"
    return (
        f"{r.preset:<7}{r.batch:>6}{r.context:>8}{r.vocab:>7}  {r.precision:<6}{r.variant:<20}"
        f"{r.tokens_per_s:>9.1f}{mfu:>8}{ratio:>20}"
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda or cuda:N")
    parser.add_argument("--threads", type=int, help="CPU threads (default: torch's choice)")
    parser.add_argument("--presets", nargs="+", default=["mini", "small", "gpt2"], choices=list(DEFAULT_BATCH))
    parser.add_argument(
        "--precisions",
        nargs="+",
        choices=["fp32", "bf16"],
        help="default: fp32 and bf16, but on a CPU bf16 for the mini preset only",
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=VARIANTS,
        default=list(VARIANTS[:3]),
        help=f"default: all but reference-compiled; ratios need {BASELINE}",
    )
    parser.add_argument("--batch", type=int, help=f"sequences per step for every preset (default: {DEFAULT_BATCH})")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per variant (compilation happens here)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per variant")
    parser.add_argument(
        "--json",
        type=Path,
        help="where to write the results (default: "
        "./train_throughput_<device>.json; the committed baseline in bench/results/ stays as it is)",
    )
    parser.add_argument("--no-json", dest="write_json", action="store_false", help="print the table only")
    args = parser.parse_args()
    if args.warmup < 1 or args.steps < 1:
        parser.error("--warmup and --steps must be at least 1: the first step compiles and allocates")
    try:
        args.device = resolve_device(args.device)
    except ValueError as err:
        parser.error(str(err))
    return args


def main() -> None:
    args = parse_args()
    device = args.device
    if args.threads:
        torch.set_num_threads(args.threads)
    if device.type == "cuda":
        configure_cuda(tf32=True)
    plan = [
        (preset, precision) for preset in args.presets for precision in precisions_for(preset, args.precisions, device)
    ]
    load_before = os.getloadavg()[0]
    peaks = {precision: measure_peak(device, precision) for precision in sorted({p for _, p in plan})}
    print(f"{device.type} ({describe_machine(device)}), torch {torch.__version__}")
    print(
        "peak: "
        + ", ".join(f"{name} {peak / 1e9:,.0f} GFLOP/s" if peak else f"{name} unknown" for name, peak in peaks.items())
        + (
            f" (measured: {CPU_PEAK_MATMUL_SIZE}x{CPU_PEAK_MATMUL_SIZE} matmuls, best of 5)"
            if device.type == "cpu"
            else " (datasheet)"
        )
    )
    print(
        f"step: train.py's train_step (fused AdamW, clip {OPTIM.grad_clip}), the same batch every step; {args.warmup} "
        f"warm-up + {args.steps} timed steps per variant, variants taking turns; the fastest step is reported"
    )
    print(f"load average before: {load_before:.2f} (other busy processes make every figure slower)")
    print(HEADER)
    rows = []
    for preset, precision in plan:
        for row in measure(preset, precision, peaks[precision], device, args):
            rows.append(row)
            print(format_row(row), flush=True)
    load_after = os.getloadavg()[0]
    print(f"load average after: {load_after:.2f}")
    if args.write_json:
        path = args.json or Path(f"train_throughput_{device.type}.json")
        write_json(path, args, device, peaks, rows, (load_before, load_after))
        print(f"wrote {path}")


def write_json(
    path: Path, args: argparse.Namespace, device: torch.device, peaks: dict, rows: list[Row], load: tuple[float, float]
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "provenance": provenance(device),
                "device": f"{device.type} ({describe_machine(device)})",
                "torch": torch.__version__,
                "method": {
                    "step": "training.step.train_step: forward + loss under autocast, backward, grad norm + clip, "
                    "fused AdamW (found_inf skip), zero_grad(set_to_none)",
                    "warmup_steps": args.warmup,
                    "timed_steps": args.steps,
                    "tokens_per_s": "fastest timed step",
                },
                "peak_flops": peaks,
                "load_average": {"before": load[0], "after": load[1]},
                "rows": [asdict(row) for row in rows],
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
