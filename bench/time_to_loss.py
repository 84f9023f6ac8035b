"""Time to quality: the GPT-2 recipe against the modern one, for the same wall-clock, over seeds.

    python bench/time_to_loss.py                                  # the stdlib corpus, 2 recipes x 3 seeds
    python bench/time_to_loss.py --leave-one-out --seeds 1,2      # and the modern recipe without each piece
    python bench/time_to_loss.py --blocks --arms "modern,modern (nanochat block)" --budget-s 120  # vs nanochat's
    python bench/time_to_loss.py --corpus shakespeare_char --budget-s 120
    python bench/time_to_loss.py --seeds 1 --budget-s 60 --overrides model=gpt2 device=cuda precision=bf16
    python bench/time_to_loss.py --from-json bench/results/time_to_loss_stdlib.json --plot docs/images/time_to_loss.png

How it is measured. Every arm is `python train.py recipe=<recipe> <overrides>` run as a
child process on the same corpus, one after another, seeds outermost and arms interleaved
within a seed, so a change in the machine's load hits every arm alike. First each arm
trains a few calibration steps, twice, in turn with the others; its faster seconds per step
set its max_iters so that every arm gets the same training wall-clock budget, and each
decays its own schedule to its own end (as a speedrun does). A run's training seconds are
read from its metrics.jsonl: each
train record's window of steps took tokens / tok_per_s seconds, so evaluation, saving
and start-up are not counted. Losses are compared in bits per byte of validation text,
the one unit that stays fair across tokenizers.

The target is the GPT-2 recipe's final validation bits per byte (mean over seeds). For
every run the time and tokens to reach it are read off its evaluation curve (linear
between evaluations; none if it never gets there). The table gives means with 95%
Student's t intervals over seeds; with --leave-one-out, each piece's row is the modern
recipe without it ("modern - rope"), or with a speedrun piece it leaves out ("modern + muon"),
and its paired difference to the recipe says what the piece buys; with --blocks, the recipe with
another block in place of its own ("modern (nanochat block)"), the "modern" arm naming its block
(model/block=modern) so that it stays the architecture first measured.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # runnable from a checkout

from ablation.stats import mean_ci, paired_difference  # noqa: E402
from training.provenance import provenance  # noqa: E402

# What each corpus needs on top of the recipes, and whether the modern arms train a BPE on it
# (a character corpus keeps its characters).
# Shakespeare is fetched once from conf/data/shakespeare_char.yaml's url, unless a copy sits beside the checkout.
LOCAL_SHAKESPEARE = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
CORPORA = {
    "stdlib": ([], True),
    "shakespeare_char": (
        [
            "data=shakespeare_char",
            "pad_vocab_to=1",
            *([f"data.path={LOCAL_SHAKESPEARE}"] if LOCAL_SHAKESPEARE.is_file() else []),
        ],
        False,
    ),
}
# Each tokenizer prepares into a directory of its own: arms that alternate never rebuild each other's.
GPT2_TOKENIZER = ["data.tokenizer=gpt2", "data.vocab_size=null", "data.name=stdlib_gpt2"]
# The modern recipe's pieces, each the overrides that turn it back into GPT-2's choice.
PIECES = {
    "bpe": GPT2_TOKENIZER,
    "rope": ["model.position=learned"],
    "relu2": ["model.mlp=gelu"],
    "qk_norm": ["model.qk_norm=false"],
    "zero_init": ["model.zero_init_proj=false"],
}
# The speedrun's pieces the recipe leaves out, each the overrides that add it back.
CANDIDATES = {
    "rmsnorm": ["model.norm=rmsnorm"],
    "muon": ["optim.name=muon"],
    "untied": ["model.tie_embeddings=false"],
    "softcap": ["model.logit_softcap=15"],
    "documents": ["model.document_masks=true"],  # issue 48's pieces
    "value_embeds": ["model.value_embeds=1"],
    "unet": ["model.unet_skips=true"],
}
# The modern recipe's architecture as it was measured against GPT-2's, named whole, so the "modern"
# arm stays comparable whichever block the recipe chooses.
MODERN_PIN = ["model/block=modern"]
# Blocks that could become the modern recipe's, each the overrides that choose it (--blocks).
BLOCK_ARMS = {"nanochat": ["model/block=nanochat"]}
CALIBRATION_STEPS = 30
CALIBRATION_ROUNDS = 2


@dataclass
class Run:
    arm: str
    seed: int
    max_iters: int
    train_seconds: float = 0.0
    tokens: int = 0
    final_bpb: float = float("nan")
    curve: list[tuple[float, int, float]] = field(default_factory=list)  # (train seconds, tokens, val bpb)


def arms(corpus: str, leave_one_out: bool, vocab_size: int, blocks: bool = False) -> dict[str, list[str]]:
    """Each arm's overrides: the two recipes, the modern one without each piece (leave_one_out), and
    the modern one with each block of BLOCK_ARMS in place of its own (blocks)."""
    base, trains_bpe = CORPORA[corpus]
    gpt2_data = GPT2_TOKENIZER if trains_bpe else []
    modern_data = (
        ["data.tokenizer=bpe", f"data.vocab_size={vocab_size}", f"data.name=stdlib_bpe{vocab_size}"]
        if trains_bpe
        else []
    )
    table = {"gpt2": ["recipe=gpt2", *base, *gpt2_data], "modern": ["recipe=modern", *MODERN_PIN, *base, *modern_data]}
    if blocks:
        for block, choose in BLOCK_ARMS.items():
            table[f"modern ({block} block)"] = ["recipe=modern", *choose, *base, *modern_data]
    if leave_one_out:
        for piece, undo in PIECES.items():
            if piece != "bpe" or modern_data:
                table[f"modern - {piece}"] = [*table["modern"], *undo]
        for piece, add in CANDIDATES.items():
            table[f"modern + {piece}"] = [*table["modern"], *add]
    return table


def chosen_arms(args: argparse.Namespace) -> dict[str, list[str]]:
    table = arms(args.corpus, args.leave_one_out, args.vocab_size, args.blocks)
    return {arm: [*overrides, *args.overrides] for arm, overrides in table.items() if not args.arms or arm in args.arms}


def train(
    overrides: list[str], out_dir: Path, seed: int, max_iters: int, eval_interval: int, eval_iters: int
) -> list[dict]:
    """One training run as a child process; its metrics.jsonl records."""
    command = [
        sys.executable,
        "train.py",
        *overrides,
        f"seed={seed}",
        f"max_iters={max_iters}",
        f"eval_interval={eval_interval}",
        f"eval_iters={eval_iters}",
        f"out_dir={out_dir}",
        "logging.progress=false",
        "keep_last=1",
        "keep_state=latest",
    ]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "WANDB_MODE": "disabled"}
    )
    if done.returncode != 0:
        raise SystemExit(f"error: {' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


def read_run(arm: str, seed: int, max_iters: int, records: list[dict]) -> Run:
    """Training seconds, tokens and the val curve of one run's records."""
    run = Run(arm, seed, max_iters)
    for seconds, record in zip(_train_seconds(records), records):
        if record["kind"] == "eval" and record.get("val_bpb") is not None:
            run.curve.append((seconds, record["tokens"], record["val_bpb"]))
    run.train_seconds, run.tokens, run.final_bpb = run.curve[-1]
    return run


