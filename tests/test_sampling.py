"""Properties of next-token sampling, checked against references computed independently
(sorting in plain Python) over many random rows and many draws."""

import math

import pytest
import torch

from model import Sampling, sample_next
from model.engine import keep_top_k, keep_top_p

DRAWS = 4000


def random_logits(rows: int, vocab: int, seed: int) -> torch.Tensor:
    return 2 * torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed))


def draws(logits_row: torch.Tensor, sampling: Sampling) -> set[int]:
    """The distinct tokens among DRAWS samples from one row of logits."""
    batch = logits_row.expand(DRAWS, -1)
    return set(sample_next(batch, sampling, torch.Generator().manual_seed(0)).tolist())


def reference_top_k(row: list[float], k: int) -> set[int]:
    return set(sorted(range(len(row)), key=lambda i: -row[i])[:k])


def reference_top_p(row: list[float], p: float) -> set[int]:
    """Most likely tokens first, until their probabilities add up to p."""
    exps = [math.exp(x - max(row)) for x in row]
    probs = [e / sum(exps) for e in exps]
    kept, mass = set(), 0.0
    for i in sorted(range(len(row)), key=lambda i: -probs[i]):
        kept.add(i)
        mass += probs[i]
        if mass >= p:
            return kept
    return kept


@pytest.mark.parametrize("k", [1, 3, 10])
def test_top_k_samples_exactly_the_k_most_likely_tokens(k):
    logits = random_logits(5, 30, seed=k)
    for row in logits:
        assert draws(row, Sampling(top_k=k)) == reference_top_k(row.tolist(), k)


@pytest.mark.parametrize("p", [0.3, 0.6, 0.9])
def test_top_p_samples_exactly_the_nucleus(p):
    logits = random_logits(5, 12, seed=int(p * 10))
    for row in logits:
        nucleus = reference_top_p(row.tolist(), p)
        assert draws(row, Sampling(top_p=p)) == nucleus
        assert len(nucleus) < 12  # the property would be vacuous on the whole vocabulary


@pytest.mark.parametrize("p", [0.05, 0.5, 0.95, 1.0])
def test_top_p_filter_matches_reference_on_many_rows(p):
    logits = random_logits(200, 50, seed=7)
    kept = torch.isfinite(keep_top_p(logits, p))
    for row, mask in zip(logits, kept):
        assert set(mask.nonzero().flatten().tolist()) == reference_top_p(row.tolist(), p)


def test_top_k_filter_matches_reference_on_many_rows():
    logits = random_logits(200, 50, seed=8)
    kept = torch.isfinite(keep_top_k(logits, 7))
    for row, mask in zip(logits, kept):
        assert set(mask.nonzero().flatten().tolist()) == reference_top_k(row.tolist(), 7)


def test_top_k_larger_than_the_vocabulary_keeps_everything():
    logits = random_logits(3, 10, seed=9)
    torch.testing.assert_close(keep_top_k(logits, 50), logits)


def test_top_k_and_top_p_together_keep_the_intersection():
    row = random_logits(1, 20, seed=11)[0]
    nucleus = reference_top_p(row.tolist(), 0.9)
    top = reference_top_k(row.tolist(), 3)
    assert top < nucleus  # so the intersection is the top-k set, not the nucleus
    assert draws(row, Sampling(top_k=3, top_p=0.9)) == top


def test_temperature_zero_is_argmax():
    logits = random_logits(64, 40, seed=12)
    assert torch.equal(sample_next(logits, Sampling(temperature=0)), logits.argmax(-1))


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_sample_frequencies_follow_softmax_at_temperature(temperature):
    row = random_logits(1, 6, seed=13)[0]
    samples = sample_next(row.expand(20000, -1), Sampling(temperature=temperature), torch.Generator().manual_seed(1))
    frequencies = torch.bincount(samples, minlength=6) / 20000
    # 20000 draws: the standard error of each frequency is below 0.0036.
    torch.testing.assert_close(frequencies, torch.softmax(row / temperature, -1), rtol=0, atol=0.02)


# Sorted: 3, 2, 1.5, 1, 0.5, 0, -1, -2. The nucleus (p=0.8) holds 5 tokens at temperature 2
# (cumulative 0.77 after 4) but only 3 at temperature 1 (cumulative 0.73 after 2, 0.85 after 3).
TEMPERED_LOGITS = torch.tensor([0.5, 3.0, -1.0, 1.5, 0.0, 2.0, -2.0, 1.0], dtype=torch.float64)
TEMPERED_DRAWS = 200_000


def softmax_over(logits: torch.Tensor, kept: set[int], temperature: float) -> torch.Tensor:
    """softmax(logits / temperature) renormalised over the ids in kept; 0 elsewhere."""
    ids = torch.tensor(sorted(kept))
    probs = torch.zeros_like(logits)
    probs[ids] = torch.exp((logits[ids] - logits[ids].max()) / temperature)
    return probs / probs.sum()


@pytest.mark.parametrize(
    "sampling", [Sampling(temperature=2.0, top_p=0.8), Sampling(temperature=2.0, top_k=4)], ids=["top_p", "top_k"]
)
def test_temperature_is_applied_before_top_p_and_top_k(sampling):
    logits, temperature = TEMPERED_LOGITS, sampling.temperature
    if sampling.top_k is None:
        kept = reference_top_p((logits / temperature).tolist(), sampling.top_p)
        untempered_nucleus = reference_top_p(logits.tolist(), sampling.top_p)
        assert len(kept) == 5 and len(untempered_nucleus) == 3
        wrong = softmax_over(logits, untempered_nucleus, temperature)  # filtered first, tempered after
    else:
        kept = reference_top_k(logits.tolist(), sampling.top_k)  # the same set at any temperature
        wrong = softmax_over(logits, kept, 1.0)  # the temperature left out
    expected = softmax_over(logits, kept, temperature)
    batch = logits.float().expand(TEMPERED_DRAWS, -1)
    samples = sample_next(batch, sampling, torch.Generator().manual_seed(3))
    frequencies = torch.bincount(samples, minlength=len(logits)).double() / TEMPERED_DRAWS
    # 5 standard errors per token (at most 0.0056); 0 for the tokens outside the kept set.
    tolerance = 5 * (expected * (1 - expected) / TEMPERED_DRAWS).sqrt()
    assert ((frequencies - expected).abs() <= tolerance).all(), (frequencies, expected)
    assert (wrong - expected).abs().max() > 10 * tolerance.max()  # the wrong order is far outside


def test_same_seed_same_samples_other_seed_other_samples():
    logits = random_logits(50, 40, seed=14)
    sampling = Sampling(seed=5)

    def run(sampling: Sampling) -> torch.Tensor:
        return sample_next(logits, sampling, sampling.generator("cpu"))

    assert torch.equal(run(sampling), run(sampling))
    assert not torch.equal(run(sampling), run(Sampling(seed=6)))


@pytest.mark.parametrize(
    "values, name",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature=float("inf")), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_p=-0.2), "top_p"),
        (dict(top_k=0), "top_k"),
        (dict(top_k=-3), "top_k"),
        (dict(seed=-1), "seed"),
        (dict(seed=2**32), "seed"),
    ],
)
def test_invalid_sampling_values_name_the_parameter(values, name):
    with pytest.raises(ValueError, match=f"^{name} must be"):
        Sampling(**values)
