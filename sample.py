"""Continue a prompt with a trained model, streaming the text as it is generated.

    python sample.py                                        # the newest run's latest checkpoint
    python sample.py "it's a prompt, typed plainly" num_samples=3 temperature=0.7
    echo "a prompt from stdin" | python sample.py prompt=-
    python sample.py checkpoint=runs/<run> prompt=FILE:prompt.txt max_new_tokens=500
    python sample.py 'stop=["\\n\\n"]' json=true             # one JSON object, for scripts
    python sample.py "def main(" weights=int8               # int8 weights: fewer bytes per token on a CPU
    python sample.py init_from=hf model_path=gpt2 "Hello, I'm a language model,"   # OpenAI's GPT-2

The story: check the settings, load a checkpoint (safetensors only) and its tokenizer, or import a Hugging Face
model as train.py's init_from=hf does; rebuild the model (its Linear weights in the `weights` format), encode the
prompt, then generate every sample in one batch with the KV-cached engine, printing the first as it grows.
"""

from __future__ import annotations

import codecs
import json
import re
import sys
from pathlib import Path
from typing import Any, TextIO

from system import quiet_interrupt_while_starting

if __name__ == "__main__":  # before the imports below: torch alone takes seconds
    quiet_interrupt_while_starting()

import hydra
import torch
from omegaconf import DictConfig

from conf.cli import check_overrides, options_first, prompt_from_words
from conf.sample_config import SampleConfig, load_sample_config
from data import Tokenizer
from model import GPT, KVCache, cut_at_stop, stop_string_check, stream
from run.load import load_model
from run.runtime import available_memory, resolve_device, resolve_precision
from system import exits

PROMPT_FILE = "FILE:"
STDIN = "-"  # prompt=- reads the prompt from standard input
SEPARATOR = "\n" + "-" * 40 + "\n"
ESCAPES = {"\\n": "\n", "\\t": "\t", "\\\\": "\\"}
ESCAPE = re.compile(r"\\[nt\\]")


@hydra.main(config_path="conf", config_name="sample", version_base=None)
def main(cfg: DictConfig) -> None:
    with exits(out_of_memory="lower num_samples, or the model's memory with weights=bf16 or int8"):
        config = load_sample_config(cfg)
        result = sample(config, out=None if config.json else sys.stdout)  # Ctrl-C: what was printed stands
        if config.json:
            print(json.dumps(result, ensure_ascii=False, indent=2))


def sample(config: SampleConfig, out: TextIO | None = None) -> dict[str, Any]:
    """Generate config.num_samples continuations, printed to `out` (if any) as they grow; returns them with what
    produced them, as a JSON-able dict."""
    device = resolve_device(config.device)
    dtype = resolve_precision(config.precision, device).dtype
    source, tokenizer, model = load_sampled_model(config, device, dtype)
    prompt = read_prompt(config.prompt)
    prompt_ids = encode_prompt(tokenizer, prompt)
    check_memory(model, config, len(prompt_ids), device)
    stops = [unescape(stop) for stop in config.stop]

    completions = [Completion(tokenizer, stops) for _ in range(config.num_samples)]
    live = LiveText(out, stops) if out is not None else None
    if live:
        live.write(prompt)
    steps = stream(
        model,
        [prompt_ids] * config.num_samples,
        config.max_new_tokens,
        config.sampling,
        stop_tokens=[] if tokenizer.eot_id is None else [tokenizer.eot_id],
        stop=stop_string_check(tokenizer.decode, stops),
        vocab_size=tokenizer.vocab_size,
        decode=config.decode,
    )
    for new in steps:
        for row, token in new.items():
            completions[row].tokens.append(token)
        if live and 0 in new:
            live.add(tokenizer.decode_bytes([new[0]]))
    if live:
        live.finish(completions[0].text())
        out.write("".join(SEPARATOR + prompt + completion.text() for completion in completions[1:]) + "\n")
        out.flush()
    names = ("max_new_tokens", "temperature", "top_k", "top_p", "seed", "weights", "decode")
    settings = {name: getattr(config, name) for name in names} | {"stop": stops}  # as matched: a typed \n is a newline
    samples = [c.summary(config.max_new_tokens) for c in completions]
    # checkpoint: with init_from=hf, the transformers directory read
    return {"checkpoint": str(source), "prompt": prompt, "settings": settings, "samples": samples}


def load_sampled_model(config: SampleConfig, device: torch.device, dtype: torch.dtype) -> tuple[Path, Tokenizer, GPT]:
    """Where the weights were read from, their tokenizer and the model ready to generate (a gptlab checkpoint, or a
    Hugging Face model with init_from=hf); the checkpoint's own copy of the weights is let go here."""
    hf = config.init_from == "hf"
    target = config.model_path if hf else config.checkpoint
    model, tokenizer, checkpoint = load_model(
        target, config.runs_root, device, dtype, weights=config.weights, decode=config.decode, hf=hf
    )
    if not hf and config.checkpoint is None:
        print(f"sampling from {checkpoint.path} (saved most recently under {config.runs_root}/)", file=sys.stderr)
    return checkpoint.path, tokenizer, model