def _train_seconds(records: list[dict]) -> list[float]:
    """The training seconds up to each record: a train record's window of tokens took tokens / tok_per_s."""
    seconds, tokens, out = 0.0, 0, []
    for record in records:
        if record["kind"] == "train":
            seconds += (record["tokens"] - tokens) / record["tok_per_s"]
            tokens = record["tokens"]
        out.append(seconds)
    return out


def seconds_per_step(overrides: list[str], out_dir: Path) -> float:
    """A short run's training seconds per step, its first log window (warm-up of the machinery) left out."""
    records = [
        r
        for r in train(
            overrides, out_dir, seed=1, max_iters=CALIBRATION_STEPS, eval_interval=CALIBRATION_STEPS, eval_iters=1
        )
        if r["kind"] == "train"
    ]
    seconds = _train_seconds(records)
    return (seconds[-1] - seconds[0]) / (records[-1]["step"] - records[0]["step"])


def reach(run: Run, target: float) -> tuple[float, float] | None:
    """Training seconds and tokens at which the run's val curve first reaches target (linear between evaluations)."""
    if run.curve and run.curve[0][2] <= target:  # below it before training: a smaller vocabulary's start
        return run.curve[0][0], run.curve[0][1]
    for (s0, t0, b0), (s1, t1, b1) in zip(run.curve, run.curve[1:]):
        if b1 <= target:
            share = 1.0 if b0 == b1 else (b0 - target) / (b0 - b1)
            return s0 + share * (s1 - s0), t0 + share * (t1 - t0)
    return None


