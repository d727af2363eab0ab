"""Tests for rlhf.core.ops. Expected values are worked out by hand in each test."""

import math

import pytest
import torch

from rlhf.core.ops import (
    KL_ESTIMATORS,
    entropy_from_logits,
    explained_variance,
    explained_variance_moments,
    gae_advantages,
    gather_logprobs,
    group_advantages,
    kl_k1,
    kl_k2,
    kl_k3,
    last_true_index,
    masked_mean,
    masked_moments,
    masked_sum,
    masked_var,
    masked_whiten,
    moments_mean_var,
    sequence_logps,
)

NAN, INF = float("nan"), float("inf")


def f64(*rows):
    return torch.tensor(rows if len(rows) > 1 else rows[0], dtype=torch.float64)


def close(actual, expected, tol=1e-6):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=torch.float64),
        torch.as_tensor(expected, dtype=torch.float64),
        rtol=tol,
        atol=tol,
        equal_nan=True,
    )


# Kept entries are 1, 2, 4, 6; the masked-out ones are NaN / inf and must never leak in.
VALUES = f64([1.0, 2.0, NAN], [4.0, INF, 6.0])
MASK = torch.tensor([[True, True, False], [True, False, True]])


# ---------------------------------------------------------------- masked statistics


def test_masked_sum_and_mean_ignore_masked_out_entries():
    close(masked_sum(VALUES, MASK), 1 + 2 + 4 + 6)
    close(masked_mean(VALUES, MASK), 13 / 4)
    close(masked_sum(VALUES, MASK, dim=1), [1 + 2, 4 + 6])
    close(masked_mean(VALUES, MASK, dim=1), [3 / 2, 10 / 2])
    close(masked_mean(VALUES, MASK, dim=0), [(1 + 4) / 2, 2 / 1, 6 / 1])


def test_masked_mean_of_all_false_mask_is_zero_not_nan():
    nothing = torch.zeros_like(MASK)
    close(masked_mean(VALUES, nothing), 0.0)
    close(masked_mean(VALUES, nothing, dim=1), [0.0, 0.0])
    # one empty row, one full row
    close(masked_mean(f64([1.0, 2.0], [3.0, 5.0]), torch.tensor([[False, False], [True, True]]), dim=1), [0.0, 4.0])


def test_masked_var():
    # mean 3.25; squared deviations 2.25² + 1.25² + 0.75² + 2.75² = 5.0625 + 1.5625 + 0.5625 + 7.5625 = 14.75
    close(masked_var(VALUES, MASK, unbiased=True), 14.75 / 3)
    close(masked_var(VALUES, MASK, unbiased=False), 14.75 / 4)
    # too few entries: 0, not NaN
    close(masked_var(VALUES, torch.zeros_like(MASK)), 0.0)
    one = torch.tensor([[True, False, False], [False, False, False]])
    close(masked_var(VALUES, one, unbiased=True), 0.0)


def test_masked_whiten_uses_masked_stats_and_zeros_the_rest():
    std = math.sqrt(14.75 / 3 + 1e-8)  # unbiased, from test_masked_var
    expected = [[(1 - 3.25) / std, (2 - 3.25) / std, 0.0], [(4 - 3.25) / std, 0.0, (6 - 3.25) / std]]
    close(masked_whiten(VALUES, MASK), expected)
    expected_unshifted = [[(1 - 3.25) / std + 3.25, (2 - 3.25) / std + 3.25, 0.0],
                          [(4 - 3.25) / std + 3.25, 0.0, (6 - 3.25) / std + 3.25]]  # fmt: skip
    close(masked_whiten(VALUES, MASK, shift_mean=False), expected_unshifted)
    # changing masked-out entries changes nothing
    other = VALUES.clone()
    other[~MASK] = 1e6
    close(masked_whiten(other, MASK), expected)


def test_moments_of_two_processes_add_up_to_the_whole_batch():
    # VALUES' masked entries 1, 2 | 4, 6: n 4, sum 13, sum of squares 1 + 4 + 16 + 36 = 57
    close(masked_moments(VALUES, MASK), [4.0, 13.0, 57.0])
    first, second = masked_moments(VALUES[:1], MASK[:1]), masked_moments(VALUES[1:], MASK[1:])
    close(first, [2.0, 3.0, 5.0])
    close(second, [2.0, 10.0, 52.0])
    mean, var = moments_mean_var(first + second)  # what an all-reduce sum hands each process
    close(mean, 3.25)
    close(var, (57 - 4 * 3.25**2) / 3)  # = 14.75 / 3, as test_masked_var
    close(moments_mean_var(first + second, unbiased=False)[1], 14.75 / 4)
    close(moments_mean_var(torch.zeros(3, dtype=torch.float64))[1], 0.0)  # nothing masked in: 0, not NaN


