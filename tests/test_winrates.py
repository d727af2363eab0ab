"""Tests for rlhf.core.winrates. Expected values are worked out by hand in the comments."""

import math

import numpy as np
import pytest

from rlhf.core import winrates as W

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


Z = 1.959963984540054  # standard normal 97.5% quantile


def tango_z(wins, losses, n, delta):
    """Tango's score statistic at delta, written out from its definition: l is the restricted
    maximum-likelihood loss probability, the root of 2n l^2 + B l + C = 0 with
    B = -W - L + (2n - W + L) delta and C = -L delta (1 - delta)."""
    b = -wins - losses + (2 * n - wins + losses) * delta
    c = -losses * delta * (1 - delta)
    loss = (math.sqrt(b * b - 8 * n * c) - b) / (4 * n)
    return (wins - losses - n * delta) / math.sqrt(n * (2 * loss + delta * (1 - delta))), loss


def test_win_rate_summary_with_ties_and_invalid():
    # W=6, T=2, L=2 valid (n=10), 1 invalid. win_rate = (6 + 2/2)/10 = 0.7, loss 0.2, tie 0.2.
    s = W.win_rate_summary(["A"] * 6 + ["tie"] * 2 + ["B"] * 2 + ["invalid"])
    assert (s["wins"], s["ties"], s["losses"], s["n"], s["n_invalid"]) == (6, 2, 2, 10, 1)
    assert s["win_rate"] == pytest.approx(0.7)
    assert s["loss_rate"] == pytest.approx(0.2)
    assert s["tie_rate"] == pytest.approx(0.2)
    assert s["win_rate"] + s["loss_rate"] + s["tie_rate"] / 2 == pytest.approx(1.0)
    # The interval ends, as differences delta = 2p - 1, are where Tango's Z = +z (low) and -z (high);
    # l there must be the restricted MLE: d/dl [6 log(l + delta) + 2 log l + 2 log(1 - 2l - delta)] = 0.
    for end, target in ((s["ci95_low"], Z), (s["ci95_high"], -Z)):
        delta = 2 * end - 1
        z, loss = tango_z(6, 2, 10, delta)
        assert z == pytest.approx(target, abs=1e-9)
        assert 6 / (loss + delta) + 2 / loss - 2 * 2 / (1 - 2 * loss - delta) == pytest.approx(0.0, abs=1e-9)
    assert (s["ci95_low"], s["ci95_high"]) == pytest.approx((0.423543, 0.876308), abs=1e-6)
    # 6 wins vs 2 losses: p = 2 (C(8,0) + C(8,1) + C(8,2)) / 2^8 = 2 * 37 / 256
    assert s["sign_test_p"] == pytest.approx(74 / 256)


def test_interval_without_ties_is_wilson_published_value():
    # No ties: the restricted MLE puts no mass on ties and Tango's statistic is Wilson's score
    # statistic. 8 successes of 10: the 95% Wilson interval tabulated by Newcombe (1998, Stat. Med.
    # 17:857, method 3) is 0.4902 to 0.9433.
    s = W.win_rate_summary(["A"] * 8 + ["B"] * 2)
    assert (s["ci95_low"], s["ci95_high"]) == pytest.approx((0.4902, 0.9433), abs=1e-4)


def test_interval_keeps_width_at_a_perfect_record():
    # All wins, no ties: Wilson at p = 1, low = 1/(1 + z^2/n) = 1/1.3841459 = 0.722467, high = 1.
    s = W.win_rate_summary(["A"] * 10)
    assert s["win_rate"] == 1.0
    assert s["ci95_low"] == pytest.approx(0.722467, abs=1e-6)
    assert s["ci95_high"] == pytest.approx(1.0)
    assert s["sign_test_p"] == pytest.approx(2 / 2**10)


