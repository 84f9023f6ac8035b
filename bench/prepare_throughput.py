"""Throughput, memory and disk of the prepare step (`python prepare.py`) on a multi-GB local corpus.

    python bench/prepare_throughput.py                                    # 3 GB, all five layouts
    python bench/prepare_throughput.py --gb 0.2 --kinds jsonl parquet --threads 2
    python bench/prepare_throughput.py --gb 3 --scratch /big/disk/bench --keep --json prepare.json
    python bench/prepare_throughput.py --gb 1 --extra data.verify=size    # more overrides, every run

--json also keeps every sample of every run ([seconds, rss, pss, disk bytes]), to tell a
plateau from a growth.

The corpus (no network) is made by bench/synthetic_corpus.py: real, varied text from the
running Python's standard library, --gb GB (10^9 bytes) of it, written in each layout
asked for: text-file (one .txt, documents joined by a blank line: one document for
gptlab), text-dir (up to 2,000 .txt files), jsonl, parquet (8 files, row groups of
10,000 rows) and hub-dir (links to the parquet files, read as a streamed Hub dataset:
data.source=hub data.dataset=<dir> data.streaming=true). Corpora are cached in
--scratch; without --scratch a temporary directory is used and removed (unless --keep).

What is measured. Each kind is one `python prepare.py <overrides> data.data_dir=<fresh dir>
data.name=bench [data.num_proc=--threads] [--extra ...]` subprocess, started from the
repository root with HF_HUB_OFFLINE=1 and HF_DATASETS_OFFLINE=1. Its wall-clock time
includes the Python imports. Every 0.2 s a thread sums, over the child's whole process
tree (found by parent pid in /proc), the RSS (VmRSS) and the PSS (smaps_rollup), and
counts the bytes allocated under the data directory (which holds datasets' cache,
<data_dir>/hf_cache, unless --extra data.hf_cache_dir=... moves it: then that directory
counts too). The peaks are reported (a spike shorter than 0.2 s can slip between two
samples), and the bytes left there at the end. tokens/s = (train + val tokens of
meta.json) / wall seconds. The reference, on the same cores in the same run, is raw
tiktoken: GPT-2's encoding (built offline by data.tokenizer.gpt2_encoding) running
`encode_ordinary_batch(docs, num_threads=T)` over the first 256 MB of the same stream,
in batches of 1,000 documents; T is --threads or the cores in this process's affinity
mask; the best of one run before the kinds and one after them (so a load that comes and
goes during the benchmark weighs less on the ratios). The 1-minute load average before
and after is printed: other work on the machine slows every figure.

Disk: the corpora take about 3.4 x --gb GB (parquet compresses to ~0.4x), and a run
needs room for its shards (~0.9 x --gb GB of GPT-2 tokens) and whatever prepare keeps
beside them; each run's data directory is deleted after it unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch  # the version only (training.provenance imports it anyway)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # runnable from a checkout: data.tokenizer for the reference

from bench.process_tree import SAMPLE_SECONDS, Measurement, measure_command  # noqa: E402
from bench.synthetic_corpus import (  # noqa: E402
    GB,
    KINDS,
    SEED,
    PoolDocument,
    corpus_path,
    document_stream,
    load_pool,
    prepare_corpora,
)
from training.provenance import git_state, utc_now  # noqa: E402

REFERENCE_BYTES = 256 * 10**6
REFERENCE_BATCH = 1000  # documents per encode_ordinary_batch call (prepare's batch size)
CHILD_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


# --- one prepare run per kind -------------------------------------------------------------


def kind_overrides(kind: str, path: Path) -> list[str]:
    if kind == "hub-dir":
        return ["data.source=hub", f"data.dataset={_quoted(path)}", "data.streaming=true"]
    return ["data=files", f"data.path={_quoted(path)}"]


def _quoted(path: Path) -> str:
    """A path as a Hydra override value: quoted when it holds characters Hydra would parse."""
    text = str(path)
    plain = all(c.isalnum() or c in "/._-+" for c in text)
    return text if plain else "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def extra_cache_dirs(extra: list[str]) -> list[Path]:
    """A datasets cache moved out of the data directory by `data.hf_cache_dir=...`: its bytes count too."""
    values = [item.split("=", 1)[1].strip("'\"") for item in extra if item.startswith("data.hf_cache_dir=")]
    return [(ROOT / Path(value).expanduser()).resolve() for value in values if value not in ("", "null")]


def run_kind(kind: str, corpus: Path, entry: dict, run_dir: Path, threads: int | None, extra: list[str]) -> dict:
    """One `python prepare.py` into a fresh data directory: the kind's report row."""
    shutil.rmtree(run_dir, ignore_errors=True)
    data_dir = run_dir / "data"
    overrides = kind_overrides(kind, corpus) + [f"data.data_dir={_quoted(data_dir)}", "data.name=bench"]
    overrides += [f"data.num_proc={threads}"] if threads else []
    command = [sys.executable, "prepare.py", *overrides, *extra]
    print(f"{kind}: python {' '.join(command[1:])}", flush=True)
    disk_dirs = [data_dir] + [d for d in extra_cache_dirs(extra) if data_dir not in d.parents]
    measurement = measure_command(command, disk_dirs, run_dir, cwd=ROOT, env={**os.environ, **CHILD_ENV})
    row = {
        "kind": kind,
        "text_bytes": entry["text_bytes"],
        "file_bytes": entry["file_bytes"],
        "files": entry["files"],
        "documents": entry["documents"],
        "command": command,
        "returncode": measurement.returncode,
        "seconds": measurement.seconds,
        **_peaks_row(measurement),
    }
    if measurement.returncode != 0:
        lines = (run_dir / "stderr.log").read_text(errors="replace").split("\n")
        tail = [line.rsplit("\r", 1)[-1] for line in lines if line.strip()][-20:]  # a progress bar's last state
        print(f"{kind}: FAILED (exit {measurement.returncode}); stderr ends:\n    " + "\n    ".join(tail), flush=True)
        return row
    row.update(_shard_figures(data_dir, measurement))
    print(
        f"{kind}: {row['tokens']:,} tokens in {row['seconds']:.1f} s, peak RSS {_size(row['peak_rss_bytes'])}, "
        f"peak disk {_size(row['peak_disk_bytes'])}",
        flush=True,
    )
    return row


