"""Export a checkpoint as a Hugging Face transformers directory.

    python export.py runs/2025-01-01_12-00-00 hf/my-model   # a run: its latest checkpoint
    python export.py runs/.../checkpoints/best hf/my-model  # one checkpoint

In GPT-2's block MHA models become GPT2LMHeadModel and MQA models GPTBigCodeForCausalLM; in the Llama block every
layout, GQA included, becomes LlamaForCausalLM, and in nanochat's NanoChatForCausalLM (transformers >= 5.0). With a
gpt2 or trained bpe tokenizer's files, `AutoModelForCausalLM` and `AutoTokenizer` load the directory.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from system import quiet_interrupt_while_starting

if __name__ == "__main__":  # before the imports below: torch alone takes seconds
    quiet_interrupt_while_starting()

from hf.files import save_hf
from run.checkpoints import find_checkpoint, load_checkpoint
from system import exits


def export_checkpoint(checkpoint: str | Path, out_dir: str | Path) -> list[str]:
    """Write the checkpoint directory as a transformers directory out_dir (new or empty), the weights as saved (no
    model is built); returns one line per thing written. A checkpoint that names no tokenizer exports weights only."""
    loaded = load_checkpoint(checkpoint)
    loaded.check_finite()
    tokenizer = loaded.tokenizer() if loaded.config.get("tokenizer") else None
    return save_hf(out_dir, loaded.model_config, loaded.model_state, tokenizer)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="a checkpoint directory, or a run directory (its latest checkpoint)")
    parser.add_argument("out_dir", help="where to write the transformers model: a new or empty directory")
    args = parser.parse_args(argv)
    with exits(writing=args.out_dir):
        checkpoint = find_checkpoint(args.checkpoint, runs_root="runs")
        for line in export_checkpoint(checkpoint, args.out_dir):
            print(line)


if __name__ == "__main__":
    main()
