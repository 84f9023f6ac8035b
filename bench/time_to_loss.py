"""Time to quality: the GPT-2 recipe against the modern one, or today's default against the new one, over seeds.

    python bench/time_to_loss.py                                  # the stdlib corpus, 2 recipes x 3 seeds
    python bench/time_to_loss.py --leave-one-out --seeds 1,2      # and the modern recipe without each piece
    python bench/time_to_loss.py --blocks --arms "modern,modern (nanochat block)" --budget-s 120  # vs nanochat's
    python bench/time_to_loss.py --speedrun --arms today,default --json bench/results/speedrun.json  # issue 48
    python bench/time_to_loss.py --corpus shakespeare_char --budget-s 120
    python bench/time_to_loss.py --seeds 1 --budget-s 60 --overrides model=gpt2 device=cuda precision=bf16
    python bench/time_to_loss.py --from-json bench/results/time_to_loss_stdlib.json --plot docs/images/time_to_loss.png

How it is measured. Every arm is `python train.py <its overrides>` run as a child process on the
same corpus, one after another, seeds outermost and arms interleaved within a seed, in reverse
order every other seed, so a change in the machine's load hits every arm alike. First each arm
trains a few calibration steps, twice, in turn with the others; its faster seconds per step set
its max_iters so that every arm gets the same training wall-clock budget, and each decays its
own schedule to its own end (as a speedrun does). With --speedrun there is no budget: each arm
trains its own configured max_iters, as `python train.py` would. A run's seconds are what its
user waits for: its start-up, from the child's launch to the end of its step-0 evaluation (the
time metrics.jsonl records it; imports, data, model, torch.compile's first graphs and that
evaluation), plus its training seconds, read from metrics.jsonl: each train record's window of
steps took tokens / tok_per_s seconds (the first window holds the first step, and the training
graph's compiling). Later evaluations and saves are not counted: how many there are is the
benchmark's choice. Losses are compared in bits per byte of validation text, the one unit that
stays fair across tokenizers.

The target is the GPT-2 recipe's final validation bits per byte (mean over seeds), or with
--speedrun that of "today", the default as it was at gptlab 47275ab, every setting a later
default may change pinned (TODAY). For every run the seconds and tokens to reach it are read off
its evaluation curve (linear between evaluations; none if it never gets there), with their
share of the target arm's whole run of the same seed. The table gives means with 95% Student's
t intervals over seeds; with --leave-one-out, each piece's row is the modern recipe without it
("modern - rope"), or with a speedrun piece it leaves out ("modern + muon"), and its paired
difference to the recipe says what the piece buys; with --blocks, the recipe with another block
in place of its own ("modern (nanochat block)"), the "modern" arm naming its block
(model/block=modern) so that it stays the architecture first measured; with --speedrun, today's
default with each piece added ("today + bf16", leave-one-in) and "default", `python train.py`
as it is now, each paired with "today".
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # runnable from a checkout

from hydra import compose, initialize_config_dir  # noqa: E402

from bench.time_to_loss_table import Run, markdown, plot, summarise  # noqa: E402
from conf import CONF_DIR  # noqa: E402
from hf.llama import NANOCHAT_MODERN  # noqa: E402
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
    "unet": ["model.unet_skips=true"],
}
# The modern recipe's architecture as it was measured against GPT-2's, named whole, so the "modern"
# arm stays comparable whichever block the recipe chooses.
MODERN_PIN = ["model/block=modern"]
# Blocks that could become the modern recipe's, each the overrides that choose it (--blocks).
BLOCK_ARMS = {"nanochat": ["model/block=nanochat"]}
# --speedrun: today's default as it ran at gptlab 47275ab (issue 48's baseline: 600 steps, 1.82 bits per
# byte), every setting a later default may change named, so that the arm "today" stays that run.
TODAY = [
    "recipe=modern",
    "model=mini",
    "model/block=modern",
    "model.zero_init_proj=true",
    "max_iters=600",
    "batch_size=8",
    "precision=fp32",
    "compile=false",
    "optim.name=adamw",
    "optim.learning_rate=0.002",
    "optim.min_lr=0.0002",
    "optim.warmup_iters=100",
    "optim.cooldown_frac=null",
    "model.document_masks=false",
    "model.unet_skips=false",
]
# The speedrun's pieces, each the overrides that add it to today's default (leave-one-in).
SPEEDRUN_PIECES = {
    "bf16": ["precision=bf16"],  # what precision=auto now chooses on a CPU with avx512_bf16 or amx_bf16
    "compile": ["compile=true"],
    "wsd": ["optim.cooldown_frac=0.5", "optim.learning_rate=0.003", "optim.min_lr=0.0003"],  # the schedule and its peak
    **{piece: CANDIDATES[piece] for piece in ("documents", "unet")},
    # the embedding norm NanoChatForCausalLM has, the blocks' writes scaled to keep their weight beside it
    "embed_norm": list(NANOCHAT_MODERN),
}
CALIBRATION_STEPS = 30
CALIBRATION_ROUNDS = 2


def arms(
    corpus: str, leave_one_out: bool, vocab_size: int, blocks: bool = False, speedrun: bool = False
) -> dict[str, list[str]]:
    """Each arm's overrides: the two recipes, the modern one without each piece (leave_one_out), and
    the modern one with each block of BLOCK_ARMS in place of its own (blocks); or (speedrun) today's
    default, the default, and today's with each of SPEEDRUN_PIECES."""
    base, trains_bpe = CORPORA[corpus]
    gpt2_data = GPT2_TOKENIZER if trains_bpe else []
    modern_data = (
        ["data.tokenizer=bpe", f"data.vocab_size={vocab_size}", f"data.name=stdlib_bpe{vocab_size}"]
        if trains_bpe
        else []
    )
    if speedrun:
        table = {"today": [*TODAY, *base, *modern_data], "default": [*base, *modern_data]}
        return table | {f"today + {piece}": [*table["today"], *add] for piece, add in SPEEDRUN_PIECES.items()}
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
    table = arms(args.corpus, args.leave_one_out, args.vocab_size, args.blocks, args.speedrun)
    return {arm: [*overrides, *args.overrides] for arm, overrides in table.items() if not args.arms or arm in args.arms}