def test_interval_at_all_ties_has_width():
    # W = L = 0: l = 0 for delta > 0, so Z = -sqrt(n delta / (1 - delta)) = -z at delta = z^2/(n + z^2),
    # and symmetrically below: p = 1/2 +- z^2 / (2 (n + z^2)). n = 4: 3.841459 / 15.682918 = 0.244945.
    s = W.win_rate_summary(["tie"] * 4)
    assert (s["win_rate"], s["loss_rate"], s["tie_rate"]) == (0.5, 0.0, 1.0)
    assert (s["ci95_low"], s["ci95_high"]) == pytest.approx((0.255055, 0.744945), abs=1e-6)
    assert s["sign_test_p"] == 1.0  # nothing decisive to test
    # n = 300 ties: +- 3.841459 / 607.682918 = 0.006321, narrower, never zero
    assert W.win_rate_interval(0, 0, 300) == pytest.approx((0.5 - 0.006321, 0.5 + 0.006321), abs=1e-6)


def test_no_valid_prompts_is_none():
    empty = W.win_rate_summary(["invalid", "invalid"])
    assert empty["n"] == 0 and empty["n_invalid"] == 2
    assert empty["win_rate"] is None and empty["ci95_low"] is None and empty["ci95_high"] is None
    assert empty["sign_test_p"] == 1.0
    with pytest.raises(ValueError, match="at least one valid prompt"):
        W.win_rate_interval(0, 0, 0)


def test_interval_excludes_half_exactly_when_mcnemar_rejects():
    # At delta = 0 the restricted MLE is l = (W + L)/2n and Z = (W - L)/sqrt(W + L), McNemar's statistic,
    # whatever the ties. 14 vs 5: 9/sqrt(19) = 2.065 > 1.96, excludes 0.5; 13 vs 5: 8/sqrt(18) = 1.886 does not.
    low, _ = W.win_rate_interval(14, 5, 100)
    assert low > 0.5
    low, _ = W.win_rate_interval(13, 5, 100)
    assert low < 0.5


def test_tie_heavy_example_from_the_eval():
    # GRPO vs SFT, 44 wins, 15 losses, 241 ties (n = 300, win rate (44 + 120.5)/300 = 0.548333).
    # Old Wilson on 0.548333 with n = 300: centre 0.547722, half 0.055961 -> [0.491762, 0.603683], including
    # 0.5 ("not distinguishable"). McNemar: 29/sqrt(59) = 3.775, so the paired interval excludes 0.5.
    s = W.win_rate_summary(["A"] * 44 + ["B"] * 15 + ["tie"] * 241)
    assert s["win_rate"] == pytest.approx(0.548333, abs=1e-6)
    assert s["ci95_low"] > 0.5 and s["ci95_high"] < 0.603683
    assert (s["ci95_low"], s["ci95_high"]) == pytest.approx((0.524062, 0.573860), abs=1e-6)
    # exact sign test: 2 * sum_{k <= 15} C(59, k) / 2^59
    assert s["sign_test_p"] == pytest.approx(2 * sum(math.comb(59, k) for k in range(16)) / 2**59, rel=1e-12)
    assert s["sign_test_p"] == pytest.approx(2.0372e-4, abs=1e-8)


def test_sign_test_small_cases_by_hand():
    assert W.sign_test_p(5, 0) == pytest.approx(2 / 32)  # 2 * C(5,0) / 2^5
    assert W.sign_test_p(1, 3) == pytest.approx(2 * (1 + 4) / 16)  # 2 (C(4,0) + C(4,1)) / 2^4 = 0.625
    assert W.sign_test_p(2, 2) == 1.0  # 2 * 11/16 > 1: capped
    assert W.sign_test_p(0, 0) == 1.0
    assert W.sign_test_p(3000, 2000) > 0.0  # exact integers: no underflow to 0 at large n
    with pytest.raises(ValueError, match="non-negative"):
        W.sign_test_p(-1, 2)


