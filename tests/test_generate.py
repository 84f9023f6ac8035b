"""The generation engine against a reference that has no cache: a loop that runs the
whole sequence (cropped to block_size) through the model for every new token."""

import pytest
import torch

from attention_variants import BLOCKS
from model import GPT, Sampling, generate, sample_next, stream, to_decode_layout

GREEDY = Sampling(temperature=0)


def reference_greedy(model: GPT, prompt: list[int], max_new_tokens: int) -> list[int]:
    """nanoGPT's sampling loop: full forward over the last block_size tokens, argmax."""
    seq = list(prompt)
    block_size = model.config.block_size
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits, _ = model(torch.tensor([seq[-block_size:]]))
            seq.append(int(logits[0, -1].argmax()))
    return seq[len(prompt) :]


def reference_sampled(model: GPT, prompts: list[list[int]], max_new_tokens: int, sampling: Sampling) -> list[list[int]]:
    """Each row's own tokens, no padding, the last block_size run through the model
    without a cache; per step one draw for all rows together, as stream draws."""
    seqs = [list(p) for p in prompts]
    block_size = model.config.block_size
    generator = sampling.generator(model.lm_head.weight.device)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = torch.stack([model(torch.tensor([seq[-block_size:]]))[0][0, -1] for seq in seqs])  # (B, V)
            for seq, token in zip(seqs, sample_next(logits, sampling, generator).tolist()):
                seq.append(token)
    return [seq[len(p) :] for seq, p in zip(seqs, prompts)]