def _peaks_row(measurement: Measurement) -> dict:
    peaks = measurement.peaks
    return {
        "peak_rss_bytes": peaks.rss,
        "peak_pss_bytes": peaks.pss,
        "peak_disk_bytes": peaks.disk,
        "disk_left_bytes": measurement.disk_left,
        "peak_processes": peaks.processes,
        "samples": peaks.samples,
        "mean_sample_interval_s": measurement.seconds / max(1, peaks.samples),
        "slowest_sample_s": peaks.slowest_sample_s,
        "timeline": peaks.timeline,
    }


def _shard_figures(data_dir: Path, measurement: Measurement) -> dict:
    meta = json.loads((data_dir / "meta.json").read_text())
    tokens = meta["tokens"]["train"] + meta["tokens"]["val"]
    shard_bytes = sum((data_dir / f"{split}.bin").stat().st_size for split in ("train", "val"))
    return {
        "tokens": tokens,
        "train_tokens": meta["tokens"]["train"],
        "val_tokens": meta["tokens"]["val"],
        "tokens_per_s": tokens / measurement.seconds,
        "shard_bytes": shard_bytes,
        "disk_over_shards": measurement.peaks.disk / shard_bytes,
    }


# --- the raw tiktoken reference ------------------------------------------------------------


def raw_tiktoken_rate(pool: list[PoolDocument], total_bytes: int, threads: int, repeats: int = 1) -> dict:
    """GPT-2 encoding of the stream's first `total_bytes` by tiktoken alone; the best of `repeats`."""
    from data.tokenizer import gpt2_encoding  # offline: built from local files

    encoding = gpt2_encoding()
    documents = list(document_stream(pool, total_bytes))
    text_bytes = sum(len(d.encode("utf-8")) for d in documents)
    best, tokens = float("inf"), 0
    for _ in range(repeats):
        start, tokens = time.perf_counter(), 0
        for first in range(0, len(documents), REFERENCE_BATCH):
            batch = documents[first : first + REFERENCE_BATCH]
            tokens += sum(map(len, encoding.encode_ordinary_batch(batch, num_threads=threads)))
        best = min(best, time.perf_counter() - start)
    return {
        "kind": "raw tiktoken",
        "threads": threads,
        "text_bytes": text_bytes,
        "documents": len(documents),
        "tokens": tokens,
        "seconds": best,
        "tokens_per_s": tokens / best,
    }


