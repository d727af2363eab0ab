"""Response statistics, head-to-head counts, memory and loop costs of an RL stage."""

from __future__ import annotations

import resource

import torch
from torch import Tensor

from rlhf import task
from rlhf.ops import upcast
from rlhf.winrates import win_rate_summary


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


def head_to_head(policy_scores: list[float], baseline_scores: list[float]) -> dict:
    """Per-prompt comparison by score: win when higher, tie when equal. `rlhf.winrates.win_rate_summary`
    of the outcomes: win_rate = (wins + ties/2) / n with its 95% paired score interval (ci95_low,
    ci95_high) and the exact sign test of wins vs losses (sign_test_p)."""
    outcomes = ["A" if a > b else "B" if a < b else "tie" for a, b in zip(policy_scores, baseline_scores)]
    return win_rate_summary(outcomes)


def peak_memory_mb(device: torch.device) -> tuple[float, str]:
    """(peak MB, what it measures): CUDA max allocated on GPU, else the process's max RSS (Linux kB)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20, "cuda_max_memory_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "cpu_max_rss"


def state_memory_mb(modules: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer]) -> float:
    """MB held by the weights of every loaded role plus optimizer state: the part of memory that
    a critic adds or removes, independent of the interpreter's baseline (what max RSS mixes in)."""
    seen, total = set(), 0
    tensors = [p for m in modules for p in m.parameters()]
    tensors += [
        v for opt in optimizers for state in opt.state.values() for v in state.values() if isinstance(v, Tensor)
    ]
    for tensor in tensors:
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            total += tensor.numel() * tensor.element_size()
    return total / 2**20


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
    has zero advantages and teaches nothing (`rlhf.ops.group_advantages`), so a reward constant in most groups (a
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
