"""The docs' pictures, drawn from the committed results in bench/results/ (no measuring).

    python bench/figures.py                 # rewrites the four PNGs in docs/images/
    python bench/figures.py --out /tmp/fig  # somewhere else

- default_run_loss.png: the default run's train and val loss in bits per byte against step,
  under the modern recipe and under GPT-2's (bench/results/default_run/*_metrics.jsonl);
- decode_speed.png: batch-1 decode tokens/s by weight format, and tokens/s by attention
  layout (bench/results/decode_weights_cpu*.json, decode_fp32_cpu.json);
- kv_heads.png: how MHA, GQA and MQA give query heads their key/value heads, with each
  layout's KV cache at GPT-2 small's shape (computed, not measured);
- train_throughput.png: training tokens/s against the reference GPT-2
  (bench/results/train_throughput_cpu.json).

Each picture's footer names its results file and what that file records of the machine,
torch and gptlab commit it was measured on.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # runnable from a checkout: the model's own KV-cache arithmetic

import torch  # noqa: E402

from ablation.decode import GPT2_SMALL, kv_cache_bytes  # noqa: E402
from model import GPTConfig  # noqa: E402

RESULTS = ROOT / "bench" / "results"
IMAGES = ROOT / "docs" / "images"
COLOURS = plt.get_cmap("tab10").colors
FORMATS = ("fp32", "bf16", "int8")
LAYOUTS = ("MHA", "GQA", "MQA")
RUNS = {"modern recipe, own 4,096-id BPE": "modern", "GPT-2 recipe and tokens": "gpt2"}
KV_CACHE_CONTEXT = 1024
KV_HEADS = {"MHA": 12, "GQA": 4, "MQA": 1}  # at GPT-2 small's 12 query heads; GQA as in the decode table


def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def source_line(name: str, result: dict) -> str:
    """What a results file records of where it was measured, for a figure's footer."""
    if "provenance" in result:
        p = result["provenance"]
        return f"{name}: {p['machine']}, torch {p['torch']}, gptlab {p['gptlab']}, {p['date'][:10]}"
    return f"{name}: {result['device']}, torch {result['torch']} (gptlab commit not recorded)"