# --- the report ---------------------------------------------------------------------------


def machine_description() -> dict:
    cpu = next(
        (line.split(":", 1)[1].strip() for line in _lines("/proc/cpuinfo") if line.startswith("model name")),
        platform.processor() or platform.machine(),
    )
    memory = next((int(line.split()[1]) * 1024 for line in _lines("/proc/meminfo") if line.startswith("MemTotal:")), 0)
    return {
        "date": utc_now(),
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "memory_bytes": memory,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "gptlab": git_state(("data", "conf")),
        "load_average": os.getloadavg()[0],
    }


def _lines(path: str) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except OSError:
        return []


def print_header(machine: dict, args: argparse.Namespace, scratch: Path) -> None:
    num_proc = args.threads or "not set (prepare's default)"
    print(
        f"CPU: {machine['cpu']}; {machine['cores']} cores in the affinity mask; "
        f"{machine['memory_bytes'] / GB:.1f} GB RAM; Python {machine['python']}; gptlab {machine['gptlab']}"
    )
    print(
        f"corpus: {args.gb:g} GB (10^9 bytes of UTF-8 text) per kind, seed {SEED}, in {scratch}; "
        f"data.num_proc: {num_proc}; extra overrides: {' '.join(args.extra) or 'none'}"
    )
    print(
        "tokens/s = (train+val tokens)/wall seconds of `python prepare.py`, imports included; peak RSS = sum over "
        f"the process tree, sampled every {SAMPLE_SECONDS} s; peak PSS likewise; disk = bytes under the data "
        "dir at the peak over final shard bytes; vs raw = tokens/s over raw tiktoken's "
        "(encode_ordinary_batch, same threads, first 256 MB of the same stream, best of a run before "
        "and one after the kinds)",
        flush=True,
    )


TABLE_HEAD = (
    "kind",
    "text GB",
    "files GB",
    "tokens",
    "seconds",
    "tokens/s",
    "peak RSS GB",
    "peak PSS GB",
    "peak disk / shards",
    "disk left",
    "vs raw tiktoken",
)


def markdown_table(reference: dict | None, rows: list[dict]) -> str:
    lines = ["| " + " | ".join(TABLE_HEAD) + " |", "|------|" + "---:|" * (len(TABLE_HEAD) - 1)]
    if reference:
        threads = f"{reference['threads']} thread{'s' if reference['threads'] > 1 else ''}"
        cells = [
            f"raw tiktoken ({threads})",
            f"{reference['text_bytes'] / GB:.3f}",
            "-",
            f"{reference['tokens']:,}",
            f"{reference['seconds']:.2f}",
            _rate(reference["tokens_per_s"]),
        ]
        lines.append("| " + " | ".join(cells + ["-"] * 4 + ["1.00"]) + " |")
    lines += ["| " + " | ".join(_table_cells(row, reference)) + " |" for row in rows]
    return "\n".join(lines)


