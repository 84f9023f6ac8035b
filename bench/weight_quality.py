"""What the bf16 and int8 weight formats cost in quality, on a trained checkpoint.

    python bench/weight_quality.py                              # the newest run's latest checkpoint
    python bench/weight_quality.py --checkpoint runs/<run> --json quality.json

How it is measured, for each weight format against fp32 (the checkpoint as trained),
all computing in fp32 on the CPU:
- validation loss: the mean cross-entropy over the same --eval-iters batches of the
  run's val.bin (its data directory must still be there), and its change against fp32;
- greedy agreement: from --prompts prompts (the first --prompt-tokens of val windows),
  fp32 generates --tokens tokens greedily. "free-running" is the share of positions
  where the format's own greedy generation has the same token (after a first
  difference the two texts usually part, so this also reports the first difference);
  "teacher-forced" is the share of fp32's generated positions where the format's most
  likely next token, given fp32's text so far, is fp32's token.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout

from data import BatchLoader, DataConfig, DataError  # noqa: E402
from model import GPT, WEIGHT_FORMATS, Sampling, generate  # noqa: E402
from run.checkpoints import Checkpoint, CheckpointError, find_checkpoint, load_checkpoint  # noqa: E402
from run.load import load_model  # noqa: E402
from training.provenance import provenance  # noqa: E402

GREEDY = Sampling(temperature=0)
SEED = 1234  # which validation windows


@torch.inference_mode()
def validation_loss(model: GPT, loader: BatchLoader, batches: int) -> float:
    return sum(model(*loader.get_batch(i))[1].item() for i in range(batches)) / batches


@torch.inference_mode()
def next_token_agreement(model: GPT, prompts: list[list[int]], continuations: list[list[int]]) -> float:
    """Share of the continuations' tokens that are the model's most likely next token
    given what precedes them (the last block_size tokens, as generation sees them)."""
    agree = total = 0
    block_size = model.config.block_size
    for prompt, continuation in zip(prompts, continuations):
        text = prompt + continuation
        for end in range(len(prompt), len(text)):
            logits, _ = model(torch.tensor([text[max(0, end - block_size) : end]]), last_only=True)
            agree += int(logits[0, -1].argmax()) == text[end]
        total += len(continuation)
    return agree / total


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def measure(checkpoint: Checkpoint, loader: BatchLoader, args: argparse.Namespace) -> list[dict]:
    prompts = loader.get_batch(0)[0][: args.prompts, : args.prompt_tokens].tolist()
    rows, reference = [], None
    for weights in WEIGHT_FORMATS:
        model = load_model(checkpoint, None, torch.device("cpu"), torch.float32, weights=weights)[0]
        loss = validation_loss(model, loader, args.eval_iters)
        texts = generate(model, prompts, args.tokens, GREEDY)
        if reference is None:
            reference = {"loss": loss, "texts": texts}
        same = sum(x == y for text, ref in zip(texts, reference["texts"]) for x, y in zip(text, ref))
        firsts = [first_difference(text, ref) for text, ref in zip(texts, reference["texts"])]
        rows.append(
            {
                "weights": weights,
                "val_loss": loss,
                "val_loss_change": loss - reference["loss"],
                "free_running_agreement": same / sum(len(ref) for ref in reference["texts"]),
                "first_difference": [f if f is not None else "none" for f in firsts],
                "teacher_forced_agreement": next_token_agreement(model, prompts, reference["texts"]),
            }
        )
        print(format_row(rows[-1]), flush=True)
    return rows


def format_row(r: dict) -> str:
    return (
        f"{r['weights']:<8}{r['val_loss']:>10.5f}{r['val_loss_change']:>+10.5f}"
        f"{100 * r['teacher_forced_agreement']:>14.1f}%{100 * r['free_running_agreement']:>13.1f}%"
        f"   {', '.join(map(str, r['first_difference']))}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", help="a checkpoint or run directory (default: the newest run's latest)")
    parser.add_argument("--runs-root", default="runs", help="where the newest run is looked for")
    parser.add_argument("--eval-iters", type=int, default=50, help="validation batches")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=300, help="greedy tokens per prompt")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    try:
        checkpoint = load_checkpoint(find_checkpoint(args.checkpoint, args.runs_root))
        data_dir = DataConfig(**checkpoint.config["data"]).resolved_data_dir()
        loader = BatchLoader(data_dir, "val", checkpoint.model_config.block_size, args.batch_size, SEED)
    except (CheckpointError, DataError) as err:
        sys.exit(f"error: {err}")
    print(
        f"{checkpoint.path}: {GPT.shapes_only(checkpoint.model_config).num_params():,} parameters; "
        f"validation: {args.eval_iters} batches of {args.batch_size} x {loader.block_size} tokens from {data_dir}; "
        f"greedy: {args.prompts} prompts of {args.prompt_tokens} tokens, {args.tokens} tokens each"
    )
    print(
        f"{'weights':<8}{'val loss':>10}{'change':>10}{'teacher-forced':>15}{'free-running':>14}"
        "   first difference per prompt"
    )
    rows = measure(checkpoint, loader, args)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "provenance": provenance(),
                    "checkpoint": str(checkpoint.path),
                    "settings": vars(args) | {"json": str(args.json)},
                    "rows": rows,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