def test_masked_whiten_with_global_moments_whitens_each_half_as_the_whole():
    """Process r whitens its rows with the summed moments: together they equal whitening the whole
    batch at once; with only their own moments they would not."""
    moments = masked_moments(VALUES[:1], MASK[:1]) + masked_moments(VALUES[1:], MASK[1:])
    halves = [masked_whiten(VALUES[k : k + 1], MASK[k : k + 1], moments=moments) for k in (0, 1)]
    close(torch.cat(halves), masked_whiten(VALUES, MASK))
    std = math.sqrt(14.75 / 3 + 1e-8)
    close(halves[0], [[(1 - 3.25) / std, (2 - 3.25) / std, 0.0]])
    # alone, the first half [1, 2] would have mean 1.5 and var 0.5
    close(masked_whiten(VALUES[:1], MASK[:1]), [[-0.5 / math.sqrt(0.5 + 1e-8), 0.5 / math.sqrt(0.5 + 1e-8), 0.0]])


def test_explained_variance_from_summed_moments_equals_the_whole_batch():
    returns = f64([1.0, 2.0], [3.0, 4.0])
    values = f64([1.0, 2.0], [3.0, 5.0])
    mask = torch.ones(2, 2, dtype=torch.bool)
    moments = explained_variance_moments(values[:1], returns[:1], mask[:1])
    moments = moments + explained_variance_moments(values[1:], returns[1:], mask[1:])
    close(explained_variance(None, None, None, moments=moments), 0.85)  # as in test_explained_variance
    close(explained_variance(values, returns, mask), 0.85)


def test_masked_ops_compute_in_float32_for_bf16_inputs():
    values = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.bfloat16)
    mask = torch.tensor([[True, True, False]])
    assert masked_mean(values, mask).dtype == torch.float32
    assert masked_whiten(values, mask).dtype == torch.float32
    close(masked_mean(values, mask), 1.5)


def test_explained_variance():
    returns = f64([1.0, 2.0, 3.0, 4.0, NAN])
    mask = torch.tensor([True, True, True, True, False])
    close(explained_variance(returns.clone(), returns, mask), 1.0)
    # residual R − V = [0, 0, 0, −1]: mean −0.25, Σ dev² = 3·0.0625 + 0.5625 = 0.75, var 0.25
    # Var[R] = (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3  ->  1 − 0.25 / (5/3) = 0.85
    close(explained_variance(f64([1.0, 2.0, 3.0, 5.0, 7.0]), returns, mask), 0.85)
    # predicting the mean return explains nothing
    close(explained_variance(torch.full((5,), 2.5, dtype=torch.float64), returns, mask), 0.0)
    # constant returns: undefined
    assert torch.isnan(explained_variance(f64([0.0, 1.0]), f64([3.0, 3.0]), torch.tensor([True, True])))


# ---------------------------------------------------------------- log-probs and entropy


def test_gather_logprobs_matches_explicit_log_softmax_index():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 11) * 3  # (B, T, V)
    token_ids = torch.randint(0, 11, (2, 3))  # (B, T)
    expected = torch.log_softmax(logits, dim=-1)[torch.arange(2)[:, None], torch.arange(3)[None, :], token_ids]
    close(gather_logprobs(logits, token_ids), expected, tol=1e-5)


def test_gather_logprobs_by_hand_and_bf16():
    # probs 1/6, 2/6, 3/6 -> token 2 has log(1/2), token 0 has log(1/6)
    logits = torch.log(torch.tensor([[[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]]))  # (1, 2, 3)
    close(gather_logprobs(logits, torch.tensor([[2, 0]])), [[math.log(0.5), math.log(1 / 6)]])
    out = gather_logprobs(logits.bfloat16(), torch.tensor([[2, 0]]))
    assert out.dtype == torch.float32
    close(out, [[math.log(0.5), math.log(1 / 6)]], tol=2e-2)


def test_entropy_of_uniform_is_log_v_and_a_hand_case():
    close(entropy_from_logits(torch.zeros(2, 3, 7)), torch.full((2, 3), math.log(7)))
    close(entropy_from_logits(torch.full((1, 1, 5), 42.0)), [[math.log(5)]])
    # p = [1/2, 1/4, 1/4]: H = ½ ln 2 + 2 · ¼ ln 4 = 1.5 ln 2
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25]]]))
    close(entropy_from_logits(logits), [[1.5 * math.log(2)]])


