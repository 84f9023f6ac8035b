"""The training-throughput benchmark compares like with like: the reference GPT-2 in
bench/ is the same function as gptlab's GPT, with the same parameters."""

import pytest
import torch

from bench.reference_gpt import ReferenceGPT
from conftest import tiny_config
from model import GPT


@pytest.mark.parametrize("bias", [True, False])
def test_reference_has_gptlabs_parameters_and_computes_the_same_loss_and_gradients(bias):
    config = tiny_config(bias=bias)
    torch.manual_seed(0)
    gptlab = GPT(config)
    reference = ReferenceGPT(config)
    reference.load_state_dict(gptlab.state_dict())  # strict: the same names and shapes
    assert sum(p.numel() for p in reference.parameters()) == gptlab.num_params()

    idx = torch.randint(config.vocab_size, (3, config.block_size))
    targets = torch.randint(config.vocab_size, (3, config.block_size))
    gptlab_logits, gptlab_loss = gptlab(idx, targets)
    reference_logits, reference_loss = reference(idx, targets)
    torch.testing.assert_close(reference_logits, gptlab_logits)
    torch.testing.assert_close(reference_loss, gptlab_loss)

    gptlab_loss.backward()
    reference_loss.backward()
    gptlab_grads = {name: p.grad for name, p in gptlab.named_parameters()}
    for name, p in reference.named_parameters():
        torch.testing.assert_close(p.grad, gptlab_grads[name], msg=name)


def test_reference_initialises_like_gpt2():
    torch.manual_seed(0)
    reference = ReferenceGPT(tiny_config(n_layer=8, n_embd=64))
    params = dict(reference.named_parameters())
    assert params["transformer.h.0.attn.c_attn.weight"].std().item() == pytest.approx(0.02, rel=0.1)
    assert params["transformer.h.0.mlp.c_proj.weight"].std().item() == pytest.approx(0.02 / 4, rel=0.1)
    assert torch.equal(params["transformer.h.0.ln_1.weight"], torch.ones(64))
    assert reference.lm_head.weight is reference.transformer.wte.weight
