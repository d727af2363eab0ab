"""Training losses. Each returns `(loss, stats)`: a scalar loss to backpropagate and a dict
of detached scalar tensors to log. Inputs are computed in float32 (see `rlhf.core.ops.upcast`).

Variants of one objective share a signature and are chosen from a table
(`DPO_LOSSES`, `GRPO_NORMALIZERS`), so a stage never branches on a loss name.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from rlhf.core.ops import kl_k3, masked_mean, upcast

Stats = dict[str, Tensor]


# ---------------------------------------------------------------- supervised and reward model


def sft_loss(token_logprobs: Tensor, response_mask: Tensor) -> tuple[Tensor, Stats]:
    """Token-level mean negative log-likelihood over all response tokens of the batch.

    token_logprobs: (B, T) log π(y_t | y_<t); response_mask: (B, T) bool.
    stats: nll.
    """
    loss = -masked_mean(token_logprobs, response_mask)
    return loss, {"nll": loss.detach()}


def bradley_terry_loss(
    chosen_rewards: Tensor, rejected_rewards: Tensor, margin: Tensor | float | None = None, label_smoothing: float = 0.0
) -> tuple[Tensor, Stats]:
    """Pairwise reward-model loss −log σ(z), z = r_c − r_r − m, mean over pairs.

    Bradley & Terry 1952; Ouyang et al. 2022 eq. 1; the margin m is Llama-2's
    (Touvron et al. 2023 eq. 2), larger for more clearly separated pairs. m = 0 when None.
    With label_smoothing ε, each label is taken to be flipped with probability ε:
    −(1 − ε) log σ(z) − ε log σ(−z), the noisy-label likelihood of conservative DPO (Mitchell 2023)
    applied to the reward model; its optimum is σ(z) = 1 − ε rather than z → ∞.
    chosen_rewards, rejected_rewards: (B,); margin: (B,) or a float.
    stats: accuracy (fraction with r_c > r_r), margin_mean (mean r_c − r_r), chosen_mean, rejected_mean.
    """
    chosen_rewards, rejected_rewards = upcast(chosen_rewards), upcast(rejected_rewards)
    reward_gap = chosen_rewards - rejected_rewards  # (B,)
    z = reward_gap - (0.0 if margin is None else margin)  # (B,)
    loss = (-(1.0 - label_smoothing) * F.logsigmoid(z) - label_smoothing * F.logsigmoid(-z)).mean()
    stats = {
        "accuracy": (reward_gap > 0).float().mean(),
        "margin_mean": reward_gap.mean(),
        "chosen_mean": chosen_rewards.mean(),
        "rejected_mean": rejected_rewards.mean(),
    }
    return loss, {k: v.detach() for k, v in stats.items()}


def length_heuristic_bt_loss(
    chosen_rewards: Tensor, rejected_rewards: Tensor, chosen_longer: Tensor, heuristic_weight: Tensor | float
) -> tuple[Tensor, Stats]:
    """Bradley–Terry for raters who sometimes just pick the longer response: −log P(label), mean over pairs,

        P(label) = w · ℓ + (1 − w) · σ(r_c − r_r),   ℓ = 1 if chosen is longer, 0 if shorter, 1/2 if equal.

    A mixture of two raters (a noisy-label likelihood, as cDPO's flips, with a length heuristic in place of a
    coin): with weight w the label says only which response is longer, and the reward explains the rest. A
    label that the heuristic explains (the longer one chosen) pulls r less, so the reward stops learning
    "longer is better" from it; with w = 0 this is `bradley_terry_loss`. Raters' length preference is
    documented by Singhal et al. 2023 and Dubois et al. 2024.
    chosen_rewards, rejected_rewards, chosen_longer: (B,); heuristic_weight: w in [0, 1), a float or a
    scalar tensor (learnable). stats: as `bradley_terry_loss`, plus heuristic_weight.
    """
    chosen_rewards, rejected_rewards = upcast(chosen_rewards), upcast(rejected_rewards)
    weight = torch.as_tensor(heuristic_weight, dtype=chosen_rewards.dtype, device=chosen_rewards.device)
    reward_gap = chosen_rewards - rejected_rewards  # (B,)
    longer = upcast(chosen_longer)  # (B,) ℓ
    careful = torch.log1p(-weight) + F.logsigmoid(reward_gap)  # log((1 − w) σ(r_c − r_r)): log P where ℓ = 0
    # Where ℓ > 0, P in linear space (float64, so σ underflows only past a gap of ~745), never through log w:
    # at w = 0 that would give the w-gradient 0 · ∞; here it is (ℓ − σ) / P, finite.
    sigma = torch.sigmoid(reward_gap.double())
    mixture = ((1 - weight.double()) * sigma + weight.double() * longer.double()).clamp_min(1e-300)
    log_p = torch.where(longer > 0, torch.log(mixture).to(careful.dtype), careful)  # (B,)
    loss = -log_p.mean()
    stats = {
        "accuracy": (reward_gap > 0).float().mean(),
        "margin_mean": reward_gap.mean(),
        "chosen_mean": chosen_rewards.mean(),
        "rejected_mean": rejected_rewards.mean(),
        "heuristic_weight": weight,
    }
    return loss, {k: v.detach() for k, v in stats.items()}


def logprob_distillation_loss(predicted: Tensor, target_logprobs: Tensor, mask: Tensor) -> Tensor:
    """Mean squared error between a head's per-token outputs and the SFT policy's per-token
    log-probs (standardised by the caller), over the columns in `mask`.

    An auxiliary loss for the reward model: regressing how likely the SFT policy finds each
    response token makes the reward model's hidden states carry that "surprise" (a wrong
    capital or sum is an unlikely token), which the reward head can then read. Related to the
    hidden-state regularisers of Yang et al. 2024 (GRM, arXiv 2406.10216), which keep an RM's
    features close to its language model's. predicted, target_logprobs: (B, T); mask: (B, T) bool.
    """
    return masked_mean((upcast(predicted) - upcast(target_logprobs)) ** 2, mask)


# ---------------------------------------------------------------- DPO family
# h = (log π(y_c) − log π_ref(y_c)) − (log π(y_r) − log π_ref(y_r)), per pair.
# All variants take (policy_chosen_logps, policy_rejected_logps, ref_chosen_logps,
# ref_rejected_logps, beta, label_smoothing), each logps tensor (B,), and return the mean
# over pairs with the same stats (TRL's names): the implicit reward is β·(log π − log π_ref)
#   rewards/chosen, rewards/rejected   batch means of the implicit rewards
#   rewards/margins                    mean of chosen − rejected implicit reward
#   rewards/accuracies                 fraction of pairs with chosen > rejected implicit reward
#   logps/chosen, logps/rejected       batch means of the policy logps as passed in


def _dpo_log_ratio_gap(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps):
    """h = chosen log-ratio − rejected log-ratio, plus the two log-ratios; all (B,)."""
    chosen_log_ratio = upcast(policy_chosen_logps) - upcast(ref_chosen_logps)  # (B,)
    rejected_log_ratio = upcast(policy_rejected_logps) - upcast(ref_rejected_logps)  # (B,)
    return chosen_log_ratio - rejected_log_ratio, chosen_log_ratio, rejected_log_ratio


def _dpo_stats(chosen_log_ratio, rejected_log_ratio, policy_chosen_logps, policy_rejected_logps, beta) -> Stats:
    chosen_rewards = beta * chosen_log_ratio.detach()  # (B,)
    rejected_rewards = beta * rejected_log_ratio.detach()  # (B,)
    return {
        "rewards/chosen": chosen_rewards.mean(),
        "rewards/rejected": rejected_rewards.mean(),
        "rewards/margins": (chosen_rewards - rejected_rewards).mean(),
        # a tie (e.g. the policy still equal to the reference) counts half, as chance: not as a wrong answer
        "rewards/accuracies": (
            (chosen_rewards > rejected_rewards).float() + 0.5 * (chosen_rewards == rejected_rewards).float()
        ).mean(),
        "logps/chosen": upcast(policy_chosen_logps).detach().mean(),
        "logps/rejected": upcast(policy_rejected_logps).detach().mean(),
    }


def _reject_label_smoothing(name: str, label_smoothing: float) -> None:
    if label_smoothing != 0.0:
        raise ValueError(
            f"{name}: label_smoothing={label_smoothing} is not used by this loss; "
            "set loss to 'cdpo' for label smoothing, or label_smoothing to 0"
        )


def dpo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float,
    label_smoothing: float = 0.0,
) -> tuple[Tensor, Stats]:
    """DPO: −log σ(β h) (Rafailov et al. 2023, arXiv 2305.18290, eq. 7). Sequence-summed logps.

    label_smoothing must be 0 here (use `cdpo_loss`); it is in the signature only so all
    variants can be called the same way.
    """
    _reject_label_smoothing("dpo_loss", label_smoothing)
    h, chosen_log_ratio, rejected_log_ratio = _dpo_log_ratio_gap(
        policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps
    )
    loss = -F.logsigmoid(beta * h).mean()
    return loss, _dpo_stats(chosen_log_ratio, rejected_log_ratio, policy_chosen_logps, policy_rejected_logps, beta)


def length_heuristic_dpo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float,
    chosen_longer: Tensor,
    heuristic_weight: float,
) -> tuple[Tensor, Stats]:
    """DPO for a rater who sometimes picks the longer response: −log(w ℓ + (1 − w) σ(β h)), i.e.
    `length_heuristic_bt_loss` on the implicit rewards β (log π − log π_ref), as `dpo_loss` is Bradley–Terry on
    them. Sequence-summed logps; chosen_longer (B,) is ℓ (`rlhf.core.batching.length_order`); w = 0 is `dpo_loss`.
    """
    _, chosen_log_ratio, rejected_log_ratio = _dpo_log_ratio_gap(
        policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps
    )
    loss, _ = length_heuristic_bt_loss(
        beta * chosen_log_ratio, beta * rejected_log_ratio, chosen_longer, heuristic_weight
    )
    return loss, _dpo_stats(chosen_log_ratio, rejected_log_ratio, policy_chosen_logps, policy_rejected_logps, beta)


def ipo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float,
    label_smoothing: float = 0.0,
) -> tuple[Tensor, Stats]:
    """IPO: (h − 1/(2β))² (Azar et al. 2023, arXiv 2310.12036, eq. 17; β plays their τ).

    Pass length-AVERAGED logps (`sequence_logps(..., average=True)`), as TRL does; see
    `DPO_AVERAGES_LOGPS`. label_smoothing must be 0.
    """
    _reject_label_smoothing("ipo_loss", label_smoothing)
    h, chosen_log_ratio, rejected_log_ratio = _dpo_log_ratio_gap(
        policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps
    )
    loss = ((h - 1 / (2 * beta)) ** 2).mean()
    return loss, _dpo_stats(chosen_log_ratio, rejected_log_ratio, policy_chosen_logps, policy_rejected_logps, beta)


def cdpo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float,
    label_smoothing: float = 0.0,
) -> tuple[Tensor, Stats]:
    """Conservative DPO: −(1−ε) log σ(β h) − ε log σ(−β h), ε = label_smoothing, the
    probability that a preference label is flipped (Mitchell 2023, "A note on DPO with noisy
    preferences"; TRL's sigmoid loss with label_smoothing). ε = 0 is plain DPO.
    """
    h, chosen_log_ratio, rejected_log_ratio = _dpo_log_ratio_gap(
        policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps
    )
    eps = label_smoothing
    loss = (-(1 - eps) * F.logsigmoid(beta * h) - eps * F.logsigmoid(-beta * h)).mean()
    return loss, _dpo_stats(chosen_log_ratio, rejected_log_ratio, policy_chosen_logps, policy_rejected_logps, beta)


def chosen_nll_loss(policy_chosen_logps: Tensor, chosen_tokens: Tensor) -> Tensor:
    """The chosen responses' negative log-likelihood per token, −mean_i log π(y_w,i | x_i) / |y_w,i|: the term
    that RPO adds to DPO with weight α (Pang et al. 2024, "Iterative Reasoning Preference Optimization", arXiv
    2404.19733, their DPO+NLL loss; TRL's `rpo_alpha`). It keeps the chosen responses likely while the DPO term
    widens the gap between the two, which DPO alone can do by making both less likely. Sequence-summed logps (B,)
    and each chosen response's token count (B,); pass counts of 1 for length-averaged logps (IPO)."""
    return -(upcast(policy_chosen_logps) / chosen_tokens.to(torch.float32)).mean()


DPO_LOSSES = {"sigmoid": dpo_loss, "ipo": ipo_loss, "cdpo": cdpo_loss}
# Whether the stage should pass length-averaged logps (sequence_logps(average=True)).
DPO_AVERAGES_LOGPS = {"sigmoid": False, "ipo": True, "cdpo": False}


# ---------------------------------------------------------------- PPO


def _clipped_surrogate(
    new_logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    clip_low: float,
    clip_high: float,
    importance_weights: Tensor | None = None,
    log_ratio: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-token max(−A·ρ, −A·clip(ρ, 1−clip_low, 1+clip_high)) (Schulman et al. 2017 eq. 7, as a loss),
    times `importance_weights` (B, T) when given (truncated importance sampling for samples drawn by another
    engine, `rlhf.core.ops.truncated_importance_weights`; Yao et al. 2025). `log_ratio` (B, T), when given,
    is log ρ in place of new − old (GSPO's one ratio per response, broadcast over its tokens).

    Returns (per_token_loss, ratio, clipped_chosen, log_ratio), each (B, T); clipped_chosen is
    True where the clipped term was strictly larger, i.e. where the token gets no gradient.
    old_logprobs, advantages and the weights are constants of the surrogate and are detached.
    """
    if log_ratio is None:
        log_ratio = upcast(new_logprobs) - upcast(old_logprobs).detach()  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T)
    advantages = upcast(advantages).detach()
    unclipped = -advantages * ratio  # (B, T)
    clipped = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)  # (B, T)
    per_token_loss = torch.maximum(unclipped, clipped)  # (B, T)
    if importance_weights is not None:
        per_token_loss = per_token_loss * upcast(importance_weights).detach()
    return per_token_loss, ratio, clipped > unclipped, log_ratio


def ppo_policy_loss(
    new_logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    importance_weights: Tensor | None = None,
) -> tuple[Tensor, Stats]:
    """PPO clipped surrogate (Schulman et al. 2017 eq. 7), negated to a loss and averaged
    over all response tokens of the batch (Huang et al. 2024); each token's term times
    `importance_weights` (B, T) when given (truncated importance sampling, `_clipped_surrogate`).

    The ratio ρ = π_new/π_old is clipped to [1 − clip_low, 1 + clip_high]; clip_high >
    clip_low is DAPO's "clip-higher" (arXiv 2503.14476).
    new_logprobs, old_logprobs, advantages: (B, T); response_mask: (B, T) bool.
    stats (token means over the response):
      approxkl   ½·mean((log π_new − log π_old)²), as in Huang et al. 2024 code
      clipfrac   fraction of tokens where the clipped term was strictly larger
      ratio_mean mean ρ
    """
    per_token_loss, ratio, clipped_chosen, log_ratio = _clipped_surrogate(
        new_logprobs, old_logprobs, advantages, clip_low, clip_high, importance_weights
    )
    loss = masked_mean(per_token_loss, response_mask)
    stats = {
        "approxkl": 0.5 * masked_mean(log_ratio.detach() ** 2, response_mask),
        "clipfrac": masked_mean(clipped_chosen.float(), response_mask),
        "ratio_mean": masked_mean(ratio.detach(), response_mask),
    }
    return loss, stats


def ppo_value_loss(
    new_values: Tensor, old_values: Tensor, returns: Tensor, response_mask: Tensor, clip: float = 0.2
) -> tuple[Tensor, Stats]:
    """Clipped value loss ½·mean(max((V − R)², (V_clip − R)²)), V_clip = V_old + clamp(V − V_old, ±clip)
    (Huang et al. 2024 code; the value-clipping detail of Engstrom et al. 2020).

    new_values, old_values, returns: (B, T); response_mask: (B, T) bool. old_values and returns are detached.
    stats: clipfrac (fraction of tokens where the clipped error was strictly larger), value_mean (mean V).
    """
    new_values = upcast(new_values)
    old_values, returns = upcast(old_values).detach(), upcast(returns).detach()
    clipped_values = old_values + torch.clamp(new_values - old_values, -clip, clip)  # (B, T)
    unclipped_error = (new_values - returns) ** 2  # (B, T)
    clipped_error = (clipped_values - returns) ** 2  # (B, T)
    loss = 0.5 * masked_mean(torch.maximum(unclipped_error, clipped_error), response_mask)
    stats = {
        "clipfrac": masked_mean((clipped_error > unclipped_error).float(), response_mask),
        "value_mean": masked_mean(new_values.detach(), response_mask),
    }
    return loss, stats


# ---------------------------------------------------------------- GRPO
# How per-token losses (B, T) become one scalar.
#   "sequence": mean over each sequence's tokens (1/|o_i|), then mean over sequences
#               (DeepSeekMath eq. 3). Long sequences weigh less per token.
#   "token":    sum over all response tokens / their total count (DAPO, arXiv 2503.14476).
# Dr. GRPO (arXiv 2503.20783) instead divides the sum by a constant (e.g. B × max generation
# length) so the scale does not depend on the batch's lengths; not in this table.


def _sequence_mean_then_batch_mean(per_token_loss: Tensor, response_mask: Tensor) -> Tensor:
    return masked_mean(per_token_loss, response_mask, dim=-1).mean()


GRPO_NORMALIZERS = {"sequence": _sequence_mean_then_batch_mean, "token": masked_mean}
GRPO_RATIO_LEVELS = ("token", "sequence")


def sequence_log_ratio(new_logprobs: Tensor, old_logprobs: Tensor, response_mask: Tensor) -> Tensor:
    """GSPO's importance ratio in log space, one per response, on each of its tokens (Zheng et al. 2025,
    arXiv 2507.18071, eq. 7): log s_i = (1/|y_i|) Σ_t log(π_new(y_i,t)/π_old(y_i,t)), the log of the geometric mean
    of the tokens' ratios. (B, T) each -> (B, T); the gradient reaches every token of the response through the mean.
    """
    token_log_ratio = upcast(new_logprobs) - upcast(old_logprobs).detach()  # (B, T)
    per_response = masked_mean(token_log_ratio, response_mask, dim=-1)  # (B,)
    return per_response[:, None].expand_as(token_log_ratio)  # (B, T)


def grpo_loss(
    new_logprobs: Tensor,
    old_logprobs: Tensor,
    ref_logprobs: Tensor | None,
    advantages: Tensor,
    response_mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    beta: float = 0.04,
    normalization: str = "sequence",
    importance_weights: Tensor | None = None,
    ratio_level: str = "token",
) -> tuple[Tensor, Stats]:
    """GRPO loss (DeepSeekMath, arXiv 2402.03300, eq. 3), per token:

        max(−A·ρ, −A·clip(ρ, 1−clip_low, 1+clip_high)) + β·k3(π_new, π_ref)

    reduced by GRPO_NORMALIZERS[normalization]. k3 is `rlhf.core.ops.kl_k3` (their eq. 4).
    ratio_level="token": ρ per token; "sequence": ρ is GSPO's per-response ratio (`sequence_log_ratio`), clipped
    whole, so with normalization="sequence" the loss is GSPO's objective (Zheng et al. 2025, eq. 5) plus the KL. With
    `importance_weights` (B, T) the surrogate term (not the KL) is weighted per token (`_clipped_surrogate`).
    new_logprobs, old_logprobs, ref_logprobs: (B, T); advantages: (B,), one per completion,
    broadcast over its tokens; response_mask: (B, T) bool.
    ref_logprobs may be None only when beta == 0 (no KL term, DAPO).
    stats (token means over the response): approxkl (as in `ppo_policy_loss`, of the tokens' own ratios at either
    ratio_level); clipfrac and ratio_mean, of the ratio the loss uses; kl (mean k3; 0 when ref_logprobs is None;
    still measured, but not in the loss, when beta == 0 and ref_logprobs is given).
    """
    if ref_logprobs is None and beta != 0:
        raise ValueError(f"grpo_loss: beta={beta} needs ref_logprobs; pass them or set beta to 0")
    if normalization not in GRPO_NORMALIZERS:
        raise ValueError(f"grpo_loss: normalization={normalization!r}; choose one of {sorted(GRPO_NORMALIZERS)}")
    if ratio_level not in GRPO_RATIO_LEVELS:
        raise ValueError(f"grpo_loss: ratio_level={ratio_level!r}; choose one of {GRPO_RATIO_LEVELS}")
    sequence_ratio = ratio_level == "sequence"
    per_token_loss, ratio, clipped_chosen, _ = _clipped_surrogate(
        new_logprobs,
        old_logprobs,
        advantages[:, None],
        clip_low,
        clip_high,
        importance_weights,
        sequence_log_ratio(new_logprobs, old_logprobs, response_mask) if sequence_ratio else None,
    )  # (B, T) each
    kl = torch.zeros_like(per_token_loss) if ref_logprobs is None else kl_k3(new_logprobs, ref_logprobs)  # (B, T)
    loss = GRPO_NORMALIZERS[normalization](per_token_loss + beta * kl, response_mask)
    stats = {
        "clipfrac": masked_mean(clipped_chosen.float(), response_mask),
        "approxkl": 0.5 * masked_mean((upcast(new_logprobs) - upcast(old_logprobs)).detach() ** 2, response_mask),
        "kl": masked_mean(kl.detach(), response_mask),
        "ratio_mean": masked_mean(ratio.detach(), response_mask),
    }
    return loss, stats
