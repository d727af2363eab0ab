"""Evaluation math, with expected values worked out by hand."""

import math

import pytest
import torch

from rlhf.analysis.evaluation import best_of_n_choice, best_of_n_kl, distinct_n, mean_std, sequence_kl


def test_distinct_2_by_hand():
    # bigrams: (1,2) (2,1) (1,2) | (3,4): 4 bigrams, 3 distinct.
    assert distinct_n([[1, 2, 1, 2], [3, 4]], 2) == pytest.approx(3 / 4)
    assert distinct_n([[5], []], 2) == 0.0


def test_best_of_n_kl_known_values():
    assert best_of_n_kl(1) == 0.0
    # n = 2: log 2 - 1/2 = 0.19315; n = 16: log 16 - 15/16 = 1.83759.
    assert best_of_n_kl(2) == pytest.approx(0.6931472 - 0.5)
    assert best_of_n_kl(16) == pytest.approx(2.7725887 - 0.9375)


def test_best_of_n_choice_looks_only_at_the_first_n():
    scores = torch.tensor([[0.1, 0.9, 5.0], [2.0, 1.0, 0.0]])
    assert best_of_n_choice(scores, 2).tolist() == [1, 0]
    assert best_of_n_choice(scores, 3).tolist() == [2, 0]


def test_sequence_kl_on_a_case_with_a_known_answer():
    """Sampling from pi = (0.5, 0.5) against pi_ref = (0.25, 0.75) on one token: the Monte Carlo
    estimate averaged over both outcomes, weighted by pi, is the exact KL = 0.5 log 2 + 0.5 log(2/3)."""
    pi, ref = torch.tensor([0.5, 0.5]), torch.tensor([0.25, 0.75])
    logprobs = torch.log(pi).view(2, 1)  # row x = the response "token x"
    ref_logprobs = torch.log(ref).view(2, 1)
    per_sample = sequence_kl(logprobs, ref_logprobs, torch.ones(2, 1, dtype=torch.bool))
    exact = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert (pi * per_sample).sum().item() == pytest.approx(exact)


def test_sequence_kl_ignores_masked_tokens():
    logprobs = torch.tensor([[-1.0, -2.0, -50.0]])
    ref_logprobs = torch.tensor([[-1.5, -1.0, 0.0]])
    mask = torch.tensor([[True, True, False]])
    # (-1 + 1.5) + (-2 + 1) = -0.5
    assert sequence_kl(logprobs, ref_logprobs, mask).item() == pytest.approx(-0.5)


def test_mean_std():
    assert mean_std([1.0, 3.0]) == (2.0, 1.0)
    assert all(math.isnan(x) for x in mean_std([]))


def test_repetition_within_an_answer_and_the_degeneration_flags():
    from rlhf.analysis.evaluation import degeneration_reasons, repetition_within

    # [1,2,3,4,1,2,3,4]: 4-grams 1234 2341 3412 4123 1234 -> 4 distinct of 5 -> 0.2; a short answer counts 0
    assert repetition_within([[1, 2, 3, 4, 1, 2, 3, 4], [5, 6]], 4) == pytest.approx(0.1)
    assert repetition_within([[7] * 10], 4) == pytest.approx(1 - 1 / 7)
    assert repetition_within([], 4) == 0.0
    sft = {"repetition_4": 0.05, "distinct_2": 0.65}
    assert degeneration_reasons({"repetition_4": 0.06, "distinct_2": 0.60}, sft) == []
    reasons = degeneration_reasons({"repetition_4": 0.40, "distinct_2": 0.45}, sft)
    assert reasons == ["within-answer repetition 0.40 against SFT's 0.05", "distinct-2 0.45 against SFT's 0.65"]
    # repetition must be both over 0.2 and twice SFT's
    assert degeneration_reasons({"repetition_4": 0.15, "distinct_2": 0.65}, sft) == []
    assert (
        degeneration_reasons({"repetition_4": 0.3, "distinct_2": 0.65}, {"repetition_4": 0.2, "distinct_2": 0.65}) == []
    )
