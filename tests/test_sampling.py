"""Sampling: SGLang's parameters, filters in its order, reproducible seeds, clear errors."""

from __future__ import annotations

import pytest
import torch

from kvadmit.model.sampling import Sampler, filtered_probs
from kvadmit.sampling_params import SamplingError, SamplingParams

# Probabilities 0.5, 0.25, 0.125, 0.0625, 0.0625 (as logits: their logs; temperature 1 keeps them).
PROBS = torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.0625])
LOGITS = PROBS.log()


def test_no_filter_keeps_the_softmax() -> None:
    torch.testing.assert_close(filtered_probs(LOGITS, SamplingParams()), PROBS)


def test_top_k_keeps_the_k_most_likely() -> None:
    # top 2 of 0.5 / 0.25 → 2/3, 1/3
    torch.testing.assert_close(
        filtered_probs(LOGITS, SamplingParams(top_k=2)), torch.tensor([2 / 3, 1 / 3, 0, 0, 0])
    )


def test_top_p_keeps_the_smallest_head_reaching_p() -> None:
    # Mass before each token: 0, 0.5, 0.75, 0.875, 0.9375. top_p 0.75 keeps the first two (0 and 0.5 < 0.75).
    torch.testing.assert_close(
        filtered_probs(LOGITS, SamplingParams(top_p=0.75)), torch.tensor([2 / 3, 1 / 3, 0, 0, 0])
    )
    # top_p 0.8: 0.75 < 0.8, so the third stays: 0.5, 0.25, 0.125 over 0.875.
    expected = torch.tensor([0.5, 0.25, 0.125, 0, 0]) / 0.875
    torch.testing.assert_close(filtered_probs(LOGITS, SamplingParams(top_p=0.8)), expected)


def test_min_p_drops_tokens_below_a_share_of_the_most_likely() -> None:
    # min_p 0.3: threshold 0.5 × 0.3 = 0.15 keeps 0.5 and 0.25.
    torch.testing.assert_close(
        filtered_probs(LOGITS, SamplingParams(min_p=0.3)), torch.tensor([2 / 3, 1 / 3, 0, 0, 0])
    )


def test_temperature_sharpens_and_zero_is_greedy() -> None:
    # temperature 0.5 squares the probabilities before renormalising: 0.25, 0.0625, ... over their sum.
    sq = PROBS**2
    torch.testing.assert_close(filtered_probs(LOGITS, SamplingParams(temperature=0.5)), sq / sq.sum())
    sampler = Sampler()
    assert {sampler.sample("a", LOGITS, SamplingParams(temperature=0.0)) for _ in range(20)} == {0}


def test_a_seed_makes_a_request_reproducible_and_draws_follow_the_distribution() -> None:
    def draws(default_seed: int, p: SamplingParams) -> list[int]:
        sampler = Sampler(default_seed)
        return [sampler.sample("a", LOGITS, p) for _ in range(30)]

    # The request's own seed decides its draws, not the sampler's; without one they differ.
    assert draws(1, SamplingParams(seed=1234)) == draws(2, SamplingParams(seed=1234))
    assert draws(1, SamplingParams()) != draws(2, SamplingParams())
    sampler = Sampler()
    draws = torch.tensor([sampler.sample("x", LOGITS, SamplingParams()) for _ in range(4000)])
    freq = torch.bincount(draws, minlength=5).float() / 4000
    assert torch.allclose(freq, PROBS, atol=0.03)  # 3σ for p = 0.5 over 4000 draws is ≈ 0.024


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -0.1}, "temperature must be ≥ 0"),
        ({"top_p": 0.0}, "top_p must be in (0, 1]"),
        ({"top_p": 1.5}, "top_p must be in (0, 1]"),
        ({"top_k": 0}, "top_k must be −1 (all) or ≥ 1"),
        ({"min_p": 2.0}, "min_p must be in [0, 1]"),
    ],
)
def test_bad_parameters_say_what_is_allowed(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(
        SamplingError,
        match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]"),
    ):
        SamplingParams(**kwargs)  # type: ignore[arg-type]
