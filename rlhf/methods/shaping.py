"""Rewards as the RL stages train on them: the missing-EOS penalty, per-token shaping, KL controllers."""

from __future__ import annotations

import torch
from torch import Tensor

from rlhf.core.ops import kl_k1, last_true_index, upcast
from rlhf.stage.schema import PPOConfig


def apply_missing_eos_penalty(scores: Tensor, finished: Tensor, penalty: float) -> Tensor:
    """score - penalty for responses that never produced EOS (Huang et al. 2024, the EOS trick).

    scores: (B,) float; finished: (B,) bool -> (B,).
    """
    return torch.where(finished, upcast(scores), upcast(scores) - penalty)


def shape_rewards(
    scores: Tensor, logprobs: Tensor, ref_logprobs: Tensor, response_mask: Tensor, kl_coef: float
) -> tuple[Tensor, Tensor]:
    """Per-token PPO rewards (Ziegler et al. 2019; Huang et al. 2024):

        r_t = -beta * (log pi(y_t) - log pi_ref(y_t))  at every response token,
        plus the sequence score at the last response token (the EOS of a finished response).

    scores: (B,); logprobs, ref_logprobs: (B, T); response_mask: (B, T) bool
    -> (rewards (B, T), kl (B, T)), both 0 outside the response; kl is the k1 estimate.
    """
    kl = torch.where(response_mask, kl_k1(logprobs, ref_logprobs), 0.0)  # (B, T)
    rewards = -kl_coef * kl  # (B, T)
    last = last_true_index(response_mask)  # (B,)
    rewards[torch.arange(rewards.shape[0], device=rewards.device), last] += upcast(scores).to(rewards.dtype)
    return rewards, kl


class FixedKLController:
    """A constant beta (Huang et al. 2024: 0.05)."""

    def __init__(self, kl_coef: float):
        self.value = kl_coef

    def update(self, current_kl: float, n_episodes: int) -> None:
        """A fixed beta ignores the measured KL (Huang et al. 2024 keep beta = 0.05 throughout)."""


class AdaptiveKLController:
    """Ziegler et al. 2019 (arXiv 1909.08593, section 2.2), the controller of lm-human-preferences:

        e = clip(KL / target - 1, -0.2, 0.2),    beta <- beta * (1 + e * n / horizon)

    KL: the batch's mean sequence KL in nats; n: episodes in the batch.
    """

    def __init__(self, kl_coef: float, target: float, horizon: int):
        self.value, self.target, self.horizon = kl_coef, target, horizon

    def update(self, current_kl: float, n_episodes: int) -> None:
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_episodes / self.horizon


def make_kl_controller(pcfg: PPOConfig) -> FixedKLController | AdaptiveKLController:
    if pcfg.kl_target is None:
        return FixedKLController(pcfg.kl_coef)
    return AdaptiveKLController(pcfg.kl_coef, pcfg.kl_target, pcfg.kl_horizon)
