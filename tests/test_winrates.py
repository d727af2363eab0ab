"""Tests for rlhf.winrates. Expected values are worked out by hand in the comments."""

import math

import pytest

from rlhf import winrates as W

# ----------------------------------------------------------------------------- position-swap aggregation


@pytest.mark.parametrize(
    "ab, ba, outcome",
    [
        # ab: verdict with model A shown first; ba: with model B shown first, in position terms
        ("A", "B", "A"),  # A wins both orders (B-first: the second shown, model A, wins)
        ("A", "tie", "A"),  # wins one order, ties the other
        ("tie", "B", "A"),
        ("B", "A", "B"),  # model B wins both orders
        ("B", "tie", "B"),
        ("tie", "A", "B"),
        ("tie", "tie", "tie"),
        ("A", "A", "tie"),  # the first shown always wins: pure position bias, inconsistent -> tie
        ("B", "B", "tie"),  # the second shown always wins
        ("A", "invalid", "invalid"),  # an invalid order is never a win ...
        ("invalid", "B", "invalid"),
        ("tie", "invalid", "invalid"),  # ... nor a tie
        ("invalid", "invalid", "invalid"),
    ],
)
def test_outcome_from_both_orders(ab, ba, outcome):
    assert W.outcome_from_verdicts(ab, ba) == outcome


@pytest.mark.parametrize("verdict", ["A", "B", "tie", "invalid"])
def test_symmetric_judge_verdict_is_the_outcome(verdict):
    assert W.outcome_from_verdicts(verdict) == verdict
    assert W.outcomes_from_verdicts([verdict, "A"]) == [verdict, "A"]


def test_outcomes_from_verdicts_lists_and_errors():
    assert W.outcomes_from_verdicts(["A", "A", "B"], ["B", "A", "invalid"]) == ["A", "tie", "invalid"]
    with pytest.raises(ValueError, match="2 A-first verdicts but 1"):
        W.outcomes_from_verdicts(["A", "B"], ["A"])
    with pytest.raises(ValueError, match="must be one of"):
        W.outcome_from_verdicts("win", "A")


def test_swap_outcomes():
    assert W.swap_outcomes(["A", "B", "tie", "invalid"]) == ["B", "A", "tie", "invalid"]


# ----------------------------------------------------------------------------- win rate and interval


def test_win_rate_summary_with_ties_and_invalid():
    # W=6, T=2, L=2 valid (n=10), 1 invalid. win_rate = (6 + 2/2)/10 = 0.7, loss 0.2, tie 0.2.
    # Wilson, z = 1.959964, z^2 = 3.841459, z^2/n = 0.3841459:
    #   centre = (0.7 + 0.1920729) / 1.3841459 = 0.644493
    #   half   = 1.959964 / 1.3841459 * sqrt(0.7*0.3/10 + 3.841459/400)
    #          = 1.416007 * sqrt(0.021 + 0.0096036) = 1.416007 * 0.174939 = 0.247715
    #   -> [0.396778, 0.892208]
    s = W.win_rate_summary(["A"] * 6 + ["tie"] * 2 + ["B"] * 2 + ["invalid"])
    assert (s["wins"], s["ties"], s["losses"], s["n"], s["n_invalid"]) == (6, 2, 2, 10, 1)
    assert s["win_rate"] == pytest.approx(0.7)
    assert s["loss_rate"] == pytest.approx(0.2)
    assert s["tie_rate"] == pytest.approx(0.2)
    assert s["win_rate"] + s["loss_rate"] + s["tie_rate"] / 2 == pytest.approx(1.0)
    assert s["ci95_low"] == pytest.approx(0.396778, abs=2e-6)
    assert s["ci95_high"] == pytest.approx(0.892208, abs=2e-6)


def test_wilson_matches_published_value():
    # 8 successes of 10: the 95% Wilson interval tabulated by Newcombe (1998, Stat. Med. 17:857,
    # method 3) is 0.4902 to 0.9433.
    s = W.win_rate_summary(["A"] * 8 + ["B"] * 2)
    assert (s["ci95_low"], s["ci95_high"]) == pytest.approx((0.4902, 0.9433), abs=1e-4)


def test_wilson_keeps_width_at_a_perfect_record():
    # p = 1: half = centre - 1/(1 + z^2/n), so low = 1/(1 + z^2/n) = 1/1.3841459 = 0.722467, high = 1.
    s = W.win_rate_summary(["A"] * 10)
    assert s["win_rate"] == 1.0
    assert s["ci95_low"] == pytest.approx(0.722467, abs=1e-5)
    assert s["ci95_high"] == pytest.approx(1.0)


def test_all_ties_is_half_and_no_valid_prompts_is_none():
    s = W.win_rate_summary(["tie"] * 4)
    assert (s["win_rate"], s["loss_rate"], s["tie_rate"]) == (0.5, 0.0, 1.0)
    empty = W.win_rate_summary(["invalid", "invalid"])
    assert empty["n"] == 0 and empty["n_invalid"] == 2
    assert empty["win_rate"] is None and empty["ci95_low"] is None


# ----------------------------------------------------------------------------- length-controlled win rate


def test_lc_equals_raw_when_lengths_are_equal():
    # x = 0 for every prompt: the intercept-only fit gives sigma(b0) = mean score = (3 + 0.5)/5 = 0.7.
    lc = W.length_controlled_win_rate(["A", "A", "A", "B", "tie"], [5] * 5, [5] * 5)
    assert lc["win_rate"] == pytest.approx(0.7)
    assert lc["lc_win_rate"] == pytest.approx(0.7, abs=1e-9)


