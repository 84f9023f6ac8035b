import pytest
import torch

from model import GPT, GPTConfig


def tiny_config(**overrides) -> GPTConfig:
    """A model small enough that every test runs in milliseconds."""
    base = dict(vocab_size=97, block_size=16, n_layer=2, n_head=4, n_embd=32, dropout=0.0, bias=True)
    base.update(overrides)
    return GPTConfig(**base)


@pytest.fixture
def make_model():
    def make(seed: int = 0, **overrides) -> GPT:
        torch.manual_seed(seed)
        return GPT(tiny_config(**overrides)).eval()

    return make
