"""Compare the runs of an attention ablation: report.md plus PNG plots.

    python train.py -m experiment=attention_ablation
    python report.py runs/attention_ablation_<date>_<time>            # writes report.md there

Every number comes from the runs' own files (metrics.jsonl, checkpoints) or is
measured now (decode speed); none is typed in. Each run directory below SWEEP_DIR
that holds a checkpoint is one variant.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from data import load_tokenizer  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from model.generate import generate  # noqa: E402
from model.kv_cache import KVCache  # noqa: E402
from model.sampling import Sampling  # noqa: E402
from training.checkpoint import Checkpoint, CheckpointError, find_checkpoint, load_checkpoint, load_weights  # noqa: E402
from training.logger import read_metrics  # noqa: E402

DECODE_BATCHES = (1, 8)
HEATMAP_HEADS = 4


@dataclass
class Variant:
    name: str  # the run directory's name, e.g. kv1
    run_dir: Path
    checkpoint: Checkpoint
    metrics: list[dict]

    @property
    def config(self) -> GPTConfig:
        return self.checkpoint.model_config

    @property
    def label(self) -> str:
        return f"{self.config.attention_kind} ({self.config.n_kv_head} kv heads)"

    def records(self, kind: str) -> list[dict]:
        return [r for r in self.metrics if r["kind"] == kind]

    def model(self) -> GPT:
        model = GPT(self.config)
        load_weights(model, self.checkpoint.model_state)
        return model.eval()


def find_variants(sweep_dir: Path) -> list[Variant]:
    variants = []
    for run_dir in sorted(p for p in sweep_dir.iterdir() if (p / "checkpoints" / "latest").exists()):
        checkpoint = load_checkpoint(find_checkpoint(run_dir, sweep_dir))
        variants.append(Variant(run_dir.name, run_dir, checkpoint, read_metrics(run_dir)))
    if not variants:
        raise CheckpointError(f"no run directories with checkpoints under {sweep_dir}")
    # MHA first, then fewer and fewer key/value heads.
    return sorted(variants, key=lambda v: -v.config.n_kv_head)


def decode_tokens_per_second(model: GPT, batch: int, new_tokens: int, prompt_length: int = 8, repeats: int = 3) -> float:
    """Generated tokens per second of greedy generation from random prompts (prefill
    included); the best of a few repeats, so a busy moment does not decide it."""
    prompts = torch.randint(0, model.config.vocab_size, (batch, prompt_length)).tolist()
    generate(model, prompts, 8, Sampling(temperature=0))  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        generate(model, prompts, new_tokens, Sampling(temperature=0))
        best = min(best, time.perf_counter() - start)
    return batch * new_tokens / best


def summarize(variant: Variant, new_tokens: int) -> dict:
    final = variant.records("eval")[-1]
    train = variant.records("train")
    model = variant.model()
    with torch.device("meta"):
        cache = KVCache(variant.config, batch_size=1)
    return {
        "variant": variant.label,
        "run": variant.name,
        "params": model.num_params(),
        "train_loss": final["train_loss"],
        "val_loss": final["val_loss"],
        "val_ppl": final["val_ppl"],
        "train_tok_s": statistics.median(r["tok_per_s"] for r in train),
        **{f"decode_tok_s_b{b}": decode_tokens_per_second(model, b, new_tokens) for b in DECODE_BATCHES},
        "kv_cache_mb": cache.megabytes,
        "train_minutes": (variant.metrics[-1]["time"] - variant.metrics[0]["time"]) / 60,
    }


def plot_val_loss(variants: list[Variant], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for v in variants:
        evals = v.records("eval")
        ax.plot([r["tokens"] for r in evals], [r["val_loss"] for r in evals], marker="o", markersize=3, label=v.label)
    ax.set_xlabel("training tokens seen")
    ax.set_ylabel("validation loss")
    ax.set_title("Validation loss: MHA vs GQA vs MQA")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_attention(variants: list[Variant], prompt: str, path: Path) -> None:
    """Last-layer attention of the first few heads, one row per variant, for one prompt."""
    tokenizer = load_tokenizer(variants[0].checkpoint.config["tokenizer"])
    ids = tokenizer.encode(prompt)[: variants[0].config.block_size]
    fig, axes = plt.subplots(len(variants), HEATMAP_HEADS, figsize=(3 * HEATMAP_HEADS, 3 * len(variants)), squeeze=False)
    for row, variant in zip(axes, variants):
        weights = variant.model().attention_maps(torch.tensor([ids]))[-1][0]  # (n_head, T, T)
        for head, ax in enumerate(row):
            ax.imshow(weights[head].numpy(), cmap="viridis", vmin=0, vmax=1)
            ax.set_title(f"{variant.label}\nhead {head}", fontsize=8)
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle(f"Last-layer attention weights (query rows, key columns) for {prompt!r}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def markdown_table(rows: list[dict]) -> str:
    header = ("variant | params | train loss | val loss | val ppl | train tok/s | decode tok/s (b=1) | "
              "decode tok/s (b=8) | KV cache MB (full context) | train minutes")
    lines = ["| " + header + " |", "|" + "---|" * len(header.split("|"))]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['params']:,} | {r['train_loss']:.4f} | {r['val_loss']:.4f} | {r['val_ppl']:.2f} | "
            f"{r['train_tok_s']:,.0f} | {r['decode_tok_s_b1']:,.0f} | {r['decode_tok_s_b8']:,.0f} | "
            f"{r['kv_cache_mb']:.3f} | {r['train_minutes']:.1f} |"
        )
    return "\n".join(lines)


def write_report(sweep_dir: Path, out_dir: Path, new_tokens: int, prompt: str) -> Path:
    variants = find_variants(sweep_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = [summarize(v, new_tokens) for v in variants]
    plot_val_loss(variants, out_dir / "val_loss.png")
    plot_attention(variants, prompt, out_dir / "attention.png")
    tokens = variants[0].records("eval")[-1]["tokens"]
    text = f"""# Attention ablation: {sweep_dir.name}

