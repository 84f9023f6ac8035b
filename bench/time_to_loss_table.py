"""bench/time_to_loss.py's results: the runs it records, where each reaches the target, the table and the plot.

A run's seconds are what its user waits for up to a point of its curve: its start-up (from the
child's launch to the end of its first evaluation, compiling included) plus its training seconds
(evaluations and saves after the first left out, as their number is the benchmark's choice).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from ablation.stats import mean_ci, paired_difference


@dataclass
class Run:
    arm: str
    seed: int
    max_iters: int
    train_seconds: float = 0.0
    tokens: int = 0
    final_bpb: float = float("nan")
    curve: list[tuple[float, int, float]] = field(default_factory=list)  # (train seconds, tokens, val bpb)
    startup_seconds: float = 0.0  # launch to the end of the step-0 evaluation (0 in results from before it was read)

    @property
    def seconds(self) -> float:
        return self.startup_seconds + self.train_seconds


def reach(run: Run, target: float) -> tuple[float, float] | None:
    """Seconds (start-up included) and tokens at which the run's val curve first reaches target
    (linear between evaluations)."""
    if run.curve and run.curve[0][2] <= target:  # below it before training: a smaller vocabulary's start
        return run.startup_seconds + run.curve[0][0], run.curve[0][1]
    for (s0, t0, b0), (s1, t1, b1) in zip(run.curve, run.curve[1:]):
        if b1 <= target:
            share = 1.0 if b0 == b1 else (b0 - target) / (b0 - b1)
            return run.startup_seconds + s0 + share * (s1 - s0), t0 + share * (t1 - t0)
    return None


def summarise(runs: list[Run], target_arm: str = "gpt2", baseline_arm: str = "modern") -> list[dict]:
    """One row per arm: its seconds and final bpb, the time and tokens to reach target_arm's mean final
    bpb (and, paired by seed, that time's share of target_arm's whole run), and the difference of the
    final bpb to baseline_arm's, paired by seed (negative: the arm ends lower)."""
    by_arm: dict[str, list[Run]] = {}
    for run in runs:
        by_arm.setdefault(run.arm, []).append(run)
    target = mean_ci([r.final_bpb for r in by_arm[target_arm]]).mean if target_arm in by_arm else None
    baseline = {r.seed: r.final_bpb for r in by_arm.get(baseline_arm, [])}
    whole = {r.seed: r.seconds for r in by_arm.get(target_arm, [])}
    rows = []
    for arm, arm_runs in by_arm.items():
        reached = [] if target is None else [(r.seed, reach(r, target)) for r in arm_runs]
        hit = [(seed, x) for seed, x in reached if x is not None]
        shares = [s / whole[seed] for seed, (s, _) in hit if seed in whole]
        pairs = [(baseline[r.seed], r.final_bpb) for r in arm_runs if r.seed in baseline]
        rows.append(
            {
                "arm": arm,
                "seeds": [r.seed for r in arm_runs],
                "steps": arm_runs[0].max_iters,
                "startup_seconds": mean_ci([r.startup_seconds for r in arm_runs]).__dict__,
                "train_seconds": mean_ci([r.train_seconds for r in arm_runs]).__dict__,
                "final_bpb": mean_ci([r.final_bpb for r in arm_runs]).__dict__,
                "baseline": baseline_arm,
                "vs_baseline": None if arm == baseline_arm or not pairs else asdict(paired_difference(*zip(*pairs))),
                "reached": f"{len(hit)}/{len(reached)}" if reached else None,
                "target_arm": target_arm,
                "target_bpb": target,
                "seconds_to_target": mean_ci([s for _, (s, _) in hit]).__dict__ if hit else None,
                "share_of_target_arm": mean_ci(shares).__dict__ if shares else None,
                "tokens_to_target": mean_ci([t for _, (_, t) in hit]).__dict__ if hit else None,
            }
        )
    return rows


def markdown(rows: list[dict]) -> str:
    target_arm, baseline = (rows[0]["target_arm"], rows[0]["baseline"]) if rows else ("", "")
    lines = [
        f"| arm | steps | s: start-up + train | final val bits/byte | vs {baseline} | reached target | s to target "
        f"(share of {target_arm}'s, paired) | tokens to target |",
        "|---|--:|--:|---|---|--:|---|--:|",
    ]
    return "\n".join(lines + [_row(r) for r in rows])


def _row(r: dict) -> str:
    to, vs, tokens, share = r["seconds_to_target"], r["vs_baseline"], r["tokens_to_target"], r["share_of_target_arm"]
    vs_text = "" if vs is None else _diff(vs["difference"])
    share_text = "" if share is None else f" ({_ci(share, 2)})"
    to_text = "" if to is None else f"{_ci(to, 0)}{share_text}"
    tokens_text = "" if tokens is None else f"{round(tokens['mean']):,}"
    seconds = f"{r['startup_seconds']['mean']:.0f} + {r['train_seconds']['mean']:.0f}"
    return (
        f"| {r['arm']} | {r['steps']:,} | {seconds} | {_ci(r['final_bpb'])} | "
        f"{vs_text} | {r['reached'] or ''} | {to_text} | {tokens_text} |"
    )


def _ci(e: dict, digits: int = 4) -> str:
    spread = "" if e["n"] < 2 else f" ± {(e['high'] - e['low']) / 2:.{digits}f}"
    return f"{e['mean']:.{digits}f}{spread}"


def _diff(e: dict) -> str:
    if e["n"] < 2:
        return f"{e['mean']:+.4f}"
    return f"{e['mean']:+.4f} ({e['low']:+.4f}..{e['high']:+.4f})"


def plot(runs: list[Run], target: float | None, title: str, path: Path) -> None:
    """Val bits per byte against seconds (start-up included), one line per run, one colour per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.2))
    colours = {}
    for run in runs:
        colour = colours.setdefault(run.arm, f"C{len(colours)}")
        seconds, _, bpb = zip(*run.curve)
        label = run.arm if run.arm not in axes.get_legend_handles_labels()[1] else None
        axes.plot([run.startup_seconds + s for s in seconds], bpb, color=colour, alpha=0.8, label=label)
    if target is not None:
        axes.axhline(target, color="grey", linestyle="--", linewidth=1, label="the target (mean final)")
    axes.set(xlabel="seconds: start-up + training", ylabel="val bits per byte", title=title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