def train(
    overrides: list[str], out_dir: Path, seed: int, max_iters: int, eval_interval: int, eval_iters: int
) -> tuple[list[dict], float]:
    """One training run as a child process: its metrics.jsonl records, and its start-up seconds
    (launch to the end of the step-0 evaluation: imports, data, model, compiling, the first evaluation)."""
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
    launched = time.time()  # the clock metrics.jsonl's "time" is read on
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "WANDB_MODE": "disabled"}
    )
    if done.returncode != 0:
        raise SystemExit(f"error: {' '.join(command)} failed:\n{done.stderr[-3000:]}")
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return records, next(r["time"] for r in records if r["kind"] == "eval") - launched


def read_run(arm: str, seed: int, max_iters: int, records: list[dict], startup_seconds: float = 0.0) -> Run:
    """Training seconds, tokens and the val curve of one run's records."""
    last = max(r["step"] for r in records if r["kind"] == "eval")
    if last != max_iters:  # a signal stops train.py cleanly, exit status 0: its curve would end early
        raise SystemExit(f"error: {arm} seed {seed} stopped at step {last} of {max_iters}: measure it again")
    run = Run(arm, seed, max_iters, startup_seconds=startup_seconds)
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
    records, _ = train(
        overrides, out_dir, seed=1, max_iters=CALIBRATION_STEPS, eval_interval=CALIBRATION_STEPS, eval_iters=1
    )
    records = [r for r in records if r["kind"] == "train"]
    seconds = _train_seconds(records)
    return (seconds[-1] - seconds[0]) / (records[-1]["step"] - records[0]["step"])