def test_sequence_logps_never_counts_masked_tokens():
    token_logprobs = f64([-1.0, -2.0, -100.0], [-100.0, -0.5, -0.25], [-7.0, -7.0, -7.0])
    response_mask = torch.tensor([[True, True, False], [False, True, True], [False, False, False]])
    close(sequence_logps(token_logprobs, response_mask), [-3.0, -0.75, 0.0])
    close(sequence_logps(token_logprobs, response_mask, average=True), [-1.5, -0.375, 0.0])


def test_last_true_index():
    mask = torch.tensor([
        [False, True, True, False],
        [True, False, False, False],
        [False, False, False, False],
        [True, True, True, True],
    ])  # fmt: skip
    assert last_true_index(mask).tolist() == [2, 0, 0, 3]


# ---------------------------------------------------------------- KL estimators

PI = [0.5, 0.3, 0.2]
PI_REF = [0.2, 0.5, 0.3]
EXACT_KL = sum(p * math.log(p / q) for p, q in zip(PI, PI_REF))  # KL(π ‖ π_ref) ≈ 0.1927


def expectation_under_pi(estimator, pi=PI, pi_ref=PI_REF):
    """Σ_x π(x) · k(x): the estimator's exact mean over samples x ~ π, with no sampling."""
    logp, ref = torch.log(f64(pi)), torch.log(f64(pi_ref))
    return (f64(pi) * estimator(logp, ref)).sum()


def test_kl_estimators_pointwise_by_hand():
    # x with π = 0.5, π_ref = 0.2: log π − log π_ref = ln 2.5; r = π_ref/π = 0.4
    logp, ref = torch.log(f64([0.5])), torch.log(f64([0.2]))
    close(kl_k1(logp, ref), [math.log(2.5)])  # 0.9163
    close(kl_k2(logp, ref), [0.5 * math.log(2.5) ** 2])  # 0.4198
    close(kl_k3(logp, ref), [0.4 - 1 + math.log(2.5)])  # 0.3163
    assert {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3} == KL_ESTIMATORS


def test_k1_and_k3_are_exactly_unbiased_for_kl():
    close(expectation_under_pi(kl_k1), EXACT_KL, tol=1e-12)
    # E_π[r − 1 − ln r] = Σ π_ref − 1 + KL = KL
    close(expectation_under_pi(kl_k3), EXACT_KL, tol=1e-12)


def test_k2_is_biased_but_close_for_nearby_distributions():
    # far apart: E[k2] = Σ π · ½ ln²(π/π_ref), not KL
    by_hand = 0.5 * (0.5 * math.log(0.5 / 0.2) ** 2 + 0.3 * math.log(0.3 / 0.5) ** 2 + 0.2 * math.log(0.2 / 0.3) ** 2)
    close(expectation_under_pi(kl_k2), by_hand, tol=1e-12)
    assert abs(by_hand - EXACT_KL) > 1e-3
    # nearby: k2 agrees with KL to second order (Schulman 2020)
    pi, pi_ref = [0.34, 0.33, 0.33], [0.33, 0.34, 0.33]
    exact = sum(p * math.log(p / q) for p, q in zip(pi, pi_ref))
    close(expectation_under_pi(kl_k2, pi, pi_ref), exact, tol=1e-5)


def test_k3_and_k2_are_nonnegative_pointwise_and_zero_at_equality():
    torch.manual_seed(0)
    logp, ref = torch.randn(1000) * 5, torch.randn(1000) * 5
    assert (kl_k3(logp, ref) >= 0).all()
    assert (kl_k2(logp, ref) >= 0).all()
    assert (kl_k1(logp, ref) < 0).any()  # k1 is not
    close(kl_k3(logp, logp), torch.zeros(1000))


# ---------------------------------------------------------------- GAE


def gae_double_loop(rewards, values, response_mask, gamma, lam):
    """Slow reference straight from the definition A_t = Σ_l (γλ)^l δ_{t+l}, V = 0 after the response."""
    B, T = len(rewards), len(rewards[0])
    advantages = [[0.0] * T for _ in range(B)]
    returns = [[0.0] * T for _ in range(B)]
    for b in range(B):
        positions = [t for t in range(T) if response_mask[b][t]]
        for i, t in enumerate(positions):
            total = 0.0
            for offset, s in enumerate(positions[i:]):
                next_value = values[b][positions[i + offset + 1]] if i + offset + 1 < len(positions) else 0.0
                delta = rewards[b][s] + gamma * next_value - values[b][s]
                total += (gamma * lam) ** offset * delta
            advantages[b][t] = total
            returns[b][t] = total + values[b][t]
    return advantages, returns