def check_memory(model: GPT, config: SampleConfig, prompt_tokens: int, device: torch.device) -> None:
    """Refuse, before generating, a batch whose KV cache and per-step logits would not fit
    (the kernel would kill the process without a word)."""
    max_len = min(prompt_tokens + config.max_new_tokens, model.config.block_size)
    cache = KVCache.bytes_for(model.config, config.num_samples, max_len, model.activation_dtype)
    logits = 3 * config.num_samples * model.config.vocab_size * 4  # fp32 logits, probabilities and a sort
    available = available_memory(device)
    if available is not None and cache + logits > available:
        raise ValueError(
            f"num_samples={config.num_samples} needs about {(cache + logits) / 2**30:.1f} GiB "
            f"(KV cache for {max_len} positions, and each step's logits), and {device} has "
            f"{available / 2**30:.1f} GiB available: lower num_samples"
        )


def read_prompt(prompt: str) -> str:
    """The prompt (escapes replaced), standard input for `-`, or the contents of the file a FILE:path prompt names."""
    if prompt == STDIN:
        return sys.stdin.read()
    if not prompt.startswith(PROMPT_FILE):
        return unescape(prompt)
    path = Path(prompt[len(PROMPT_FILE) :]).expanduser()
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read the prompt file {path}: {err}") from err


def unescape(text: str) -> str:
    """\\n, \\t and \\\\ as newline, tab and backslash: a command line cannot type the first two."""
    return ESCAPE.sub(lambda match: ESCAPES[match.group()], text)


def encode_prompt(tokenizer: Tokenizer, prompt: str) -> list[int]:
    """Token ids of the prompt; an empty one starts from <|endoftext|>, or "\n" for a char tokenizer without one."""
    if not prompt:
        if tokenizer.eot_id is not None:
            return [tokenizer.eot_id]
        prompt = "\n"
    if unknown := tokenizer.unknown_characters(prompt):
        listed = " ".join(repr(c) for c in unknown)
        raise ValueError(
            f"the prompt has characters the checkpoint's {tokenizer.name} tokenizer does not know: "
            f"{listed} (its vocabulary is the characters of its training text)"
        )
    return tokenizer.encode(prompt)


class Completion:
    """One sample: its generated tokens and their text up to the first stop string."""

    def __init__(self, tokenizer: Tokenizer, stops: list[str]) -> None:
        self.tokenizer, self.stops = tokenizer, stops
        self.tokens: list[int] = []

    def text(self) -> str:
        return cut_at_stop(self.tokenizer.decode(self.tokens), self.stops)[0]

    def summary(self, max_new_tokens: int) -> dict[str, Any]:
        text, stopped = cut_at_stop(self.tokenizer.decode(self.tokens), self.stops)
        # only <|endoftext|> ends a sample early besides a stop string
        reason = "stop" if stopped else "length" if len(self.tokens) == max_new_tokens else "eot"
        return {"text": text, "new_tokens": len(self.tokens), "finish_reason": reason}


class LiveText:
    """Prints a growing text as soon as later tokens can no longer change it: it holds
    back an unfinished multi-byte character and any ending that could still become a
    stop string, and never prints a stop string. Each token's bytes are decoded once."""

    def __init__(self, out: TextIO, stops: list[str]) -> None:
        self.out, self.stops = out, stops
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # holds an unfinished character
        self.held = ""  # decoded, not yet printed: it may begin a stop string
        self.printed = 0  # characters of the text written so far
        self.stopped = False

    def write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def add(self, token_bytes: bytes) -> None:
        if self.stopped:
            return
        text, self.stopped = cut_at_stop(self.held + self.decoder.decode(token_bytes), self.stops)
        ready = len(text) - (0 if self.stopped else self._possible_stop_start(text))
        if ready:
            self.write(text[:ready])
        self.held, self.printed = text[ready:], self.printed + ready

    def finish(self, text: str) -> None:
        """Print the rest of `text`, the whole sample, of which the printed part is a prefix."""
        self.write(text[self.printed :])

    def _possible_stop_start(self, text: str) -> int:
        """Length of the longest ending of text that begins a stop string."""
        return max((k for stop in self.stops for k in range(1, len(stop)) if text.endswith(stop[:k])), default=0)


if __name__ == "__main__":
    sys.argv[1:] = options_first(prompt_from_words(sys.argv[1:]))
    check_overrides(sys.argv[1:], SampleConfig, "sample")
    main()
