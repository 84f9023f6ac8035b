"""The report's loss plots: curves with bands over seeds, differences to the baseline,
the gaps along a size ladder, uptraining, and the quality/speed frontier."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from ablation.compare import Gap, Uptraining  # noqa: E402
from ablation.runs import Arm  # noqa: E402
from ablation.stats import Estimate, mean_ci, paired_difference  # noqa: E402

ZOOM_FROM = 0.6  # the zoomed panels show the last 40% of training, where the arms separate
COLOURS = plt.get_cmap("tab10").colors
LOSS = "validation loss (nats/token)"


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def curve(arm: Arm, metric: str = "val_loss") -> tuple[list[int], list[Estimate]]:
    """Total tokens (pretraining included) and the estimate over seeds at every
    evaluation all of the arm's runs share."""
    by_tokens: dict[int, list[float]] = {}
    for run in arm.runs:
        for record in run.evals:
            by_tokens.setdefault(record["tokens"] + arm.pretraining_tokens, []).append(record[metric])
    tokens = sorted(t for t, values in by_tokens.items() if len(values) == len(arm.runs))
    return tokens, [mean_ci(by_tokens[t]) for t in tokens]


def _band(ax, x: list[float], estimates: list[Estimate], colour, label: str) -> None:
    ax.plot(x, [e.mean for e in estimates], color=colour, marker="o", markersize=2.5, label=label)
    if all(e.n > 1 for e in estimates):
        ax.fill_between(x, [e.low for e in estimates], [e.high for e in estimates], color=colour, alpha=0.2, lw=0)


def _zoomed(ax, arms: list[Arm], x_of) -> None:
    end = max(curve(a)[0][-1] for a in arms)
    lows, highs = [], []
    for colour, arm in zip(COLOURS, arms):
        tokens, estimates = curve(arm)
        keep = [i for i, t in enumerate(tokens) if t >= ZOOM_FROM * end]
        shown = [estimates[i] for i in keep]
        _band(ax, [x_of(arm, tokens[i]) for i in keep], shown, colour, arm.label)
        lows += [e.low if e.n > 1 else e.mean for e in shown]
        highs += [e.high if e.n > 1 else e.mean for e in shown]
    if lows:
        margin = 0.05 * (max(highs) - min(lows) or 1e-3)
        ax.set_ylim(min(lows) - margin, max(highs) + margin)


def plot_curves(arms: list[Arm], baseline: Arm, path: Path, title: str) -> None:
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    (full, zoom), (flops, diff) = axes
    for colour, arm in zip(COLOURS, arms):
        tokens, estimates = curve(arm)
        _band(full, tokens, estimates, colour, arm.label)
    full.set(xlabel="training tokens", ylabel=LOSS, title="all of training, mean over seeds")
    _zoomed(zoom, arms, lambda arm, t: t)
    zoom.set(
        xlabel="training tokens", ylabel=LOSS, title=f"last {1 - ZOOM_FROM:.0%} of training, 95% CI band over seeds"
    )
    _zoomed(flops, arms, lambda arm, t: t * arm.flops_per_token)
    xlabel = "training FLOPs (tokens x the arm's FLOPs per token)"
    flops.set(xlabel=xlabel, ylabel=LOSS, title="the same against training compute")
    _plot_differences(diff, arms, baseline)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    full.legend(fontsize=8)
    fig.suptitle(title)
    _save(fig, path)


def _plot_differences(ax, arms: list[Arm], baseline: Arm) -> None:
    base_tokens, _ = curve(baseline)
    for colour, arm in zip(COLOURS, arms):
        if arm is baseline or arm.seeds != baseline.seeds:
            continue  # differences per seed need the same seeds
        shared = [t for t in curve(arm)[0] if t in base_tokens and t > 0]
        estimates = [paired_difference(baseline.at_tokens(t), arm.at_tokens(t)).difference for t in shared]
        _band(ax, shared, estimates, colour, arm.label)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set(xlabel="training tokens", ylabel=f"validation loss minus {baseline.label}'s (nats)")
    ax.set_title("difference to the baseline, paired by seed, 95% CI band")


def plot_ladder(gaps: list[Gap], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    kinds = sorted({g.kind for g in gaps})
    for i, (colour, kind) in enumerate(zip(COLOURS[1:], kinds)):
        points = sorted((g for g in gaps if g.kind == kind), key=lambda g: g.non_embedding_params)
        dodge = 1 + 0.03 * (i - (len(kinds) - 1) / 2)  # side by side, so overlapping bars stay readable
        x = [g.non_embedding_params * dodge for g in points]
        d = [g.comparison.difference for g in points]
        yerr = [[e.mean - e.low for e in d], [e.high - e.mean for e in d]] if all(e.n > 1 for e in d) else None
        ax.errorbar(x, [e.mean for e in d], yerr=yerr, color=colour, marker="o", capsize=4, label=f"{kind} - MHA")
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set(xlabel="non-embedding parameters of the MHA model", ylabel="final validation loss difference (nats)")
    ax.set_title("Cost of fewer key/value heads against model size (95% CI over seeds)")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    _save(fig, path)


def plot_uptraining(arms: list[Arm], rows: list[Uptraining], path: Path) -> None:
    """Every arm against total training tokens; the uptrained curves start at the MHA
    source's end with the converted model's loss."""
    fig, (full, zoom) = plt.subplots(1, 2, figsize=(13, 4.8))
    start = min((r.arm.pretraining_tokens for r in rows), default=0)
    for colour, arm in zip(COLOURS, arms):
        tokens, estimates = curve(arm)
        _band(full, tokens, estimates, colour, arm.label)
        keep = [i for i, t in enumerate(tokens) if t >= start * 0.9]
        _band(zoom, [tokens[i] for i in keep], [estimates[i] for i in keep], colour, arm.label)
    xlabel = "training tokens in all (the source's included)"
    full.set(xlabel=xlabel, ylabel=LOSS, title="uptrained from MHA vs trained from scratch")
    zoom.set(xlabel="training tokens in all", ylabel=LOSS, title="from the conversion on, 95% CI band over seeds")
    for ax in (full, zoom):
        ax.grid(alpha=0.3)
    zoom.legend(fontsize=8)
    _save(fig, path)


def plot_frontier(panels: list[tuple[str, list[tuple[str, Estimate, float, str]]]], path: Path) -> None:
    """One panel per measurement: (title, [(label, val loss, decode tokens/s, KV-cache text)])."""
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    for ax, (title, points) in zip(axes[0], panels):
        for colour, (label, loss, speed, cache) in zip(COLOURS, points):
            yerr = [[loss.mean - loss.low], [loss.high - loss.mean]] if loss.n > 1 else None
            ax.errorbar([speed], [loss.mean], yerr=yerr, color=colour, marker="o", capsize=4, label=label)
            ax.annotate(cache, (speed, loss.mean), textcoords="offset points", xytext=(6, 6), fontsize=8)
        ax.set(xlabel="decode tokens/s", ylabel="final validation loss (nats/token)", title=title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Quality against decode speed (upper left is worse on both; labels: KV cache per token)")
    _save(fig, path)
