"""transformers as the independent reference for the Hugging Face interop tests."""

import json
from pathlib import Path

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, GPTBigCodeConfig, GPTBigCodeForCausalLM

from model import GPT, GPTConfig
from run.checkpoints import load_weights

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

# The tiny GPT-2 the tests import: bos/eos unset, as vocab 1000 has no id 50256.
TINY = dict(n_layer=2, n_head=4, n_embd=64, vocab_size=1000, n_positions=64, bos_token_id=None, eos_token_id=None)
LOGITS_ATOL = 1e-5


def randomized(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Noise on every parameter, biases and LayerNorm gains included (both start
    constant), so that a mix-up of any of them shows in the logits. Eval mode."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    return model.eval()


def hf_gpt2(seed: int = 0, **overrides) -> GPT2LMHeadModel:
    return randomized(GPT2LMHeadModel(GPT2Config(**{**TINY, **overrides})), seed)


def hf_bigcode(seed: int = 0, **overrides) -> GPTBigCodeForCausalLM:
    return randomized(GPTBigCodeForCausalLM(GPTBigCodeConfig(**{**TINY, "multi_query": True, **overrides})), seed)


def edit_config(directory: Path, dropped: tuple[str, ...] = (), **changes) -> None:
    """Rewrite directory's config.json with `changes` set and the keys in `dropped` left out."""
    path = directory / "config.json"
    kept = {key: value for key, value in json.loads(path.read_text()).items() if key not in dropped}
    path.write_text(json.dumps({**kept, **changes}))


def build(config: GPTConfig, state: dict[str, torch.Tensor]) -> GPT:
    model = GPT(config)
    load_weights(model, state)
    return model.eval()


def random_tokens(vocab_size: int, length: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab_size, (2, length), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def assert_same_logits(ours: GPT, reference: torch.nn.Module, length: int = 32, atol: float = LOGITS_ATOL) -> None:
    tokens = random_tokens(ours.config.vocab_size, length)
    expected = reference(tokens).logits  # (2, length, vocab)
    actual, _ = ours(tokens)
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, atol=atol, rtol=0)
