"""The engine's decode modes and shared prefills: the static cache (what a CUDA graph
captures) gives the tokens the eager cache gives, and rows with one prompt prefill once.

Models run in float64 so that two computations of the same logits agree to ~1e-12 and a
seeded draw cannot fall on the other side of a rounding."""

import pytest
import torch

from attention_variants import BLOCKS
from model import KVCache, Sampling, StaticKVCache, generate
from test_generate import reference_sampled

GREEDY = Sampling(temperature=0)
SAMPLED = Sampling(temperature=1.0, top_k=30, seed=7)


@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("block", BLOCKS)
def test_static_cache_generates_what_the_eager_cache_generates(make_model, n_kv_head, sampling, block):
    """Left-padded rows, and past block_size (16) so the window slides."""
    model = make_model(n_kv_head=n_kv_head, **block).double()
    prompts = [[5, 17, 3], [1, 2, 3, 4, 5, 6, 7, 8, 9], [0, 44]]
    eager = generate(model, prompts, 30, sampling)
    assert generate(model, prompts, 30, sampling, decode="static") == eager
    if sampling is SAMPLED:
        assert eager == reference_sampled(model, prompts, 30, sampling)
    assert len({tuple(row) for row in eager}) == 3


@pytest.mark.parametrize("block", BLOCKS)
def test_static_cache_logits_equal_the_eager_cache_logits_step_by_step(make_model, block):
    model = make_model(n_kv_head=2, **block).double()
    idx = torch.randint(0, 97, (2, 14), generator=torch.Generator().manual_seed(1))
    pad = torch.tensor([0, 3])
    logits = []
    for cache in (KVCache(model.config, 2, dtype=torch.float64), StaticKVCache(model.config, 2, dtype=torch.float64)):
        cache.reset(pad)
        with torch.no_grad():
            steps = [model(idx[:, :6], kv_cache=cache)[0]]
            steps += [model(idx[:, t : t + 1], kv_cache=cache)[0] for t in range(6, 14)]
        logits.append(torch.cat(steps, dim=1))
    torch.testing.assert_close(logits[1], logits[0], rtol=1e-10, atol=1e-10)


def prefill_batches(model) -> list[tuple[int, int]]:
    """The (batch, tokens) of every forward call of more than one token, recorded."""
    calls = []
    model.register_forward_pre_hook(lambda _, args: calls.append(tuple(args[0].shape)) if args[0].size(1) > 1 else None)
    return calls


def test_samples_of_one_prompt_share_one_prefill(make_model):
    model = make_model().double()
    calls = prefill_batches(model)
    rows = generate(model, [[5, 17, 3, 8]] * 4, 6, SAMPLED)
    assert calls == [(1, 4)]
    assert len({tuple(row) for row in rows}) > 1  # the rows still sample apart


def test_shared_prefill_gives_each_row_what_a_prefill_per_row_gives(make_model):
    model = make_model(n_kv_head=2).double()
    prompts = [[5, 17, 3], [9, 9], [5, 17, 3], [9, 9], [5, 17, 3]]
    calls = prefill_batches(model)
    shared = generate(model, prompts, 12, SAMPLED)
    assert calls[0] == (2, 3)
    assert shared == reference_sampled(model, prompts, 12, SAMPLED)  # no cache, one row at a time
    assert generate(model, prompts, 12, SAMPLED, decode="static") == shared


def test_a_prompt_that_pads_into_another_is_not_shared(make_model):
    """[0, 5] and a left-padded [5] hold the same ids (padding is id 0)."""
    model = make_model().double()
    calls = prefill_batches(model)
    prompts = [[0, 5], [5]]
    assert generate(model, prompts, 8, GREEDY) == [generate(model, [p], 8, GREEDY)[0] for p in prompts]
    assert calls[0] == (2, 2)


def test_unknown_decode_mode_and_a_graph_off_cuda_are_refused(make_model):
    model = make_model()
    with pytest.raises(ValueError, match=r"decode must be one of \('eager', 'graph', 'static'\), got 'fast'"):
        generate(model, [[1, 2]], 4, GREEDY, decode="fast")
    with pytest.raises(ValueError, match="a CUDA graph needs the model on a CUDA device, not cpu"):
        generate(model, [[1, 2]], 4, GREEDY, decode="graph")
