"""Tests for rlhf.core.losses. Expected values are worked out by hand in each test."""

import math

import pytest
import torch

from rlhf.core.losses import (
    DPO_AVERAGES_LOGPS,
    DPO_LOSSES,
    GRPO_NORMALIZERS,
    bradley_terry_loss,
    cdpo_loss,
    chosen_nll_loss,
    dpo_loss,
    grpo_loss,
    ipo_loss,
    length_heuristic_bt_loss,
    length_heuristic_dpo_loss,
    logprob_distillation_loss,
    ppo_policy_loss,
    ppo_value_loss,
    sft_loss,
)

NAN = float("nan")


def f64(*rows):
    return torch.tensor(rows if len(rows) > 1 else rows[0], dtype=torch.float64)


def close(actual, expected, tol=1e-6):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=torch.float64), torch.as_tensor(expected, dtype=torch.float64), rtol=tol, atol=tol
    )


def softplus(x):
    """−log σ(−x) = log(1 + eˣ), in plain Python."""
    return math.log1p(math.exp(x))


def assert_detached_scalars(stats, keys):
    assert set(stats) == set(keys)
    for name, value in stats.items():
        assert isinstance(value, torch.Tensor) and value.ndim == 0, name
        assert not value.requires_grad, name


# ---------------------------------------------------------------- SFT and reward model


def test_sft_loss_is_token_mean_nll_over_response():
    token_logprobs = f64([-1.0, -2.0, -9.0], [-3.0, -9.0, -9.0]).requires_grad_()
    response_mask = torch.tensor([[True, True, False], [True, False, False]])
    loss, stats = sft_loss(token_logprobs, response_mask)
    close(loss, (1 + 2 + 3) / 3)
    close(stats["nll"], 2.0)
    assert_detached_scalars(stats, ["nll"])
    loss.backward()
    close(token_logprobs.grad, [[-1 / 3, -1 / 3, 0.0], [-1 / 3, 0.0, 0.0]])


def test_bradley_terry_single_pair_by_hand():
    loss, _stats = bradley_terry_loss(f64([2.0]), f64([0.0]))
    close(loss, math.log(1 + math.exp(-2)))  # 0.1269


def test_logprob_distillation_loss_by_hand():
    predicted = f64([0.5, 2.0, 9.0], [1.0, -1.0, 0.0])
    target = f64([0.0, 1.0, 0.0], [3.0, -1.0, 7.0])
    mask = torch.tensor([[True, True, False], [True, True, False]])
    # masked squared errors: 0.25, 1, 4, 0 -> mean 5.25 / 4; the masked-out 81 and 49 do not count
    close(logprob_distillation_loss(predicted, target, mask), 5.25 / 4)


def test_bradley_terry_batch_stats_by_hand():
    chosen, rejected = f64([2.0, 0.0]).requires_grad_(), f64([0.0, 1.0])
    loss, stats = bradley_terry_loss(chosen, rejected)
    # gaps [2, −1]: losses log(1 + e⁻²) = 0.1269, log(1 + e¹) = 1.3133
    close(loss, (softplus(-2) + softplus(1)) / 2)
    close(stats["accuracy"], 0.5)
    close(stats["margin_mean"], (2 - 1) / 2)
    close(stats["chosen_mean"], 1.0)
    close(stats["rejected_mean"], 0.5)
    assert_detached_scalars(stats, ["accuracy", "margin_mean", "chosen_mean", "rejected_mean"])
    loss.backward()
    assert (chosen.grad < 0).all()  # raising the chosen reward lowers the loss


def test_bradley_terry_label_smoothing_by_hand():
    # z = 2, eps = 0.1: 0.9 * log(1 + e^-2) + 0.1 * log(1 + e^2) = 0.9 * 0.1269 + 0.1 * 2.1269 = 0.3269
    loss, _ = bradley_terry_loss(f64([2.0]), f64([0.0]), label_smoothing=0.1)
    close(loss, 0.9 * math.log(1 + math.exp(-2)) + 0.1 * math.log(1 + math.exp(2)))
    # The smoothed loss is minimised where sigma(z) = 1 - eps, i.e. z = log(9), not at z -> infinity.
    gap = f64([math.log(9.0)]).requires_grad_()
    bradley_terry_loss(gap, f64([0.0]), label_smoothing=0.1)[0].backward()
    close(gap.grad, [0.0])


