"""Response statistics, head-to-head counts and loop costs of an online stage."""

from __future__ import annotations

import torch
from torch import Tensor

from rlhf import task
from rlhf.core.ops import upcast
from rlhf.models.memory import peak_memory_mb, state_memory_mb


def pearson(x: Tensor, y: Tensor) -> float:
    """Pearson correlation of two (B,) tensors; 0 when either is constant."""
    x, y = upcast(x.double()), upcast(y.double())
    x, y = x - x.mean(), y - y.mean()
    denominator = (x.square().sum() * y.square().sum()).sqrt()
    return float((x * y).sum() / denominator) if denominator > 0 else 0.0


def response_metrics(
    response_lengths: Tensor, finished: Tensor, scores: Tensor, generate_s: float
) -> dict[str, Tensor]:
    """The responses/* metrics of a batch and time/tokens_per_s (glossary above).

    response_lengths: (B,) tokens, EOS included; finished: (B,) bool; scores: (B,); generate_s:
    wall seconds the batch took to generate.
    """
    lengths = response_lengths.float()
    return {
        "responses/length_mean": lengths.mean(),
        "responses/eos_rate": finished.float().mean(),
        "responses/unfinished": (~finished).float().sum(),
        "responses/length_score_corr": torch.tensor(pearson(lengths, scores)),
        "time/tokens_per_s": lengths.sum() / max(generate_s, 1e-9),
    }


def gold_scores(prompts: list[str], responses: list[str]) -> list[float]:
    return [task.gold_score(p, r) for p, r in zip(prompts, responses)]


def gold_metrics(prompts: list[str], responses: list[str]) -> dict[str, Tensor]:
    """The gold/* metrics of a batch on the embedded task: mean gold score and the share rated good
    (`task.is_good_score`)."""
    gold = torch.tensor(gold_scores(prompts, responses))
    return {"gold/score_mean": gold.mean(), "gold/good_rate": (gold >= task.GOOD_SCORE - 1e-9).float().mean()}


def loop_costs(
    loop_s: float,
    episodes: int,
    device: torch.device,
    modules: list[torch.nn.Module],
    optimizers: list[torch.optim.Optimizer],
) -> dict:
    """What the training loop cost, for the summary: wall ms per episode it trained (None when it
    trained none, e.g. resumed at its end), peak memory and what measured it, and `state_memory_mb`."""
    peak_mb, peak_source = peak_memory_mb(device)
    return {
        "time_per_sample_ms": 1000 * loop_s / episodes if episodes else None,
        "peak_memory_mb": peak_mb,
        "peak_memory_source": peak_source,
        "state_memory_mb": state_memory_mb(modules, optimizers),
    }


def flat_reward_warning(
    zero_std_shares: list[float], reward: str, group_size: int, window: int = 5, threshold: float = 0.5
) -> str | None:
    """GRPO's warning that its reward barely varies within a group, or None. A group whose G rewards are all equal
    has zero advantages and teaches nothing (`rlhf.core.ops.group_advantages`), so a reward constant in most groups (a
    custom function with few levels) trains on without signal. `zero_std_shares` holds `objective/zero_std_groups`
    of each iteration this run, in order: the warning comes once, when the `window`-th arrives and their mean
    exceeds `threshold`. A console message only: nothing the stage computes depends on it."""
    if len(zero_std_shares) != window or (mean := sum(zero_std_shares) / window) <= threshold:
        return None
    return (
        f"[grpo] warning: in the first {window} iterations, {mean:.0%} of groups gave all {group_size} samples the "
        f"same reward (grpo/objective/zero_std_groups), and such a group teaches nothing; make grpo.reward='{reward}' "
        "tell more of the responses apart, or raise grpo.group_size or grpo.temperature"
    )