def _table_cells(row: dict, reference: dict | None) -> list[str]:
    cells = [row["kind"], f"{row['text_bytes'] / GB:.3f}", f"{row['file_bytes'] / GB:.3f}"]
    memory = [f"{row['peak_rss_bytes'] / GB:.2f}", f"{row['peak_pss_bytes'] / GB:.2f}"]
    if row["returncode"] != 0:
        return cells + [f"failed (exit {row['returncode']})", f"{row['seconds']:.2f}", "-", *memory, "-", "-", "-"]
    versus = f"{row['tokens_per_s'] / reference['tokens_per_s']:.2f}" if reference else "-"
    disk = f"{_size(row['peak_disk_bytes'])} / {_size(row['shard_bytes'])} ({row['disk_over_shards']:.1f}x)"
    return cells + [
        f"{row['tokens']:,}",
        f"{row['seconds']:.2f}",
        _rate(row["tokens_per_s"]),
        *memory,
        disk,
        _size(row["disk_left_bytes"]),
        versus,
    ]


def _size(nbytes: int) -> str:
    return f"{nbytes / GB:.2f} GB" if nbytes >= GB else f"{nbytes / 10**6:.1f} MB"


def _rate(tokens_per_s: float) -> str:
    return f"{tokens_per_s / 1e6:.2f}M"


# --- command line -------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=3.0, help="corpus size per kind, in 10^9 bytes of text")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--scratch", type=Path, help="where corpora are cached and runs write (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary scratch and every run's data dir")
    parser.add_argument("--threads", type=int, help="data.num_proc and tiktoken's threads (default: all cores)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--extra", nargs="+", default=[], metavar="KEY=VALUE", help="more `python prepare.py` overrides"
    )
    args = parser.parse_args(argv)
    if args.gb <= 0 or (args.threads is not None and args.threads < 1):
        parser.error("--gb must be positive and --threads at least 1")
    args.kinds = sorted(set(args.kinds), key=KINDS.index)
    return args


def run_benchmark(args: argparse.Namespace, scratch: Path) -> dict:
    """Generate (or reuse) the corpora, time raw tiktoken, then one `python prepare.py` per kind."""
    machine = machine_description()
    print_header(machine, args, scratch)
    pool = load_pool()
    corpus_dir = scratch / "corpus"
    entries = prepare_corpora(corpus_dir, args.gb, args.kinds, pool)
    settings = {
        "gb": args.gb,
        "seed": SEED,
        "kinds": args.kinds,
        "threads": args.threads,
        "extra": args.extra,
        "child_env": CHILD_ENV,
        "sample_seconds": SAMPLE_SECONDS,
        "scratch": str(scratch),
        "peak_rss_after_corpora_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }  # kB
    reference_bytes, threads = min(REFERENCE_BYTES, int(args.gb * GB)), args.threads or machine["cores"]
    before = raw_tiktoken_rate(pool, reference_bytes, threads)
    print(f"raw tiktoken: {before['tokens']:,} tokens in {before['seconds']:.2f} s", flush=True)
    rows = []
    for kind in args.kinds:
        run_dir = scratch / "runs" / kind
        corpus = corpus_path(corpus_dir, kind, entries[kind])
        rows.append(run_kind(kind, corpus, entries[kind], run_dir, args.threads, args.extra))
        if not args.keep:
            shutil.rmtree(run_dir / "data", ignore_errors=True)
    after = raw_tiktoken_rate(pool, reference_bytes, threads)  # the best of one run before and one after
    print(f"raw tiktoken again: {after['tokens']:,} tokens in {after['seconds']:.2f} s", flush=True)
    reference = min(before, after, key=lambda result: result["seconds"])
    table = markdown_table(reference, rows)
    load = {"before": machine["load_average"], "after": os.getloadavg()[0]}
    print(
        "\n" + table + f"\n\n1-minute load average: {load['before']:.2f} before, {load['after']:.2f} after "
        f"(on {machine['cores']} cores; anything else running slows every figure)"
    )
    reference = dict(reference, seconds_before=before["seconds"], seconds_after=after["seconds"])
    return {
        "machine": machine,
        "load_average": load,
        "settings": settings,
        "reference": reference,
        "rows": rows,
        "table": table,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    temporary = args.scratch is None
    scratch = Path(tempfile.mkdtemp(prefix="prepare-bench-")) if temporary else args.scratch.resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        result = run_benchmark(args, scratch)
    finally:
        if temporary and not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if all(row["returncode"] == 0 for row in result["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
