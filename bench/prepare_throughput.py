"""Tokens per second of the prepare step, end to end.

    python bench/prepare_throughput.py                        # stdlib corpus, gpt2, 1 and all cores
    python bench/prepare_throughput.py data=shakespeare_char data.path=input.txt --num-proc 1 2

Each measurement is one `prepare()` call into a fresh temporary data directory with
a fresh datasets cache, so it includes everything a first run pays for (reading the
files through datasets, shuffling, tokenising, writing and splitting the shards) but
not the Python imports. The figure is (train + val tokens) / wall-clock seconds; the
best of --repeats runs is reported.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout

from data import prepare  # noqa: E402
from data.cli import config_from_overrides  # noqa: E402


def measure(cfg, num_proc: int, repeats: int) -> tuple[int, float]:
    """(tokens written, best wall-clock seconds) over `repeats` cold runs."""
    best = float("inf")
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as scratch:
            run_cfg = dataclasses.replace(cfg, num_proc=num_proc, data_dir=scratch, hf_cache_dir=f"{scratch}/hf")
            start = time.perf_counter()
            tokens = sum(prepare(run_cfg).meta["tokens"].values())
            best = min(best, time.perf_counter() - start)
    return tokens, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="data=<preset>, data.<field>=<value>")
    parser.add_argument("--num-proc", type=int, nargs="+", default=sorted({1, os.cpu_count() or 1}))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cfg = config_from_overrides(args.overrides)
    logging.disable(logging.WARNING)
    print(f"corpus {cfg.name} ({cfg.source}), tokenizer {cfg.tokenizer}; {os.cpu_count()} CPU cores, "
          f"{platform.processor() or platform.machine()}, Python {platform.python_version()}")
    print("cold prepare() into a fresh directory, imports excluded; best of", args.repeats)
    for num_proc in args.num_proc:
        tokens, seconds = measure(cfg, num_proc, args.repeats)
        print(f"num_proc={num_proc}: {tokens:,} tokens in {seconds:.2f} s = {tokens / seconds / 1e6:.2f} M tokens/s")


if __name__ == "__main__":
    main()