def test_lc_equals_raw_without_a_length_effect():
    # Each outcome occurs once with A longer by 10 and once with A shorter by 10, so the outcome
    # is independent of length: with b1 = 0 every p_i is the same, the b1 score equation
    # sum (y_i - p) x_i = 0 holds because the x_i cancel in pairs, and sigma(b0) = mean score.
    outcomes = ["A", "A", "A", "tie", "B"] * 2  # 6 wins, 2 ties, 2 losses: raw = (6 + 1)/10 = 0.7
    lengths_a = [110] * 5 + [90] * 5
    lc = W.length_controlled_win_rate(outcomes, lengths_a, [100] * 10)
    assert lc["win_rate"] == pytest.approx(0.7)
    assert lc["lc_win_rate"] == pytest.approx(0.7, abs=1e-6)
    assert lc["length_coef"] == pytest.approx(0.0, abs=1e-6)


def test_lc_moves_to_half_when_length_explains_everything():
    # A wins exactly when it is longer; A is longer on 7 of 10 prompts: raw 0.7. Length separates
    # the outcomes, the boundary lies midway between delta = -10 and +10, i.e. at 0: lc ~ 0.5.
    deltas = [-30, -20, -10, 10, 20, 30, 40, 50, 60, 70]
    outcomes = ["A" if d > 0 else "B" for d in deltas]
    lc = W.length_controlled_win_rate(outcomes, [100 + d for d in deltas], [100] * 10)
    assert lc["win_rate"] == pytest.approx(0.7)
    assert lc["length_coef"] > 3  # a steep length effect
    assert abs(lc["lc_win_rate"] - 0.5) < 0.01


def test_lc_fit_solves_the_penalised_score_equations():
    # Slow reference: at the optimum the gradient of the penalised negative log-likelihood is zero,
    #   sum_i (p_i - y_i) = 0  and  sum_i (p_i - y_i) x_i + l2 * b1 = 0,  x_i = tanh(delta_i / std(delta)).
    outcomes = ["A", "B", "tie", "A", "A", "B", "tie", "A", "invalid", "B"]
    lengths_a = [30, 12, 20, 25, 11, 9, 18, 40, 99, 22]
    lengths_b = [20, 15, 20, 10, 14, 14, 20, 21, 1, 20]
    lc = W.length_controlled_win_rate(outcomes, lengths_a, lengths_b, l2=0.5)
    assert lc["n"] == 9 and lc["n_invalid"] == 1
    keep = [i for i, o in enumerate(outcomes) if o != "invalid"]
    deltas = [lengths_a[i] - lengths_b[i] for i in keep]
    mean = sum(deltas) / len(deltas)
    std = math.sqrt(sum((d - mean) ** 2 for d in deltas) / len(deltas))
    y = [{"A": 1.0, "tie": 0.5, "B": 0.0}[outcomes[i]] for i in keep]
    g0 = g1 = 0.0
    for d, yi in zip(deltas, y):
        x = math.tanh(d / std)
        p = 1 / (1 + math.exp(-(lc["intercept"] + lc["length_coef"] * x)))
        g0 += p - yi
        g1 += (p - yi) * x
    assert g0 == pytest.approx(0.0, abs=1e-8)
    assert g1 + 0.5 * lc["length_coef"] == pytest.approx(0.0, abs=1e-8)
    assert lc["lc_win_rate"] == pytest.approx(1 / (1 + math.exp(-lc["intercept"])))


def test_lc_degenerate_inputs():
    assert W.length_controlled_win_rate(["invalid"], [1], [2])["lc_win_rate"] is None
    same = W.length_controlled_win_rate(["A", "A"], [10, 1], [1, 10])  # nothing to regress
    assert same["lc_win_rate"] == 1.0
    with pytest.raises(ValueError, match="lengths_a"):
        W.length_controlled_win_rate(["A"], [1, 2], [1])


# ----------------------------------------------------------------------------- agreement


def test_agreement():
    a = ["A", "B", "tie", "A", "invalid", "B"]
    b = ["A", "A", "tie", "A", "B", "invalid"]
    # valid for both: prompts 0-3; same on 0, 2, 3 -> 3/4. Decisive (no tie): 0, 1, 3 -> same on 0, 3 -> 2/3.
    r = W.agreement(a, b)
    assert r == {"agreement": 0.75, "n": 4, "agreement_decisive": pytest.approx(2 / 3), "n_decisive": 3, "n_invalid": 2}
    assert W.agreement(["invalid"], ["A"])["agreement"] is None
    with pytest.raises(ValueError, match="different numbers"):
        W.agreement(["A"], ["A", "B"])


def test_agreement_by_group():
    a = ["A", "B", "A", "tie", "B", "A"]
    b = ["A", "A", "A", "B", "B", "B"]
    groups = ["x", "x", None, "y", "y", "y"]  # prompt 2 is in no group
    r = W.agreement_by_group(a, b, groups)
    assert list(r) == ["x", "y"]
    assert r["x"] == {"agreement": 0.5, "n": 2, "agreement_decisive": 0.5, "n_decisive": 2, "n_invalid": 0}
    # y: prompts 3-5; same on 4 only -> 1/3; decisive (no tie): 4, 5 -> 1/2.
    assert r["y"] == {
        "agreement": pytest.approx(1 / 3),
        "n": 3,
        "agreement_decisive": 0.5,
        "n_decisive": 2,
        "n_invalid": 0,
    }
    with pytest.raises(ValueError, match="group labels"):
        W.agreement_by_group(a, b, groups[:-1])