def test_gae_by_hand_three_tokens_gamma_1_lambda_095():
    # [prompt | r0 r1 r2 | pad]; rewards [0, 0, 1], values [0.5, 0.6, 0.7], γ = 1, λ = 0.95
    # δ2 = 1 + 0 − 0.7 = 0.3        A2 = 0.3
    # δ1 = 0 + 0.7 − 0.6 = 0.1      A1 = 0.1 + 0.95·0.3   = 0.385
    # δ0 = 0 + 0.6 − 0.5 = 0.1      A0 = 0.1 + 0.95·0.385 = 0.46575
    rewards = f64([[9.0, 0.0, 0.0, 1.0, 9.0]])
    values = f64([[NAN, 0.5, 0.6, 0.7, NAN]])
    response_mask = torch.tensor([[False, True, True, True, False]])
    advantages, returns = gae_advantages(rewards, values, response_mask, gamma=1.0, lam=0.95)
    close(advantages, [[0.0, 0.46575, 0.385, 0.3, 0.0]])
    close(returns, [[0.0, 0.96575, 0.985, 1.0, 0.0]])


def test_gae_matches_double_loop_with_left_and_right_padding():
    torch.manual_seed(0)
    B, T = 5, 8
    rewards = torch.randn(B, T, dtype=torch.float64)
    values = torch.randn(B, T, dtype=torch.float64)
    spans = [(2, 6), (0, 8), (3, 4), (5, 8), (0, 0)]  # [start, end) of the response; last row empty
    response_mask = torch.zeros(B, T, dtype=torch.bool)
    for b, (start, end) in enumerate(spans):
        response_mask[b, start:end] = True
    # finite garbage outside the response (a value head does output numbers on padding); must be ignored
    rewards[~response_mask] = 1e3
    values[~response_mask] = -1e3
    advantages, returns = gae_advantages(rewards, values, response_mask, gamma=0.9, lam=0.8)
    expected_advantages, expected_returns = gae_double_loop(
        rewards.tolist(), values.tolist(), response_mask.tolist(), gamma=0.9, lam=0.8
    )
    close(advantages, expected_advantages, tol=1e-10)
    close(returns, expected_returns, tol=1e-10)


# ---------------------------------------------------------------- group advantages

GROUP_REWARDS = f64([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0, 0.0, 0.0, 0.0, 3.0])  # 3 groups of 4


def test_group_advantages_scaled_with_zero_variance_group():
    advantages, zero_std = group_advantages(GROUP_REWARDS, group_size=4)
    # group 0: mean 0.5, Σ dev² = 4·0.25 = 1, unbiased std = sqrt(1/3)
    s0 = math.sqrt(1 / 3) + 1e-4
    # group 1: all equal -> 0 and flagged
    # group 2: mean 0.75, Σ dev² = 3·0.5625 + 2.25² = 6.75, unbiased std = sqrt(2.25) = 1.5
    s2 = 1.5 + 1e-4
    expected = [0.5 / s0, -0.5 / s0, -0.5 / s0, 0.5 / s0, 0, 0, 0, 0, -0.75 / s2, -0.75 / s2, -0.75 / s2, 2.25 / s2]
    close(advantages, expected)
    assert zero_std.tolist() == [False, True, False]


def test_group_advantages_unscaled_dr_grpo():
    advantages, zero_std = group_advantages(GROUP_REWARDS, group_size=4, scale=False)
    close(advantages, [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0, -0.75, -0.75, -0.75, 2.25])
    assert zero_std.tolist() == [False, True, False]


def test_group_advantages_leave_one_out_rloo():
    # r_i minus the mean of the group's other three: group 0, 1 - (0 + 0 + 1)/3 = 2/3 and 0 - 2/3; group 2,
    # 0 - 3/3 = -1 and 3 - 0 = 3; each G/(G-1) = 4/3 times Dr. GRPO's r_i - mean
    advantages, zero_std = group_advantages(GROUP_REWARDS, group_size=4, scale=False, leave_one_out=True)
    close(advantages, [2 / 3, -2 / 3, -2 / 3, 2 / 3, 0, 0, 0, 0, -1, -1, -1, 3])
    assert zero_std.tolist() == [False, True, False]
    with pytest.raises(ValueError, match="group_size >= 2"):
        group_advantages(torch.zeros(3), group_size=1, scale=False, leave_one_out=True)


def test_group_advantages_all_equal_group_is_exactly_zero():
    # 0.1 + 0.1 + 0.1 = 0.30000000000000004 in floating point, so the mean is not exactly 0.1
    advantages, zero_std = group_advantages(f64([0.1, 0.1, 0.1]), group_size=3)
    assert advantages.tolist() == [0.0, 0.0, 0.0]
    assert zero_std.tolist() == [True]


def test_group_advantages_rejects_bad_group_size():
    with pytest.raises(ValueError, match="groups of 4"):
        group_advantages(torch.zeros(6), group_size=4)
    with pytest.raises(ValueError, match="group_size >= 2"):
        group_advantages(torch.zeros(3), group_size=1)