def measure(args: argparse.Namespace, scratch: Path) -> list[Run]:
    table = chosen_arms(args)
    # Arms calibrate in turn, CALIBRATION_ROUNDS times, each keeping its fastest: a burst of
    # another job's load during one calibration no longer hands that arm fewer steps.
    per_step: dict[str, list[float]] = {arm: [] for arm in table}
    for round_ in range(CALIBRATION_ROUNDS):
        for arm, overrides in table.items():
            per_step[arm].append(seconds_per_step(overrides, scratch / _slug(arm, f"calibration{round_}")))
    steps = {}
    for arm in table:
        steps[arm] = max(CALIBRATION_STEPS, round(args.budget_s / min(per_step[arm])))
        print(f"calibrated {arm}: {steps[arm]} steps in {args.budget_s:.0f} s", flush=True)
    runs = []
    for seed in args.seeds:
        for arm, overrides in table.items():
            records = train(
                overrides,
                scratch / _slug(arm, seed),
                seed,
                steps[arm],
                eval_interval=max(1, steps[arm] // args.evaluations),
                eval_iters=args.eval_iters,
            )
            runs.append(read_run(arm, seed, steps[arm], records))
            print(
                f"{arm} seed {seed}: {runs[-1].final_bpb:.4f} bits/byte after {runs[-1].train_seconds:.0f} s, "
                f"{runs[-1].max_iters} steps",
                flush=True,
            )
    return runs


def summarise(runs: list[Run]) -> list[dict]:
    """One row per arm: final bpb, the time and tokens to reach the GPT-2 recipe's final bpb, and the paired
    difference of the final bpb to the modern recipe."""
    by_arm: dict[str, list[Run]] = {}
    for run in runs:
        by_arm.setdefault(run.arm, []).append(run)
    target = mean_ci([r.final_bpb for r in by_arm["gpt2"]]).mean if "gpt2" in by_arm else None
    modern = [r.final_bpb for r in by_arm.get("modern", [])]
    rows = []
    for arm, arm_runs in by_arm.items():
        reached = [] if target is None else [reach(r, target) for r in arm_runs]
        hit = [x for x in reached if x is not None]
        rows.append(
            {
                "arm": arm,
                "seeds": [r.seed for r in arm_runs],
                "steps": arm_runs[0].max_iters,
                "train_seconds": mean_ci([r.train_seconds for r in arm_runs]).__dict__,
                "final_bpb": mean_ci([r.final_bpb for r in arm_runs]).__dict__,
                "vs_modern": None
                if arm == "modern" or not modern
                else asdict(paired_difference(modern, [r.final_bpb for r in arm_runs])),
                "reached": f"{len(hit)}/{len(reached)}" if reached else None,
                "target_bpb": target,
                "seconds_to_target": mean_ci([s for s, _ in hit]).__dict__ if hit else None,
                "tokens_to_target": mean_ci([t for _, t in hit]).__dict__ if hit else None,
            }
        )
    return rows


def markdown(rows: list[dict]) -> str:
    gpt2_seconds = next((r["train_seconds"]["mean"] for r in rows if r["arm"] == "gpt2"), None)
    lines = [
        "| arm | steps | train s | final val bits/byte | vs modern | reached target | s to target "
        "(share of GPT-2's) | tokens to target |",
        "|---|--:|--:|---|---|--:|---|--:|",
    ]
    lines += [_row(r, gpt2_seconds) for r in rows]
    return "\n".join(lines)


def _row(r: dict, gpt2_seconds: float) -> str:
    to, vs, tokens = r["seconds_to_target"], r["vs_modern"], r["tokens_to_target"]
    vs_text = "" if vs is None else _diff(vs["difference"])
    to_text = "" if to is None else f"{_ci(to, 0)} ({to['mean'] / gpt2_seconds:.0%})"
    tokens_text = "" if tokens is None else f"{round(tokens['mean']):,}"
    return (
        f"| {r['arm']} | {r['steps']:,} | {r['train_seconds']['mean']:.0f} | {_ci(r['final_bpb'])} | "
        f"{vs_text} | {r['reached'] or ''} | {to_text} | {tokens_text} |"
    )


def _slug(arm: str, suffix: object) -> str:
    return re.sub(r"[^\w-]+", "_", f"{arm.replace(' - ', '_minus_').replace(' + ', '_plus_')}_{suffix}")


def _ci(e: dict, digits: int = 4) -> str:
    spread = "" if e["n"] < 2 else f" ± {(e['high'] - e['low']) / 2:.{digits}f}"
    return f"{e['mean']:.{digits}f}{spread}"


def _diff(e: dict) -> str:
    if e["n"] < 2:
        return f"{e['mean']:+.4f}"
    return f"{e['mean']:+.4f} ({e['low']:+.4f}..{e['high']:+.4f})"


def plot(runs: list[Run], target: float | None, title: str, path: Path) -> None:
    """Val bits per byte against training seconds, one line per run, one colour per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.2))
    colours = {}
    for run in runs:
        colour = colours.setdefault(run.arm, f"C{len(colours)}")
        seconds, _, bpb = zip(*run.curve)
        axes.plot(
            seconds,
            bpb,
            color=colour,
            alpha=0.8,
            label=run.arm if run.arm not in axes.get_legend_handles_labels()[1] else None,
        )
    if target is not None:
        axes.axhline(target, color="grey", linestyle="--", linewidth=1, label="GPT-2 recipe's final (mean)")
    axes.set(xlabel="training seconds", ylabel="val bits per byte", title=title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", choices=tuple(CORPORA), default="stdlib")
    parser.add_argument("--budget-s", type=float, default=300.0, help="training seconds per run (default: 300)")
    parser.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 3])
    parser.add_argument(
        "--leave-one-out",
        action="store_true",
        help="also the modern recipe without each piece, and with each piece it leaves out",
    )
    parser.add_argument(
        "--blocks",
        action="store_true",
        help="also the modern recipe with each other block that could be its own (nanochat's)",
    )
    parser.add_argument("--vocab-size", type=int, default=4096, help="the modern arms' trained BPE (stdlib)")
    parser.add_argument(
        "--arms",
        type=lambda s: s.split(","),
        help="only these arms (without gpt2, no target: the table compares final losses)",
    )
    parser.add_argument(
        "--overrides",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="train.py overrides for every arm, after the arm's own (a size, a device)",
    )
    parser.add_argument("--evaluations", type=int, default=12, help="evaluations per run, for the curves")
    parser.add_argument("--eval-iters", type=int, default=20, help="val batches per evaluation (default: 20)")
    parser.add_argument("--json", type=Path, help="where to write the results (default: bench/results/)")
    parser.add_argument("--plot", type=Path, help="also draw every run's val curve into this PNG")
    parser.add_argument("--from-json", type=Path, help="train nothing: the table (and --plot) of a results file")
    args = parser.parse_args()
    if args.from_json:
        record = json.loads(args.from_json.read_text())
        runs = [Run(**r) for r in record["runs"]]
    else:
        record = {
            **provenance(),
            "corpus": args.corpus,
            "budget_s": args.budget_s,
            "seeds": args.seeds,
            "arms": chosen_arms(args),
        }
        print(f"{record['machine']}, torch {record['torch']}, gptlab {record['gptlab']}", flush=True)
        with tempfile.TemporaryDirectory(prefix="time_to_loss_") as scratch:
            runs = measure(args, Path(scratch))
        out = args.json or ROOT / "bench" / "results" / f"time_to_loss_{args.corpus}.json"
        out.write_text(
            json.dumps({**record, "rows": summarise(runs), "runs": [asdict(r) for r in runs]}, indent=2) + "\n"
        )
        print(f"wrote {out}")
    rows = summarise(runs)
    print(markdown(rows))
    if args.plot:
        title = f"{record['corpus']}, {record['budget_s']:g} s per run, seeds {', '.join(map(str, record['seeds']))}"
        plot(runs, rows[0]["target_bpb"], title, args.plot)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