def test_holm_adjust_by_hand():
    p = {"ppo": 0.01, "grpo": 0.04, "raft": 0.03, "dpo": 0.005}
    # sorted: dpo 0.005, ppo 0.01, raft 0.03, grpo 0.04; multipliers 4, 3, 2, 1:
    #   dpo 0.02; ppo max(0.02, 0.03) = 0.03; raft max(0.03, 0.06) = 0.06; grpo max(0.06, 0.04) = 0.06
    adjusted = W.holm_adjust(p)
    assert list(adjusted) == ["ppo", "grpo", "raft", "dpo"]  # the input's order
    assert adjusted == pytest.approx({"ppo": 0.03, "grpo": 0.06, "raft": 0.06, "dpo": 0.02})
    # capped at 1, and monotone: 2 * 0.6 = 1.2 -> 1, then max(1, 0.7) = 1
    assert W.holm_adjust({"a": 0.6, "b": 0.7}) == {"a": 1.0, "b": 1.0}
    assert W.holm_adjust({"only": 0.02}) == {"only": 0.02}
    assert W.holm_adjust({}) == {}


# ----------------------------------------------------------------------------- coverage


def wilson(wins, losses, ties):
    """The interval this module used before: Wilson (1927) on p = (W + T/2)/n with n trials,
    centre = (p + z^2/2n) / (1 + z^2/n), half = z / (1 + z^2/n) * sqrt(p(1-p)/n + z^2/4n^2)."""
    n = wins + losses + ties
    p = (wins + ties / 2) / n
    denom = 1 + Z * Z / n
    centre, half = (p + Z * Z / (2 * n)) / denom, Z / denom * np.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n))
    return centre - half, centre + half


def exact_coverage(interval, n, p_win, p_loss):
    """P(low <= true win rate <= high), summed exactly over every (W, L, T) with W + L + T = n, each
    with its multinomial probability n! / (W! L! T!) p_win^W p_loss^L p_tie^T."""
    p_tie = 1 - p_win - p_loss
    log_factorial = np.array([math.lgamma(k + 1) for k in range(n + 1)])
    wins, losses = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    keep = wins + losses <= n
    wins, losses = wins[keep], losses[keep]
    ties = n - wins - losses
    log_p = (
        log_factorial[n]
        - log_factorial[wins]
        - log_factorial[losses]
        - log_factorial[ties]
        + wins * math.log(p_win)
        + losses * math.log(p_loss)
        + ties * math.log(p_tie)
    )
    assert np.exp(log_p).sum() == pytest.approx(1.0)
    low, high = interval(wins, losses, ties)
    truth = p_win + p_tie / 2
    return float(np.exp(log_p)[(low <= truth) & (truth <= high)].sum())


def test_coverage_at_75_percent_ties():
    # n = 300 prompts, P(win, loss, tie) = (0.15, 0.10, 0.75), true win rate 0.15 + 0.75/2 = 0.525.
    # Exact (no simulation noise): the paired score interval covers 0.950 of evaluations; the old
    # Wilson interval covers 0.9999: twice too wide, the failure this test exists to catch.
    assert 0.94 <= exact_coverage(W.win_rate_interval, 300, 0.15, 0.10) <= 0.96
    assert exact_coverage(wilson, 300, 0.15, 0.10) > 0.999


def test_coverage_simulation_at_75_percent_ties():
    # The same setting drawn prompt by prompt: 2,000 evaluations of 300 prompts, seeded. The rate
    # from 2,000 draws has sd sqrt(0.95 * 0.05 / 2000) = 0.005 around the exact 0.950.
    rng = np.random.default_rng(0)
    scores = rng.choice([1.0, 0.0, 0.5], p=[0.15, 0.10, 0.75], size=(2000, 300))  # (evaluations, prompts)
    wins, losses, ties = ((scores == v).sum(axis=1) for v in (1.0, 0.0, 0.5))
    low, high = W.win_rate_interval(wins, losses, ties)
    assert 0.94 <= np.mean((low <= 0.525) & (high >= 0.525)) <= 0.96
    low, high = wilson(wins, losses, ties)
    assert np.mean((low <= 0.525) & (high >= 0.525)) > 0.995