def test_bradley_terry_margin():
    # r_c − r_r − m = 2 − 0 − 1 = 1 -> log(1 + e⁻¹) = 0.3133
    loss, _ = bradley_terry_loss(f64([2.0]), f64([0.0]), margin=1.0)
    close(loss, math.log(1 + math.exp(-1)))
    # per-pair margins [1, 3]: arguments [1, −1]
    loss, stats = bradley_terry_loss(f64([2.0, 2.0]), f64([0.0, 0.0]), margin=f64([1.0, 3.0]))
    close(loss, (softplus(-1) + softplus(1)) / 2)
    close(stats["accuracy"], 1.0)  # accuracy ignores the margin


def test_length_heuristic_bt_by_hand():
    # gaps [1, 0, -2]; chosen longer, as long, shorter; w = 0.2:
    #   -log(0.2 + 0.8 sigma(1)), -log(0.2 * 0.5 + 0.8 * 0.5) = log 2, -log(0.8 sigma(-2))
    loss, stats = length_heuristic_bt_loss(f64([1.0, 0.0, -1.0]), f64([0.0, 0.0, 1.0]), f64([1.0, 0.5, 0.0]), 0.2)
    sigma = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    expected = -(math.log(0.2 + 0.8 * sigma(1)) + math.log(0.5) + math.log(0.8 * sigma(-2))) / 3
    close(loss, expected)
    close(stats["heuristic_weight"], 0.2)
    close(stats["accuracy"], 1 / 3)
    # w = 0 is Bradley-Terry, whatever the lengths
    chosen, rejected = f64([1.0, 0.0, -1.0]), f64([0.0, 0.0, 1.0])
    close(
        length_heuristic_bt_loss(chosen, rejected, f64([1.0, 0.5, 0.0]), 0.0)[0],
        bradley_terry_loss(chosen, rejected)[0],
    )


def test_length_heuristic_dpo_is_the_rater_mixture_on_implicit_rewards():
    # policy chosen/rejected [-1, -2] / [-3, -1], reference all -2, beta 0.5: h = [2, -1], chosen longer, shorter
    # -> -(log(0.2 + 0.8 sigma(1)) + log(0.8 sigma(-0.5))) / 2; w = 0 is dpo_loss
    logps = (f64([-1.0, -2.0]), f64([-3.0, -1.0]), f64([-2.0, -2.0]), f64([-2.0, -2.0]))
    loss, stats = length_heuristic_dpo_loss(*logps, 0.5, f64([1.0, 0.0]), 0.2)
    sigma = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    close(loss, -(math.log(0.2 + 0.8 * sigma(1)) + math.log(0.8 * sigma(-0.5))) / 2)
    close(stats["rewards/margins"], (1.0 - 0.5) / 2)
    close(length_heuristic_dpo_loss(*logps, 0.5, f64([1.0, 0.0]), 0.0)[0], dpo_loss(*logps, 0.5)[0])


def test_length_heuristic_weight_gradient_is_finite_at_zero():
    # d(-log P)/dw = -(l - sigma(gap)) / P per pair; at w = 0, P = sigma(gap). gaps [1, 0, -2], l [1, 0.5, 0]:
    #   -(1 - s1)/s1, -(0.5 - 0.5)/0.5 = 0, -(0 - s(-2))/s(-2) = 1; mean over 3. log w would give 0 * inf = NaN.
    sigma = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    weight = torch.tensor(0.0, dtype=torch.float64, requires_grad=True)
    loss, _ = length_heuristic_bt_loss(f64([1.0, 0.0, -1.0]), f64([0.0, 0.0, 1.0]), f64([1.0, 0.5, 0.0]), weight)
    loss.backward()
    assert torch.isfinite(weight.grad)
    close(weight.grad, (-(1 - sigma(1)) / sigma(1) + 0.0 + 1.0) / 3)
    # and away from 0, the same formula with P = w l + (1 - w) sigma
    weight = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    length_heuristic_bt_loss(f64([1.0, 0.0]), f64([0.0, 0.0]), f64([1.0, 0.0]), weight)[0].backward()
    p1, p2 = 0.3 + 0.7 * sigma(1), 0.7 * 0.5
    close(weight.grad, (-(1 - sigma(1)) / p1 - (0 - 0.5) / p2) / 2)