def prompt(length: int, seed: int = 0) -> list[int]:
    return torch.randint(0, 97, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
@pytest.mark.parametrize("prompt_len", [3, 16, 21])  # short, exactly block_size, longer
@pytest.mark.parametrize("block", BLOCKS)
def test_greedy_equals_uncached_reference_past_block_size(make_model, n_kv_head, prompt_len, block):
    model = make_model(n_kv_head=n_kv_head, **block)
    start = prompt(prompt_len, seed=prompt_len)
    [tokens] = generate(model, [start], 30, GREEDY)  # ends far past block_size (16)
    assert tokens == reference_greedy(model, start, 30)


@pytest.mark.parametrize("n_kv_head, attn_impl", [(4, "sdpa"), (2, "manual"), (1, "sdpa")])
@pytest.mark.parametrize("block", BLOCKS)
def test_batched_prompts_of_different_lengths_equal_each_prompt_alone(make_model, n_kv_head, attn_impl, block):
    model = make_model(n_kv_head=n_kv_head, attn_impl=attn_impl, **block)
    prompts = [prompt(n, seed=n) for n in (1, 7, 12, 4)]
    batched = generate(model, prompts, 12, GREEDY)  # the longest row slides past block_size
    for start, tokens in zip(prompts, batched):
        assert tokens == reference_greedy(model, start, 12)


def test_greedy_is_deterministic_and_diverse_across_prompts(make_model):
    model = make_model()
    prompts = [prompt(5, seed=1), prompt(5, seed=2)]
    first = generate(model, prompts, 10, GREEDY)
    assert generate(model, prompts, 10, GREEDY) == first
    assert first[0] != first[1]


def test_seed_makes_sampling_reproducible(make_model):
    model = make_model()
    prompts = [prompt(4, seed=3)] * 3
    sampling = Sampling(temperature=1.0, top_k=50, seed=7)
    first = generate(model, prompts, 20, sampling)
    assert generate(model, prompts, 20, sampling) == first
    assert generate(model, prompts, 20, Sampling(temperature=1.0, top_k=50, seed=8)) != first
    assert first[0] != first[1]  # rows of one batch draw different samples


@pytest.mark.parametrize(
    "sampling", [Sampling(temperature=1.0, seed=3), Sampling(temperature=0.8, top_k=20, top_p=0.9, seed=4)]
)
@pytest.mark.parametrize("block", BLOCKS)
def test_seeded_sampling_past_block_size_with_left_padded_rows_equals_reference(make_model, sampling, block):
    model = make_model(block_size=16, **block).double()  # float64: cached and uncached logits agree to ~1e-12
    prompts = [prompt(n, seed=20 + n) for n in (3, 9, 14)]  # left padded by 11, 5 and 0
    out = generate(model, prompts, 40, sampling)  # every row slides far past block_size
    assert out == reference_sampled(model, prompts, 40, sampling)
    assert all(len(set(tokens)) > 10 for tokens in out)  # diverse samples, so a wrong context shows
    assert len({tuple(tokens) for tokens in out}) == 3


def test_room_for_new_tokens_grows_as_they_come(make_model):
    model = make_model(block_size=16)
    start = prompt(5)
    steps = stream(model, [start], 10**12, GREEDY)  # 8 TB of token ids if allocated up front
    tokens = [step[0] for step, _ in zip(steps, range(40))]
    assert tokens == reference_greedy(model, start, 40)


def test_top_k_one_is_greedy(make_model):
    model = make_model(n_kv_head=2)
    start = prompt(6, seed=4)
    assert generate(model, [start], 15, Sampling(top_k=1, seed=0)) == generate(model, [start], 15, GREEDY)


def test_stop_token_ends_the_row_and_is_not_yielded(make_model):
    model = make_model()
    start = prompt(5, seed=5)
    free = reference_greedy(model, start, 20)
    stop_at = free[6]
    first = free.index(stop_at)
    assert generate(model, [start], 20, GREEDY, stop_tokens={stop_at}) == [free[:first]]


def test_stop_check_ends_the_row_after_the_matching_token(make_model):
    model = make_model()
    start = prompt(5, seed=6)
    free = reference_greedy(model, start, 20)
    sequence = free[8:10]
    end = next(i for i in range(1, 20) if free[i - 1 : i + 1] == sequence) + 1

    def ends_with_sequence(generated: list[int]) -> bool:
        return generated[-2:] == sequence

    assert generate(model, [start], 20, GREEDY, stop=ends_with_sequence) == [free[:end]]


def test_a_stopped_row_leaves_the_other_rows_unchanged(make_model):
    model = make_model()
    prompts = [prompt(5, seed=7), prompt(9, seed=8)]
    free = [reference_greedy(model, p, 14) for p in prompts]
    stop_at = free[0][3]
    assert stop_at not in free[1]  # only row 0 stops early
    out = generate(model, prompts, 14, GREEDY, stop_tokens={stop_at})
    assert out == [free[0][: free[0].index(stop_at)], free[1]]


def test_stream_yields_each_token_as_soon_as_it_is_sampled(make_model):
    model = make_model()
    forwards = []
    model.register_forward_hook(lambda module, args, output: forwards.append(args[0].shape))
    start = prompt(5, seed=9)
    expected = reference_greedy(model, start, 4)
    forwards.clear()
    steps = stream(model, [start], 4, GREEDY)
    assert forwards == []  # nothing runs before the first token is asked for
    for i, new in enumerate(steps):
        assert new == {0: expected[i]}
        # the prefill, then one single-token forward per further token
        assert forwards == [torch.Size([1, 5])] + [torch.Size([1, 1])] * i


def test_stream_reports_only_rows_still_generating(make_model):
    model = make_model()
    prompts = [prompt(3, seed=10), prompt(3, seed=11)]
    free = [reference_greedy(model, p, 8) for p in prompts]
    steps = list(
        stream(model, prompts, 8, GREEDY, stop=lambda generated: len(generated) == 2 and generated == free[0][:2])
    )
    assert [sorted(step) for step in steps] == [[0, 1], [0, 1]] + [[1]] * 6


def test_vocab_size_limits_the_sampled_ids(make_model):
    model = make_model()

    def favour_top_ids(module, args, output):  # ids 90..96 become by far the likeliest
        logits, loss = output
        return logits + 100 * (torch.arange(97) >= 90), loss

    model.register_forward_hook(favour_top_ids)
    start = prompt(4, seed=13)
    assert all(t >= 90 for t in generate(model, [start], 10, GREEDY)[0])
    for sampling in (GREEDY, Sampling(seed=0)):
        [tokens] = generate(model, [start], 30, sampling, vocab_size=90)
        assert len(tokens) == 30 and all(t < 90 for t in tokens)


@pytest.mark.parametrize("block", BLOCKS)
def test_decode_layout_transposes_memory_but_not_the_model(make_model, block):
    model = make_model(n_kv_head=2, **block)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    params = dict(model.named_parameters())
    idx = torch.randint(0, 97, (2, 16))
    logits, _ = model(idx)
    start = prompt(6, seed=12)
    tokens = generate(model, [start], 24, GREEDY)
    to_decode_layout(model)
    assert dict(model.named_parameters()) == params  # the same Parameter objects, still tied
    assert model.lm_head.weight is model.transformer.wte.weight
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name])
        if name.endswith(("c_fc.weight", "c_gate.weight")):  # (mlp_hidden, n_embd): column-major, rows strided
            assert p.stride() == (1, p.size(0))
        if name.endswith("mlp.c_proj.weight"):  # (n_embd, mlp_hidden): stays row-major
            assert p.is_contiguous()
    torch.testing.assert_close(model(idx)[0], logits, rtol=1e-5, atol=1e-5)
    assert generate(model, [start], 24, GREEDY) == tokens


@pytest.mark.parametrize(
    "prompts, max_new_tokens, message",
    [
        ([], 5, "every prompt needs at least one token"),
        ([[1], []], 5, "every prompt needs at least one token"),
        ([[1, 97, -1]], 5, r"token ids \[-1, 97\] are outside the model's vocabulary \[0, 97\)"),
    ],
)
def test_invalid_requests_are_rejected(make_model, prompts, max_new_tokens, message):
    with pytest.raises(ValueError, match=message):
        generate(make_model(), prompts, max_new_tokens)