def test_coverage_at_small_n_near_the_edges():
    # Exact coverage at n = 20 and 50 over win/loss probabilities from all-but-certain ties to
    # all-but-certain wins (P(win) 0.9) and losses: never below 0.93 (score intervals oscillate with
    # the discreteness; the smallest measured on a 40 x 40 grid is 0.939). The studentized interval
    # mean +- z sd/sqrt(n) on the observed variance fails here (0.70 at n = 20, 0.88 at n = 50):
    # all wins or all ties gives it zero width.
    def studentized(wins, losses, ties):
        n = wins + losses + ties
        mean = (wins + ties / 2) / n
        sd = np.sqrt(np.maximum((wins + ties / 4) / n - mean**2, 0.0))
        return mean - Z * sd / np.sqrt(n), mean + Z * sd / np.sqrt(n)

    levels = (0.01, 0.05, 0.15, 0.3, 0.6, 0.9)
    grid = [(p_win, p_loss) for p_win in levels for p_loss in levels if p_win + p_loss < 1]
    for n in (20, 50):
        assert min(exact_coverage(W.win_rate_interval, n, *probs) for probs in grid) >= 0.93
        assert min(exact_coverage(studentized, n, *probs) for probs in grid) < 0.93


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
    none = W.length_controlled_win_rate(["invalid"], [1], [2])
    assert none["lc_win_rate"] is None and none["lc_ci95_low"] is None and none["lc_ci95_high"] is None
    same = W.length_controlled_win_rate(["A", "A"], [10, 1], [1, 10])  # nothing to regress
    assert same["lc_win_rate"] == 1.0
    with pytest.raises(ValueError, match="lengths_a"):
        W.length_controlled_win_rate(["A"], [1, 2], [1])


def test_lc_interval_with_equal_lengths_is_the_bootstrap_of_the_mean():
    # Equal lengths: x = 0 in every resample, so each refit gives sigma(b0) = the resample's mean score,
    # and the interval is the 2.5% / 97.5% quantiles of the bootstrap means over the same draws.
    outcomes = ["A"] * 9 + ["B"] * 5 + ["tie"] * 26 + ["invalid"]
    lc = W.length_controlled_win_rate(outcomes, [7] * 41, [7] * 41, n_boot=200, seed=3)
    y = np.array([1.0] * 9 + [0.0] * 5 + [0.5] * 26)  # the valid prompts, in order
    rows = np.random.default_rng(3).integers(0, 40, size=(200, 40))
    expected = np.quantile(y[rows].mean(axis=1), [0.025, 0.975])
    assert (lc["lc_ci95_low"], lc["lc_ci95_high"]) == pytest.approx(tuple(expected), abs=1e-8)
    assert lc["lc_ci95_low"] < lc["lc_win_rate"] < lc["lc_ci95_high"]


def test_lc_interval_matches_refitting_each_resample():
    # Slow reference: resample the prompts (invalid ones dropped first) and call the function on each
    # resample without a bootstrap; the vectorised refits must give the same quantiles.
    outcomes = ["A", "B", "tie", "A", "A", "B", "tie", "A", "invalid", "B", "tie", "tie", "A", "B", "tie"]
    lengths_a = [30, 12, 20, 25, 11, 9, 18, 40, 99, 22, 15, 30, 28, 10, 21]
    lengths_b = [20, 15, 20, 10, 14, 14, 20, 21, 1, 20, 15, 25, 12, 16, 19]
    lc = W.length_controlled_win_rate(outcomes, lengths_a, lengths_b, n_boot=40, seed=7)
    keep = [i for i, o in enumerate(outcomes) if o != "invalid"]
    rows = np.random.default_rng(7).integers(0, len(keep), size=(40, len(keep)))
    refits = [
        W.length_controlled_win_rate(
            [outcomes[keep[j]] for j in row],
            [lengths_a[keep[j]] for j in row],
            [lengths_b[keep[j]] for j in row],
            n_boot=0,
        )["lc_win_rate"]
        for row in rows
    ]
    expected = np.quantile(refits, [0.025, 0.975])
    assert (lc["lc_ci95_low"], lc["lc_ci95_high"]) == pytest.approx(tuple(expected), abs=1e-7)
    again = W.length_controlled_win_rate(outcomes, lengths_a, lengths_b, n_boot=40, seed=7)
    assert again == lc  # the fixed seed makes it deterministic