{len(variants)} variants of one model ({variants[0].config.n_layer} layers, {variants[0].config.n_head} query heads,
{variants[0].config.n_embd} dims, context {variants[0].config.block_size}), trained on the same data in the same
order for {tokens:,} tokens with the same seed and schedule; they differ only in the number of
key/value heads{" (MLPs widened to match MHA's parameter count)" if variants[-1].config.match_mha_params else ""}.

{markdown_table(rows)}

- Losses are the last evaluation's (mean over its fixed batches); perplexity is exp(val loss).
- Train tok/s is the median of the logged training throughput; train minutes span the run's
  first to last record (evaluations included).
- Decode tok/s is measured now, on {torch.get_num_threads()} CPU thread(s) (or the present device):
  greedy generation of {new_tokens} tokens after an 8-token random prompt, KV-cached, prefill included,
  best of 3.
- KV cache MB: keys and values of every layer for one sequence of {variants[0].config.block_size} tokens in fp32.

![validation loss](val_loss.png)

![attention](attention.png)
"""
    path = out_dir / "report.md"
    path.write_text(text)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python report.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", type=Path, help="the directory holding one run directory per variant")
    parser.add_argument("--out", type=Path, help="where report.md and the plots go (default: sweep_dir)")
    parser.add_argument("--decode-tokens", type=int, default=64, help="tokens generated per decode measurement")
    parser.add_argument("--prompt", default="def __init__(self, name):\n    self.name = name\n",
                        help="text whose attention the heatmaps show")
    args = parser.parse_args(argv)
    if not args.sweep_dir.is_dir():
        sys.exit(f"error: {args.sweep_dir} is not a directory")
    try:
        path = write_report(args.sweep_dir, args.out or args.sweep_dir, args.decode_tokens, args.prompt)
    except (CheckpointError, ValueError) as err:  # ValueError: a malformed metrics.jsonl, named
        sys.exit(f"error: {err}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
