"""The one way every tool that runs a trained model (sample.py, evaluation/, report.py, ablation/, bench/) loads it:

    model, tokenizer, checkpoint = load_model("runs/<run>", "runs", device, torch.float32, weights="int8")

The weight format and decode mode are checked against the device before any weights are read; then a gptlab
checkpoint (safetensors only) or a Hugging Face model (as init_from=hf imports it) is read with its tokenizer.
"""

from dataclasses import asdict
from pathlib import Path

import torch

from data import Tokenizer
from hf.files import hf_tokenizer, load_hf_pretrained, resolve_hf_dir
from model import GPT, WEIGHT_FORMATS, GPTConfig, to_decode_layout, to_weight_format
from run.checkpoints import Checkpoint, CheckpointError, find_checkpoint, load_checkpoint, load_weights
from run.init_from import reading_hf

# A transformers model may pad its embedding beyond its tokenizer for faster matmuls (GPT-2's
# 50,257 ids to 50,304 in gptlab, to a multiple of 64-256 elsewhere); a larger gap is another vocabulary.
HF_VOCAB_PADDING = 256


def load_model(
    target: str | Path | Checkpoint | None,
    runs_root: str | Path | None,
    device: torch.device,
    dtype: torch.dtype,
    *,
    weights: str = "fp32",
    decode: str = "eager",
    hf: bool = False,
) -> tuple[GPT, Tokenizer, Checkpoint]:
    """The model, its tokenizer and its checkpoint. target: a checkpoint or run directory (None: the latest under
    runs_root, read only then), a Checkpoint already read, or with hf=True a transformers directory or Hub name
    (the checkpoint returned then holds the imported weights, its path their directory)."""
    check_inference_settings(device, weights, decode)
    if hf:
        with reading_hf():
            directory = resolve_hf_dir(str(target))
            tokenizer = hf_tokenizer(directory)  # before the weights: a refusal reads no gigabytes
            model_config, state = load_hf_pretrained(directory)
        checkpoint = Checkpoint(path=directory, config={"model": asdict(model_config)}, model_state=state)
        model = inference_model(model_config, state, device, dtype, weights)
    else:
        checkpoint = target if isinstance(target, Checkpoint) else load_checkpoint(find_checkpoint(target, runs_root))
        tokenizer, model = checkpoint.tokenizer(), checkpoint_model(checkpoint, device, dtype, weights)
    if tokenizer.vocab_size > model.config.vocab_size:
        raise CheckpointError(
            f"{checkpoint.path}: its tokenizer has {tokenizer.vocab_size} ids but its model "
            f"only {model.config.vocab_size}: the two do not belong together"
        )
    if hf and model.config.vocab_size - tokenizer.vocab_size >= HF_VOCAB_PADDING:
        raise CheckpointError(
            f"{checkpoint.path}: its model has {model.config.vocab_size} ids but its tokenizer.json "
            f"only {tokenizer.vocab_size}: the model would generate ids the tokenizer cannot read, "
            "so the tokenizer is another model's; put this model's own tokenizer.json beside it"
        )
    return model, tokenizer, checkpoint


def check_inference_settings(device: torch.device, weights: str, decode: str = "eager") -> None:
    """Refuse a weight format or decode mode the device cannot run, in one line."""
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"weights must be one of {', '.join(WEIGHT_FORMATS)}, got {weights!r}")
    if weights == "int8" and device.type != "cpu":
        raise ValueError(
            f"weights=int8 runs on the CPU only (torch's int8 weight-pack matmul), and this run is on "
            f"{device}: use weights=bf16 there"
        )
    if decode == "graph" and device.type != "cuda":
        raise ValueError(
            f"decode=graph replays CUDA graphs: it needs a CUDA device, and this run is on {device} "
            "(use decode=eager there)"
        )


def checkpoint_model(checkpoint: Checkpoint, device: torch.device, dtype: torch.dtype, weights: str = "fp32") -> GPT:
    """The checkpoint's model in eval mode on device, computing in dtype, its Linear weights converted to the
    `weights` format (in memory only)."""
    checkpoint.check_finite()
    return inference_model(checkpoint.model_config, checkpoint.model_state, device, dtype, weights)


def inference_model(config: GPTConfig, state: dict, device: torch.device, dtype: torch.dtype, weights: str) -> GPT:
    """GPT(config) holding `state`, in eval mode on device in dtype, Linear weights as `weights`, for decoding."""
    model = GPT(config)
    load_weights(model, state)
    return to_decode_layout(to_weight_format(model.to(device=device, dtype=dtype).eval(), weights))