def test_length_heuristic_pulls_less_on_labels_that_length_explains():
    # The same gap of 0: a chosen response that is longer pulls r_c up by (1 - w) sigma'(0) / P, with
    # P = w + (1 - w) sigma(0) = 0.6, so 0.8 * 0.25 / 0.6 = 1/3; a shorter one by sigma'(0) / sigma(0) = 0.5, as in
    # Bradley-Terry.
    gaps = f64([0.0, 0.0]).requires_grad_()
    length_heuristic_bt_loss(gaps, f64([0.0, 0.0]), f64([1.0, 0.0]), 0.2)[0].backward()
    close(-gaps.grad * 2, [0.8 * 0.25 / 0.6, 0.5])  # x2: the loss is a mean over 2 pairs


def test_length_heuristic_weight_is_recovered_by_maximum_likelihood():
    # Labels from the mixture with w = 0.3 over known reward gaps: maximising the likelihood over w alone
    # must find it again (a reversed length indicator finds about 0.0 instead).
    generator = torch.Generator().manual_seed(0)
    n = 20_000
    gaps = torch.randn(n, generator=generator, dtype=torch.float64) * 2  # r_better - r_worse
    better_longer = (torch.rand(n, generator=generator) < 0.5).double()
    by_length = torch.rand(n, generator=generator, dtype=torch.float64) < 0.3
    careful_picks_better = torch.rand(n, generator=generator, dtype=torch.float64) < torch.sigmoid(gaps)
    picks_better = torch.where(by_length, better_longer.bool(), careful_picks_better)
    chosen_gap = torch.where(picks_better, gaps, -gaps)  # r_chosen - r_rejected
    chosen_longer = torch.where(picks_better, better_longer, 1 - better_longer)
    logit = torch.zeros((), dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.Adam([logit], lr=0.05)
    for _ in range(400):
        optimizer.zero_grad()
        length_heuristic_bt_loss(chosen_gap, torch.zeros(n, dtype=torch.float64), chosen_longer, logit.sigmoid())[
            0
        ].backward()
        optimizer.step()
    assert logit.sigmoid().item() == pytest.approx(0.3, abs=0.02)


# ---------------------------------------------------------------- DPO family
# policy chosen [−1, −2], rejected [−3, −1]; reference chosen [−2, −2], rejected [−2, −2]; β = 0.5
# chosen log-ratios [1, 0], rejected log-ratios [−1, 1], h = [2, −1], βh = [1, −0.5]
PAIR = (f64([-1.0, -2.0]), f64([-3.0, -1.0]), f64([-2.0, -2.0]), f64([-2.0, -2.0]))
BETA = 0.5
DPO_STAT_KEYS = [
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "rewards/accuracies",
    "logps/chosen",
    "logps/rejected",
]


def test_dpo_loss_and_stats_by_hand():
    loss, stats = dpo_loss(*PAIR, beta=BETA)
    close(loss, (softplus(-1.0) + softplus(0.5)) / 2)  # (0.3133 + 0.9741) / 2 = 0.6437
    # implicit rewards: chosen β·[1, 0] = [0.5, 0], rejected β·[−1, 1] = [−0.5, 0.5]
    close(stats["rewards/chosen"], 0.25)
    close(stats["rewards/rejected"], 0.0)
    close(stats["rewards/margins"], (1.0 + -0.5) / 2)
    close(stats["rewards/accuracies"], 0.5)  # 0.5 > −0.5 yes, 0 > 0.5 no
    close(stats["logps/chosen"], -1.5)
    close(stats["logps/rejected"], -2.0)
    assert_detached_scalars(stats, DPO_STAT_KEYS)
    # the policy equal to the reference: every implicit reward 0, a tie per pair, accuracy 1/2 (chance), not 0
    same = (PAIR[2], PAIR[3], PAIR[2], PAIR[3])
    close(dpo_loss(*same, beta=BETA)[1]["rewards/accuracies"], 0.5)


def test_ipo_loss_by_hand():
    # 1/(2β) = 1: (2 − 1)² = 1, (−1 − 1)² = 4 -> mean 2.5
    loss, stats = ipo_loss(*PAIR, beta=BETA)
    close(loss, 2.5)
    assert_detached_scalars(stats, DPO_STAT_KEYS)


def test_cdpo_loss_by_hand():
    # ε = 0.1: −0.9 log σ(βh) − 0.1 log σ(−βh) = 0.9 softplus(−βh) + 0.1 softplus(βh)
    loss, stats = cdpo_loss(*PAIR, beta=BETA, label_smoothing=0.1)
    pair_0 = 0.9 * softplus(-1.0) + 0.1 * softplus(1.0)
    pair_1 = 0.9 * softplus(0.5) + 0.1 * softplus(-0.5)
    close(loss, (pair_0 + pair_1) / 2)
    assert_detached_scalars(stats, DPO_STAT_KEYS)


def test_cdpo_with_zero_smoothing_equals_dpo():
    torch.manual_seed(0)
    logps = [torch.randn(8) * 10 for _ in range(4)]
    dpo, dpo_stats = dpo_loss(*logps, beta=0.1)
    cdpo, cdpo_stats = cdpo_loss(*logps, beta=0.1, label_smoothing=0.0)
    close(cdpo, dpo, tol=1e-6)
    for key in DPO_STAT_KEYS:
        close(cdpo_stats[key], dpo_stats[key])


def test_dpo_loss_tends_to_log_2_as_beta_goes_to_0():
    loss, _ = dpo_loss(*PAIR, beta=1e-8)
    close(loss, math.log(2))


@pytest.mark.parametrize("name", sorted(DPO_LOSSES))
def test_dpo_family_gradient_raises_chosen_and_lowers_rejected(name):
    # at h = 0 every variant wants h larger (IPO's target 1/(2β) > 0)
    policy_chosen, policy_rejected = f64([-5.0, -3.0]).requires_grad_(), f64([-4.0, -6.0]).requires_grad_()
    loss, _ = DPO_LOSSES[name](policy_chosen, policy_rejected, f64([-5.0, -3.0]), f64([-4.0, -6.0]), beta=0.1)
    loss.backward()
    assert (policy_chosen.grad < 0).all()
    assert (policy_rejected.grad > 0).all()


def test_dpo_tables_agree():
    assert set(DPO_LOSSES) == set(DPO_AVERAGES_LOGPS) == {"sigmoid", "ipo", "cdpo"}
    assert DPO_AVERAGES_LOGPS == {"sigmoid": False, "ipo": True, "cdpo": False}


def test_chosen_nll_is_the_per_token_nll_of_the_chosen_responses_by_hand():
    # log-probs −6 over 3 tokens and −2 over 4 tokens: per token −2 and −0.5, NLL (2 + 0.5) / 2 = 1.25
    close(chosen_nll_loss(f64([-6.0, -2.0]), torch.tensor([3, 4])), 1.25)
    # its gradient raises each chosen log-prob, a short response's more per unit of log-prob: −1/(2·3), −1/(2·4)
    logps = f64([-6.0, -2.0]).requires_grad_()
    chosen_nll_loss(logps, torch.tensor([3, 4])).backward()
    assert logps.grad.tolist() == pytest.approx([-1 / 6, -1 / 8])


@pytest.mark.parametrize("loss_fn", [dpo_loss, ipo_loss])
def test_label_smoothing_is_refused_where_unused(loss_fn):
    with pytest.raises(ValueError, match="cdpo"):
        loss_fn(*PAIR, beta=BETA, label_smoothing=0.1)


# ---------------------------------------------------------------- PPO policy loss
# old log-probs 0, new log-probs ln ρ; clip 0.2 -> ρ clipped to [0.8, 1.2]; loss term max(−Aρ, −A·clip(ρ))
#   a: A=+1, ρ=1.5: −1.5 vs −1.2 -> −1.2 clipped
#   b: A=+1, ρ=0.5: −0.5 vs −0.8 -> −0.5
#   c: A=−1, ρ=0.5:  0.5 vs  0.8 ->  0.8 clipped
#   d: A=−1, ρ=1.5:  1.5 vs  1.2 ->  1.5
#   e: A=+2, ρ=1.0:  −2  vs  −2  ->  −2  (equal: not counted as clipped)
#   last token is padding with garbage
PPO_RATIOS = [[1.5, 0.5, 0.5], [1.5, 1.0, 10.0]]
PPO_ADVANTAGES = f64([1.0, 1.0, -1.0], [-1.0, 2.0, 5.0])
PPO_MASK = torch.tensor([[True, True, True], [True, True, False]])


def log_of(ratios):
    return torch.tensor([[math.log(r) for r in row] for row in ratios], dtype=torch.float64)


def test_ppo_policy_loss_by_hand_with_clipping_for_both_advantage_signs():
    new_logprobs = log_of(PPO_RATIOS).requires_grad_()
    loss, stats = ppo_policy_loss(new_logprobs, torch.zeros(2, 3, dtype=torch.float64), PPO_ADVANTAGES, PPO_MASK)
    close(loss, (-1.2 - 0.5 + 0.8 + 1.5 - 2.0) / 5)  # −0.28
    close(stats["clipfrac"], 2 / 5)  # a and c
    close(stats["ratio_mean"], (1.5 + 0.5 + 0.5 + 1.5 + 1.0) / 5)  # 1.0
    close(stats["approxkl"], 0.5 * (2 * math.log(1.5) ** 2 + 2 * math.log(0.5) ** 2 + 0.0) / 5)  # 0.1290
    assert_detached_scalars(stats, ["approxkl", "clipfrac", "ratio_mean"])
    # d(−Aρ)/d ln ρ = −Aρ, divided by 5 tokens; clipped and padding tokens get no gradient
    loss.backward()
    close(new_logprobs.grad, [[0.0, -0.5 / 5, 0.0], [1.5 / 5, -2.0 / 5, 0.0]])


def test_truncated_importance_weights_scale_each_tokens_surrogate_term_by_hand():
    """Yao et al. 2025: each token's clipped term times its weight min(pi_trainer / pi_engine, cap), a constant."""
    new_logprobs = log_of(PPO_RATIOS).requires_grad_()
    weights = torch.tensor([[2.0, 0.5, 1.0], [1.0, 3.0, 7.0]], dtype=torch.float64)
    loss, stats = ppo_policy_loss(
        new_logprobs, torch.zeros(2, 3, dtype=torch.float64), PPO_ADVANTAGES, PPO_MASK, importance_weights=weights
    )
    close(loss, (-1.2 * 2.0 - 0.5 * 0.5 + 0.8 + 1.5 - 2.0 * 3.0) / 5)  # the padding token's weight 7 counts nowhere
    close(stats["clipfrac"], 2 / 5)  # clipping is the ratio's business, not the weight's
    loss.backward()
    close(new_logprobs.grad, [[0.0, -0.5 * 0.5 / 5, 0.0], [1.5 / 5, -2.0 * 3.0 / 5, 0.0]])
    # GRPO: the surrogate is weighted, the KL penalty is not
    new = f64([[-1.0, -1.0]])
    ref = f64([[-1.0 + math.log(0.5), -1.0 + math.log(2.0)]])
    mask = torch.tensor([[True, True]])
    plain, _ = grpo_loss(new, new, ref, f64([1.0]), mask, beta=0.04)
    weighted, _ = grpo_loss(new, new, ref, f64([1.0]), mask, beta=0.04, importance_weights=f64([[0.5, 2.0]]))
    close(plain, -1.0 + 0.01)  # rho = 1, A = 1: -1 per token; k3 mean 0.25 x beta
    close(weighted, -(0.5 + 2.0) / 2 + 0.01)


def test_ppo_policy_loss_asymmetric_clip_higher():
    # A = [+1, +1, −1], ρ = [1.5, 1.25, 0.5]
    new_logprobs, old_logprobs = log_of([[1.5, 1.25, 0.5]]), torch.zeros(1, 3, dtype=torch.float64)
    advantages, mask = f64([[1.0, 1.0, -1.0]]), torch.ones(1, 3, dtype=torch.bool)
    # clip [0.8, 1.28]: −1.28 (clipped), −1.25 (inside), 0.8 (clipped)
    loss, stats = ppo_policy_loss(new_logprobs, old_logprobs, advantages, mask, clip_low=0.2, clip_high=0.28)
    close(loss, (-1.28 - 1.25 + 0.8) / 3)  # −0.5767
    close(stats["clipfrac"], 2 / 3)
    # symmetric [0.8, 1.2]: −1.2, −1.2, 0.8, all clipped
    loss, stats = ppo_policy_loss(new_logprobs, old_logprobs, advantages, mask, clip_low=0.2, clip_high=0.2)
    close(loss, (-1.2 - 1.2 + 0.8) / 3)
    close(stats["clipfrac"], 1.0)


def test_ppo_policy_loss_computes_in_float32_for_bf16():
    new_logprobs = torch.tensor([[-1.0, -2.0]], dtype=torch.bfloat16)
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, _stats = ppo_policy_loss(new_logprobs, new_logprobs, torch.tensor([[1.0, 3.0]]), mask)
    assert loss.dtype == torch.float32
    close(loss, -(1.0 + 3.0) / 2)  # ρ = 1: loss = −mean(A)


# ---------------------------------------------------------------- PPO value loss
# V_old = 0, clip 0.2, returns R = [1, 1, −1, 0]; last column is padding
#   V=0.1:  V_clip=0.1;  (0.9)² = 0.81 both           -> 0.81
#   V=0.5:  V_clip=0.2;  (−0.5)² = 0.25, (−0.8)² = 0.64 -> 0.64 clipped
#   V=−0.5: V_clip=−0.2; (0.5)² = 0.25, (0.8)² = 0.64   -> 0.64 clipped
#   V=0.3:  V_clip=0.2;  0.09, 0.04                    -> 0.09
VALUE_NEW = f64([[0.1, 0.5, -0.5, 0.3, 100.0]])
VALUE_OLD = torch.zeros(1, 5, dtype=torch.float64)
VALUE_RETURNS = f64([[1.0, 1.0, -1.0, 0.0, -100.0]])
VALUE_MASK = torch.tensor([[True, True, True, True, False]])


def test_ppo_value_loss_with_clipping_active():
    new_values = VALUE_NEW.clone().requires_grad_()
    loss, stats = ppo_value_loss(new_values, VALUE_OLD, VALUE_RETURNS, VALUE_MASK, clip=0.2)
    close(loss, 0.5 * (0.81 + 0.64 + 0.64 + 0.09) / 4)  # 0.2725
    close(stats["clipfrac"], 2 / 4)
    close(stats["value_mean"], (0.1 + 0.5 - 0.5 + 0.3) / 4)  # 0.1
    assert_detached_scalars(stats, ["clipfrac", "value_mean"])
    # gradient ½·2(V − R)/4 on unclipped tokens, 0 where the clipped error won
    loss.backward()
    close(new_values.grad, [[(0.1 - 1) / 4, 0.0, 0.0, 0.3 / 4, 0.0]])


def test_ppo_value_loss_without_clipping_active():
    loss, stats = ppo_value_loss(VALUE_NEW, VALUE_OLD, VALUE_RETURNS, VALUE_MASK, clip=10.0)
    close(loss, 0.5 * (0.81 + 0.25 + 0.25 + 0.09) / 4)  # 0.175
    close(stats["clipfrac"], 0.0)


# ---------------------------------------------------------------- GRPO
# two completions of unequal length, old log-probs 0, new ln ρ, clip 0.2, no KL (β = 0, no reference)
#   seq 0: A = +1,   ρ = [1.0, 1.1, 1.5] -> [−1, −1.1, −1.2 (clipped)], mean −1.1
#   seq 1: A = −0.5, ρ = [0.9, 1.5]      -> [0.45, 0.75],                mean 0.6
GRPO_RATIOS = [[1.0, 1.1, 1.5, 7.0], [7.0, 0.9, 1.5, 7.0]]
GRPO_MASK = torch.tensor([[True, True, True, False], [False, True, True, False]])
GRPO_ADVANTAGES = f64([1.0, -0.5])


@pytest.mark.parametrize(
    "normalization, expected",
    [
        ("sequence", (-1.1 + 0.6) / 2),  # −0.25: each completion weighs the same
        ("token", (-1.0 - 1.1 - 1.2 + 0.45 + 0.75) / 5),  # −0.42: each token weighs the same
    ],
)
def test_grpo_loss_normalisations_without_kl(normalization, expected):
    old_logprobs = torch.zeros(2, 4, dtype=torch.float64)
    loss, stats = grpo_loss(
        log_of(GRPO_RATIOS), old_logprobs, None, GRPO_ADVANTAGES, GRPO_MASK, beta=0.0, normalization=normalization
    )
    close(loss, expected)
    close(stats["clipfrac"], 1 / 5)
    close(stats["ratio_mean"], (1.0 + 1.1 + 1.5 + 0.9 + 1.5) / 5)  # 1.2
    close(stats["kl"], 0.0)
    close(stats["approxkl"], 0.5 * (math.log(1.1) ** 2 + 2 * math.log(1.5) ** 2 + math.log(0.9) ** 2) / 5)
    assert_detached_scalars(stats, ["clipfrac", "approxkl", "kl", "ratio_mean"])
    assert set(GRPO_NORMALIZERS) == {"sequence", "token"}


def test_grpo_loss_k3_penalty_by_hand():
    # ρ = 1 and A = 0, so only β·k3 is left. π_ref/π = 0.5 and 2 on the two tokens:
    # k3 = 0.5 − 1 − ln 0.5 = ln 2 − 0.5 and 2 − 1 − ln 2 = 1 − ln 2; mean 0.25; × β = 0.04 -> 0.01
    new_logprobs = f64([[-1.0, -1.0, 3.0]]).requires_grad_()
    ref_logprobs = f64([[-1.0 + math.log(0.5), -1.0 + math.log(2.0), 0.0]])
    mask = torch.tensor([[True, True, False]])
    loss, stats = grpo_loss(new_logprobs, new_logprobs.detach(), ref_logprobs, f64([0.0]), mask, beta=0.04)
    close(loss, 0.01)
    close(stats["kl"], 0.25)
    # d k3 / d log π = 1 − π_ref/π: 0.5 and −1; × β / 2 tokens
    loss.backward()
    close(new_logprobs.grad, [[0.04 * 0.5 / 2, 0.04 * -1.0 / 2, 0.0]])


def test_grpo_loss_reports_kl_without_penalising_when_beta_is_zero():
    new_logprobs = f64([[-1.0, -1.0]])
    ref_logprobs = f64([[-1.0 + math.log(0.5), -1.0 + math.log(2.0)]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, stats = grpo_loss(new_logprobs, new_logprobs, ref_logprobs, f64([0.0]), mask, beta=0.0)
    close(loss, 0.0)
    close(stats["kl"], 0.25)


def test_gspo_one_ratio_per_response_by_hand():
    # Token ratios 2 and 0.5 (a padding token after them): GSPO's ratio is their geometric mean, exactly 1, so the
    # loss is -A = -1 while the per-token ratios would clip one of them. Each token's gradient is -A·s/|y| = -1/2.
    old_logprobs = f64([[math.log(0.25), math.log(0.4), 0.0]])
    new_logprobs = f64([[math.log(0.5), math.log(0.2), -9.0]]).requires_grad_()
    mask = torch.tensor([[True, True, False]])
    loss, stats = grpo_loss(new_logprobs, old_logprobs, None, f64([1.0]), mask, beta=0.0, ratio_level="sequence")
    close(loss, -1.0)
    close(stats["ratio_mean"], 1.0)
    close(stats["clipfrac"], 0.0)
    close(stats["approxkl"], 0.5 * math.log(2) ** 2)  # of the tokens' own ratios
    loss.backward()
    close(new_logprobs.grad, [[-0.5, -0.5, 0.0]])
    token_loss, _ = grpo_loss(new_logprobs.detach(), old_logprobs, None, f64([1.0]), mask, beta=0.0)
    close(token_loss, (-1.2 - 0.5) / 2)  # per token: ratio 2 clipped to 1.2, and 0.5


def test_gspo_clips_the_whole_response():
    # Both tokens' ratio 2: s = 2. A = +1: clipped to 1.2, no gradient; A = -1: max(2, 1.2) = 2, and
    # d(-A·s)/d log pi_t = s/|y| = 1 on each token.
    old_logprobs = f64([[math.log(0.2), math.log(0.3)]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    for advantage, expected_loss, expected_grad in ((1.0, -1.2, 0.0), (-1.0, 2.0, 1.0)):
        new_logprobs = (old_logprobs + math.log(2)).requires_grad_()
        loss, stats = grpo_loss(
            new_logprobs, old_logprobs, None, f64([advantage]), mask, beta=0.0, ratio_level="sequence"
        )
        close(loss, expected_loss)
        close(stats["clipfrac"], 1.0 if advantage > 0 else 0.0)
        loss.backward()
        close(new_logprobs.grad, [[expected_grad, expected_grad]])


def test_grpo_loss_errors():
    x, mask = torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        grpo_loss(x, x, None, torch.zeros(1), mask, beta=0.04)
    with pytest.raises(ValueError, match="normalization"):
        grpo_loss(x, x, x, torch.zeros(1), mask, normalization="dr_grpo")
    with pytest.raises(ValueError, match="ratio_level"):
        grpo_loss(x, x, x, torch.zeros(1), mask, ratio_level="response")