def measure(args: argparse.Namespace, scratch: Path) -> list[Run]:
    table = chosen_arms(args)
    steps = configured_steps(table) if args.speedrun else calibrated_steps(table, args.budget_s, scratch)
    runs = []
    for turn, seed in enumerate(args.seeds):
        for arm, overrides in list(table.items())[:: -1 if turn % 2 else 1]:  # no arm always first
            records, startup = train(
                overrides,
                scratch / _slug(arm, seed),
                seed,
                steps[arm],
                eval_interval=max(1, steps[arm] // args.evaluations),
                eval_iters=args.eval_iters,
            )
            runs.append(read_run(arm, seed, steps[arm], records, startup))
            print(
                f"{arm} seed {seed}: {runs[-1].final_bpb:.4f} bits/byte after {runs[-1].startup_seconds:.0f} + "
                f"{runs[-1].train_seconds:.0f} s, {runs[-1].max_iters} steps; {_load()}",
                flush=True,
            )
    return runs


def calibrated_steps(table: dict[str, list[str]], budget_s: float, scratch: Path) -> dict[str, int]:
    """Each arm's steps for budget_s training seconds. Arms calibrate in turn, CALIBRATION_ROUNDS times,
    each keeping its fastest: a burst of another job's load during one calibration hands no arm fewer steps."""
    per_step: dict[str, list[float]] = {arm: [] for arm in table}
    for round_ in range(CALIBRATION_ROUNDS):
        for arm, overrides in table.items():
            per_step[arm].append(seconds_per_step(overrides, scratch / _slug(arm, f"calibration{round_}")))
    steps = {arm: max(CALIBRATION_STEPS, round(budget_s / min(per_step[arm]))) for arm in table}
    for arm, n in steps.items():
        print(f"calibrated {arm}: {n} steps in {budget_s:.0f} s", flush=True)
    return steps


def configured_steps(table: dict[str, list[str]]) -> dict[str, int]:
    """Each arm's own max_iters, as train.py composes it from the arm's overrides (--speedrun)."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return {arm: compose(config_name="train", overrides=overrides).max_iters for arm, overrides in table.items()}


def _load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


def _slug(arm: str, suffix: object) -> str:
    return re.sub(r"[^\w-]+", "_", f"{arm.replace(' - ', '_minus_').replace(' + ', '_plus_')}_{suffix}")


def parse_args() -> argparse.Namespace:
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
    parser.add_argument(
        "--speedrun",
        action="store_true",
        help="instead: today's default (pinned), the default, and today's with each speedrun piece, each its own steps",
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
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.from_json:
        record = json.loads(args.from_json.read_text())
        runs = [Run(**r) for r in record["runs"]]
    else:
        record = {
            **provenance(),
            "corpus": args.corpus,
            "budget_s": None if args.speedrun else args.budget_s,
            "seeds": args.seeds,
            "arms": chosen_arms(args),
            "load_before": _load(),
            **({"target_arm": "today", "baseline_arm": "today"} if args.speedrun else {}),
        }
        print(f"{record['machine']}, torch {record['torch']}, gptlab {record['gptlab']}, {_load()}", flush=True)
        with tempfile.TemporaryDirectory(prefix="time_to_loss_") as scratch:
            runs = measure(args, Path(scratch))
        record["load_after"] = _load()
    rows = summarise(runs, record.get("target_arm", "gpt2"), record.get("baseline_arm", "modern"))
    if not args.from_json:
        out = args.json or ROOT / "bench" / "results" / f"time_to_loss_{args.corpus}.json"
        out.write_text(json.dumps({**record, "rows": rows, "runs": [asdict(r) for r in runs]}, indent=2) + "\n")
        print(f"wrote {out}")
    print(markdown(rows))
    if args.plot:
        budget = "each arm its own steps" if record["budget_s"] is None else f"{record['budget_s']:g} s per run"
        title = f"{record['corpus']}, {budget}, seeds {', '.join(map(str, record['seeds']))}"
        plot(runs, rows[0]["target_bpb"], title, args.plot)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