def _finish(fig, path: Path, footer: str) -> None:
    """Save with the footer (one line per source) under the axes."""
    fig.text(0.01, 0.005, footer, fontsize=7, color="dimgray", va="bottom")
    lines = footer.count("\n") + 1
    fig.tight_layout(rect=(0, 0.012 + 0.025 * lines, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- the default run's loss curve ----------------------------------------------------------


def loss_curves(records: list[dict]) -> dict[str, tuple[list[int], list[float]]]:
    """Bits per byte against step: 'train' (every logged step), 'train eval' and 'val' (the
    evaluations). A logged step's loss is in nats per token; it is converted at the bytes
    per token of the train split's evaluation windows (train_bpb / train_loss of an eval)."""
    evals = [r for r in records if r["kind"] == "eval"]
    per_nat = evals[-1]["train_bpb"] / evals[-1]["train_loss"]
    steps = [r for r in records if r["kind"] == "train"]
    return {
        "train": ([r["step"] for r in steps], [r["loss"] * per_nat for r in steps]),
        "train eval": ([r["step"] for r in evals], [r["train_bpb"] for r in evals]),
        "val": ([r["step"] for r in evals], [r["val_bpb"] for r in evals]),
    }


def plot_default_run(path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for colour, (label, stem) in zip(COLOURS, RUNS.items()):
        lines = (RESULTS / "default_run" / f"{stem}_metrics.jsonl").read_text().splitlines()
        curves = loss_curves([json.loads(line) for line in lines])
        ax.plot(*curves["train"], color=colour, alpha=0.45, linewidth=1, label=f"{label}: train (logged steps)")
        ax.plot(*curves["val"], color=colour, marker="o", linewidth=2, label=f"{label}: val")
        ax.plot(*curves["train eval"], color=colour, marker="x", linestyle="none", label=f"{label}: train (eval)")
    ax.set(
        xlabel="step (8 x 128 tokens)",
        ylabel="loss (bits per byte)",
        title="The default run, python train.py: mini model, stdlib corpus (modern: 500 steps, bf16)",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _finish(
        fig,
        path,
        "bench/results/default_run/{modern,gpt2}_metrics.jsonl: 2-core AMD EPYC, 1 thread, "
        "Python 3.11.7, torch 2.13.0+cpu, gptlab 417d834 (modern), 24b3d15 (gpt2)",
    )


# --- decode speed ---------------------------------------------------------------------------


def decode_by_format(result: dict) -> dict[int, dict[str, float]]:
    """MHA's batch-1 tokens/s per context, then per weight format."""
    table: dict[int, dict[str, float]] = {}
    for row in result["rows"]:
        if row["batch"] == 1 and row["variant"] == "MHA":
            table.setdefault(row["context"], {})[row["weights"]] = row["tokens_per_s"]
    return table


def decode_by_layout(result: dict) -> dict[tuple[int, int], dict[str, float]]:
    """Tokens/s per (batch, context), then per attention layout."""
    table: dict[tuple[int, int], dict[str, float]] = {}
    for row in result["rows"]:
        table.setdefault((row["batch"], row["context"]), {})[row["variant"]] = row["tokens_per_s"]
    return table


def _bars(ax, groups: dict[str, dict[str, float]], keys: tuple[str, ...]) -> None:
    """Grouped bars, one group per label, one bar per key, each with its value above it."""
    width = 0.8 / len(keys)
    for i, (colour, key) in enumerate(zip(COLOURS, keys)):
        xs = [g + (i - (len(keys) - 1) / 2) * width for g in range(len(groups))]
        heights = [values[key] for values in groups.values()]
        bars = ax.bar(xs, heights, width, color=colour, label=key)
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_xticks(range(len(groups)), list(groups), fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)


def plot_decode(path: Path) -> None:
    files = {"2 threads": "decode_weights_cpu.json", "1 thread": "decode_weights_cpu_1thread.json"}
    formats = {
        f"{threads}\ncontext {context}": speeds
        for threads, name in files.items()
        for context, speeds in decode_by_format(load(name)).items()
    }
    layouts = {
        f"batch {b}\ncontext {c}": speeds for (b, c), speeds in decode_by_layout(load("decode_fp32_cpu.json")).items()
    }
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    _bars(left, formats, FORMATS)
    left.set(ylabel="decode tokens/s", title="by weight format: MHA, batch 1")
    _bars(right, layouts, LAYOUTS)
    right.set(ylabel="decode tokens/s (all rows)", title="by attention layout: fp32 weights, 1 thread")
    fig.suptitle("gpt2 preset (124M), KV-cached greedy decoding on a CPU (python bench/decode.py)")
    _finish(fig, path, "\n".join(source_line(n, load(n)) for n in [*files.values(), "decode_fp32_cpu.json"]))


# --- MHA, GQA and MQA -----------------------------------------------------------------------


def kv_head_of_query(n_head: int, n_kv_head: int) -> list[int]:
    """The key/value head each query head reads, as the model repeats them (repeat_interleave)."""
    return torch.arange(n_kv_head).repeat_interleave(n_head // n_kv_head).tolist()


def kv_cache_mib(n_kv_head: int) -> float:
    """The KV cache of GPT-2 small with n_kv_head key/value heads: 1024 positions, bf16, batch 1."""
    config = GPTConfig(**GPT2_SMALL, n_kv_head=n_kv_head)
    return kv_cache_bytes(config, KV_CACHE_CONTEXT, bytes_per_value=2) / 2**20


def _layout_row(ax, y: float, n_head: int, n_kv_head: int, colour) -> None:
    """Query heads as boxes on top, key/value heads below, a line from each query head to its."""
    kv_width = n_head / n_kv_head
    for h, kv in enumerate(kv_head_of_query(n_head, n_kv_head)):
        ax.add_patch(plt.Rectangle((h + 0.1, y + 1.2), 0.8, 0.6, facecolor="white", edgecolor=colour))
        ax.text(h + 0.5, y + 1.5, f"q{h}", ha="center", va="center", fontsize=7)
        ax.plot([h + 0.5, (kv + 0.5) * kv_width], [y + 1.2, y + 0.6], color=colour, linewidth=0.8)
    for kv in range(n_kv_head):
        ax.add_patch(
            plt.Rectangle((kv * kv_width + 0.1, y), kv_width - 0.2, 0.6, facecolor=colour, alpha=0.35, edgecolor=colour)
        )
        ax.text((kv + 0.5) * kv_width, y + 0.3, f"k{kv} v{kv}", ha="center", va="center", fontsize=7)


def plot_kv_heads(path: Path) -> None:
    fig, ax = plt.subplots(figsize=(9, 6))
    n_head = GPT2_SMALL["n_head"]
    for row, (colour, (name, n_kv_head)) in enumerate(zip(COLOURS, KV_HEADS.items())):
        y = 2.6 * (len(KV_HEADS) - 1 - row)
        _layout_row(ax, y, n_head, n_kv_head, colour)
        ax.text(-0.3, y + 0.9, f"{name}\nn_kv_head={n_kv_head}", ha="right", va="center", fontsize=10, color=colour)
        ax.text(
            n_head + 0.3, y + 0.9, f"KV cache\n{kv_cache_mib(n_kv_head):g} MiB", ha="left", va="center", fontsize=10
        )
    ax.set_xlim(-3, n_head + 3)
    ax.set_ylim(-0.3, 2.6 * len(KV_HEADS))
    ax.axis("off")
    ax.set_title(
        f"Query heads (top of each row) and the key/value heads they read (below), GPT-2 small:\n"
        f"{GPT2_SMALL['n_layer']} layers, {n_head} heads of {GPT2_SMALL['n_embd'] // n_head}, "
        f"KV cache at {KV_CACHE_CONTEXT} positions, bf16, batch 1",
        fontsize=10,
    )
    _finish(
        fig,
        path,
        "computed by model code (ablation.decode.kv_cache_bytes; the query-to-KV mapping is "
        "model.attention's repeat_interleave), not measured",
    )


# --- training throughput --------------------------------------------------------------------


def throughput_over_reference(result: dict) -> dict[str, dict[str, tuple[float, float]]]:
    """Per 'preset precision': per variant, (tokens/s over the reference's eager tokens/s, tokens/s)."""
    table: dict[str, dict[str, tuple[float, float]]] = {}
    for row in result["rows"]:
        table.setdefault(f"{row['preset']} {row['precision']}", {})[row["variant"]] = (
            row["over_reference_eager"],
            row["tokens_per_s"],
        )
    return table


def plot_throughput(path: Path) -> None:
    result = load("train_throughput_cpu.json")
    table = throughput_over_reference(result)
    variants = ("reference-eager", "gptlab-eager", "gptlab-compiled")
    fig, ax = plt.subplots(figsize=(9, 4.6))
    width = 0.8 / len(variants)
    for i, (colour, variant) in enumerate(zip(COLOURS, variants)):
        xs = [g + (i - 1) * width for g in range(len(table))]
        bars = ax.bar(xs, [cells[variant][0] for cells in table.values()], width, color=colour, label=variant)
        ax.bar_label(bars, [f"{cells[variant][1]:,.0f}" for cells in table.values()], fontsize=7)
    ax.axhline(1, color="black", linewidth=0.8)
    ax.set_xticks(range(len(table)), list(table))
    ax.set(
        ylabel="tokens/s over the reference's eager",
        ylim=(0, 1.25 * max(v[0] for c in table.values() for v in c.values())),
        title="Training step tokens/s against a minimal GPT-2 (labels: tokens/s; python bench/train_throughput.py)",
    )
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8, loc="upper left")
    _finish(fig, path, source_line("train_throughput_cpu.json", result))


FIGURES = {
    "default_run_loss.png": plot_default_run,
    "decode_speed.png": plot_decode,
    "kv_heads.png": plot_kv_heads,
    "train_throughput.png": plot_throughput,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=IMAGES, help="where the PNGs go (default: docs/images)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, draw in FIGURES.items():
        draw(args.out / name)
        print(f"wrote {args.out / name}")


if __name__ == "__main__":
    main()