def test_lc_interval_when_every_outcome_is_the_same():
    # Every resample of all ties is all ties: the bootstrap would give [0.5, 0.5]. The interval is then
    # the score interval, 1/2 +- z^2 / (2 (n + z^2)) = 0.5 +- 0.244945 at n = 4.
    lc = W.length_controlled_win_rate(["tie"] * 4, [1, 2, 3, 4], [4, 3, 2, 1])
    assert lc["lc_win_rate"] == 0.5
    assert (lc["lc_ci95_low"], lc["lc_ci95_high"]) == pytest.approx((0.255055, 0.744945), abs=1e-6)
    wins = W.length_controlled_win_rate(["A"] * 10, [5] * 10, [1] * 10)
    assert (wins["lc_ci95_low"], wins["lc_ci95_high"]) == pytest.approx((0.722467, 1.0), abs=1e-6)
    skipped = W.length_controlled_win_rate(["A", "B"], [1, 2], [2, 1], n_boot=0)
    assert skipped["lc_ci95_low"] is None and skipped["lc_ci95_high"] is None


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


def test_judge_agreements_pairs_every_two_judges_that_ran():
    """Without gold (real data), the reward model and the LLM judge are still compared with each other; the LLM
    judge saw a prefix of each pairing's prompts, so the comparison runs over that prefix."""
    outcomes = {
        "reward": {"ppo_vs_sft": ["A", "A", "B", "tie"], "dpo_vs_sft": ["B", "A"]},
        "openai": {"ppo_vs_sft": ["A", "B"], "dpo_vs_sft": ["B"]},  # 2 and 1 prompts judged
    }
    result = W.judge_agreements(outcomes)
    # over (A, A), (A, B) and (B, B): the same on 2 of 3, none a tie
    assert result == {
        "openai_vs_reward": {"agreement": 2 / 3, "n": 3, "agreement_decisive": 2 / 3, "n_decisive": 3, "n_invalid": 0}
    }
    assert W.judge_agreements({"reward": outcomes["reward"]}) == {}  # one judge: nothing to agree with
    gold = {"ppo_vs_sft": ["A", "B", "B", "A"], "dpo_vs_sft": ["tie", "A"]}
    differences = {"ppo_vs_sft": ["capability", "verbosity", "verbosity", "content"], "dpo_vs_sft": [None, "content"]}
    result = W.judge_agreements({**outcomes, "gold": gold}, differences)
    assert list(result) == ["openai_vs_reward", "openai_vs_gold", "reward_vs_gold"]
    # reward vs gold over 6 prompts: same on 0, 2, 5 -> 1/2; decisive (no tie on either side): 0, 1, 2, 5 -> 3/4
    assert result["reward_vs_gold"]["agreement"] == 0.5 and result["reward_vs_gold"]["agreement_decisive"] == 0.75
    assert result["reward_vs_gold"]["by_gold_difference"]["verbosity"]["agreement"] == 0.5  # prompts 1, 2
    # openai vs gold over the prefixes: (A, A), (B, B), (B, tie) -> 2 of 3
    assert result["openai_vs_gold"]["agreement"] == pytest.approx(2 / 3)
    assert set(result["openai_vs_gold"]["by_gold_difference"]) == {"capability", "verbosity"}
    assert "by_gold_difference" not in result["openai_vs_reward"]
