"""How well the trained tokenizer (data.tokenizer=bpe) compresses held-out text, by vocabulary
size, split pattern and training sample, against GPT-2's tokenizer on the same text.

    python bench/bpe_vocab.py                                            # the stdlib corpus
    python bench/bpe_vocab.py --corpus /path/to/site-packages --vocab 8192 32768 --sample-mb 4 16 64 192
    python bench/bpe_vocab.py --corpus /path/to/site-packages --vocab 8192 --sample-mb 64 192 --repeat 3
    python bench/bpe_vocab.py --vocab 4096 --patterns gptlab --seen no yes   # what seeing the held-out text is worth

Corpus: `stdlib` is the default data corpus (the standard library's .py files and pydoc
topics, as data/sources.py reads them); a directory means its .py files. Its documents are
shuffled (seed 0); the first 8 MiB of them (a fifth of a smaller corpus) are held out, and
tokenizers learn from the rest, or from its first --sample-mb MiB (data/bpe.py's cut). Each
training runs in a fresh process, so its peak RSS is its own.

Figures per row: held-out UTF-8 bytes per token (more is better: shorter sequences for the
same text), the training's seconds, and that process's peak RSS, of which the imports alone
take the `baseline` printed first. Patterns: `gptlab` is data/bpe.py's SPLIT_PATTERN,
`gpt2` GPT-2's own (whitespace runs give their last space to the next word). With --repeat N
each tokenizer is trained N times, each in its own process, and the sha256 of its
tokenizer.json shows whether the runs agree. With --seen yes a tokenizer also learns from the
held-out documents (first), as `data.tokenizer=bpe` learns from the val split's documents too:
its held-out figure against the `no` row's is what having seen the text is worth.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import multiprocessing
import random
import resource
import sys
import time
from pathlib import Path

import tokenizers

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # runnable from a checkout

import data.bpe as bpe  # noqa: E402
from data import DataConfig, Gpt2Tokenizer  # noqa: E402
from data.sources import open_corpus  # noqa: E402
from training.provenance import provenance  # noqa: E402

PATTERNS = {
    "gptlab": bpe.SPLIT_PATTERN,
    "gpt2": r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
}
HELD_OUT_BYTES = 8 << 20
SEED = 0


def documents(corpus: str) -> list[str]:
    """The corpus's documents, shuffled with SEED."""
    if corpus == "stdlib":
        docs, pieces = [], open_corpus(DataConfig(), piece_chars=1 << 16).reader.pieces()
        for piece in pieces:
            if piece.new_document:
                docs.append("")
            docs[-1] += piece.text
    else:
        docs = [p.read_text("utf-8", errors="replace") for p in sorted(Path(corpus).rglob("*.py")) if p.is_file()]
    random.Random(SEED).shuffle(docs)
    return docs


def split(docs: list[str]) -> tuple[list[str], list[str]]:
    """(training documents, the first HELD_OUT_BYTES of documents, or a fifth of the corpus if less)."""
    held, size, limit = [], 0, min(HELD_OUT_BYTES, _bytes(docs) // 5)
    while size < limit:
        held.append(docs[len(held)])
        size += len(held[-1].encode("utf-8"))
    return docs[len(held) :], held


def measure(corpus: str, vocab: int, pattern: str, sample_bytes: int, seen: bool = False) -> dict:
    """One tokenizer trained and measured; runs in a child process."""
    train, held = split(documents(corpus))
    train = held + train if seen else train
    bpe.SPLIT_PATTERN = PATTERNS[pattern]
    start = time.perf_counter()
    tokenizer = bpe.train_bpe(bpe._leading_bytes(train, sample_bytes), vocab)
    seconds = time.perf_counter() - start
    held_bytes = sum(len(d.encode("utf-8")) for d in held)
    tokens = sum(len(tokenizer.encode_array(d)) for d in held)
    return {
        "vocab": vocab,
        "pattern": pattern,
        "seen": seen,
        "sample_mib": min(sample_bytes, _bytes(train)) / 2**20,
        "ids": tokenizer.vocab_size,
        "sha256": hashlib.sha256(tokenizer.json.encode("utf-8")).hexdigest(),
        "bytes_per_token": held_bytes / tokens,
        "train_seconds": seconds,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def baseline(corpus: str) -> dict:
    """The reference in a child like the others: GPT-2's tokenizer, and the RSS before any training."""
    train, held = split(documents(corpus))
    tokens = sum(len(Gpt2Tokenizer().encode_array(d)) for d in held)
    return {
        "train_mib": _bytes(train) / 2**20,
        "held_out_mib": _bytes(held) / 2**20,
        "gpt2_bytes_per_token": _bytes(held) / tokens,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _bytes(docs: list[str]) -> int:
    return sum(len(d.encode("utf-8")) for d in docs)


def in_child(function, *args):
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(function, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default="stdlib", help="stdlib, or a directory of .py files")
    parser.add_argument("--vocab", type=int, nargs="+", default=[512, 2048, 4096, 8192, 16384])
    parser.add_argument("--patterns", nargs="+", choices=sorted(PATTERNS), default=["gptlab", "gpt2"])
    parser.add_argument(
        "--sample-mb",
        type=float,
        nargs="+",
        default=[bpe.TRAINING_SAMPLE_BYTES / 2**20],
        help="MiB of training text each tokenizer learns from (default: data/bpe.py's)",
    )
    parser.add_argument(
        "--seen",
        nargs="+",
        choices=("no", "yes"),
        default=["no"],
        help="whether tokenizers also learn from the held-out text (default: no)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="trainings of each tokenizer, to compare")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    reference = in_child(baseline, args.corpus)
    print(
        f"{args.corpus}: {reference['train_mib']:.1f} MiB to train on, {reference['held_out_mib']:.1f} MiB held out; "
        f"GPT-2's tokenizer: {reference['gpt2_bytes_per_token']:.3f} bytes/token; baseline RSS "
        f"{reference['peak_rss_mib']:.0f} MiB"
    )
    print(
        f"{'vocab':>6} {'pattern':<7} {'seen':<4} {'sample MiB':>10} {'ids':>6} {'bytes/token':>11} {'train s':>8} "
        f"{'peak RSS MiB':>12}  sha256"
    )
    rows = []
    for vocab in args.vocab:
        for sample_mb in args.sample_mb:
            for pattern, seen in itertools.product(args.patterns, args.seen):
                for _ in range(args.repeat):
                    rows.append(in_child(measure, args.corpus, vocab, pattern, int(sample_mb * 2**20), seen == "yes"))
                    r = rows[-1]
                    print(
                        f"{vocab:>6} {pattern:<7} {seen:<4} {r['sample_mib']:>10.1f} {r['ids']:>6} "
                        f"{r['bytes_per_token']:>11.3f} "
                        f"{r['train_seconds']:>8.1f} {r['peak_rss_mib']:>12.0f}  {r['sha256'][:12]}",
                        flush=True,
                    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "provenance": provenance() | {"tokenizers": tokenizers.__version__},
                    "settings": vars(args) | {"json": str(args.json)},
                    "reference": reference,
                    "rows": rows,
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
