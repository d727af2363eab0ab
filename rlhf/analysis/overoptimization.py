"""Reward over-optimisation curves (Gao et al. 2022, "Scaling Laws for Reward Model
Overoptimization", arXiv 2210.10760): the math behind part4_eval/overoptimization.py.

Gao et al. plot the gold reward and the proxy (reward-model) reward of a policy against
d = sqrt(KL(pi || pi_init)), for RL checkpoints along training and for best-of-n sampling, whose KL
is known analytically: log n - (n - 1)/n. Optimising a proxy first raises both; past some KL the
gold score falls while the proxy keeps rising.

A *point* is one policy measured on the held-out prompts:
    {"kl": nats, "sqrt_kl": sqrt(max(kl, 0)), "proxy_score": mean RM score, "gold_score": mean gold score or None}
plus "iteration" and "episodes" for an RL checkpoint, "n" for best-of-n, or "beta" (and, with gold
scores, "gold_win_rate_vs_sft") for the KL-regularised optimum below. Pure functions, tested in
tests/test_overoptimization.py.

The KL-regularised optimum. PPO, GRPO and DPO all maximise E[r] - beta KL(pi || pi_ref), whose maximiser
is pi*(y|x) = pi_ref(y|x) exp(r(x, y) / beta) / Z(x) (Korbak et al. 2022, arXiv 2205.11275; Rafailov et al.
2023, arXiv 2305.18290, eq. 4). Over N samples y_1..y_N of pi_ref for one prompt, self-normalised
importance weights w_i = softmax(r_i / beta) give pi*'s expectations (E[g] ~ sum_i w_i g_i) and its KL
(KL ~ sum_i w_i log(N w_i), at most log N). So one set of samples shows the best any optimiser of that
objective could reach with reward r at each KL, and what it does to gold: the ceiling a reward sets,
apart from how well an optimiser approaches it.
"""

from __future__ import annotations

import math

import torch

from rlhf.analysis.evaluation import best_of_n_choice, best_of_n_kl


def sqrt_kl(kl: float) -> float:
    """Gao et al.'s distance d = sqrt(KL). A Monte Carlo KL estimate near 0 can come out slightly
    negative; it counts as 0."""
    return math.sqrt(max(kl, 0.0))


def best_of_n_points(proxy_scores: torch.Tensor, gold_scores: torch.Tensor | None, ns: list[int]) -> list[dict]:
    """Best-of-n from one set of samples: for each n, every prompt keeps the highest-proxy response
    among its first n samples (Gao et al. sec. 2.1, scoring with the proxy and reporting both).

    proxy_scores: (P, N) reward-model scores of N samples per prompt; gold_scores: (P, N) or None.
    -> one point per n (n <= N), with the analytic KL log n - (n - 1)/n.
    """
    P, N = proxy_scores.shape
    points = []
    for n in ns:
        if not 1 <= n <= N:
            raise ValueError(f"best-of-{n} needs 1 <= n <= {N} samples per prompt")
        picks = best_of_n_choice(proxy_scores, n)  # (P,)
        rows = torch.arange(P)
        kl = best_of_n_kl(n)
        points.append(
            {
                "n": n,
                "kl": kl,
                "sqrt_kl": sqrt_kl(kl),
                "proxy_score": proxy_scores[rows, picks].double().mean().item(),
                "gold_score": None if gold_scores is None else gold_scores[rows, picks].double().mean().item(),
            }
        )
    return points


def eval_points(rows: list[dict], stage: str, batch_size: int) -> list[dict]:
    """The held-out evaluations an RL stage logged (`<stage>/eval/*` rows of its metrics.jsonl: every
    `eval_every` iterations, before training, and the final one), in iteration order, as points."""
    points = []
    for row in rows:
        kl = row.get(f"{stage}/eval/kl_to_ref")
        if kl is None:
            continue
        points.append(
            {
                "iteration": row["step"],
                "episodes": row["step"] * batch_size,
                "kl": kl,
                "sqrt_kl": sqrt_kl(kl),
                "proxy_score": row[f"{stage}/eval/reward_mean"],
                "gold_score": row.get(f"{stage}/eval/gold_score_mean"),
            }
        )
    return sorted(points, key=lambda point: point["iteration"])


def eval_every_for(iterations: int, points: int) -> int:
    """Iterations between evaluations so that training gives at least `points` checkpoints after the
    start (as many as it has iterations, when fewer); the final evaluation is always one of them."""
    if iterations < 1 or points < 1:
        raise ValueError("iterations and points must be at least 1")
    return max(1, iterations // points)


def tilted_weights(scores: torch.Tensor, beta: float) -> torch.Tensor:
    """Self-normalised weights of pi* = pi_ref exp(r / beta) / Z over N samples of pi_ref per prompt.
    scores: (P, N) rewards r of the samples -> (P, N) weights, each row summing to 1."""
    return torch.softmax(scores.double() / beta, dim=1)


def tilted_kl(weights: torch.Tensor) -> float:
    """KL(pi* || pi_ref) from the weights, mean over prompts: sum_i w_i log(N w_i) (0 for uniform
    weights, log N for all weight on one sample). weights: (P, N)."""
    N = weights.shape[1]
    return torch.special.xlogy(weights, weights * N).sum(1).mean().item()


def tilted_win_rate(weights: torch.Tensor, gold_scores: torch.Tensor) -> float:
    """Gold win rate of pi* against pi_ref itself, ties half: sum_i w_i * mean_j [g_i > g_j] + [g_i = g_j] / 2,
    mean over prompts (0.5 for uniform weights). weights, gold_scores: (P, N)."""
    gold = gold_scores.double()
    beats = (gold[:, :, None] > gold[:, None, :]).double() + 0.5 * (gold[:, :, None] == gold[:, None, :]).double()
    return (weights[:, :, None] * beats).mean(2).sum(1).mean().item()  # beats: (P, N, N)


def kl_optimum_points(
    scores: torch.Tensor, proxy_scores: torch.Tensor, gold_scores: torch.Tensor | None, kls: list[float]
) -> list[dict]:
    """The KL-regularised optimum for reward `scores` at each KL budget in `kls`: beta found by bisection
    (KL falls monotonically as beta grows), then pi*'s proxy and gold scores (and gold win rate against
    pi_ref) from the weights. Budgets the samples cannot reach (the KL as beta -> 0) are left out.

    scores: (P, N) the reward pi* is tilted by (the reward model's scores, or gold); proxy_scores: (P, N)
    reward-model scores; gold_scores: (P, N) or None.
    """
    scores = scores.double()
    spread = scores.std().item() or 1.0
    lowest, highest = 1e-4 * spread, 1e4 * spread  # betas whose KLs bracket every reachable budget
    reachable = tilted_kl(tilted_weights(scores, lowest))
    points = []
    for target in kls:
        if not 0 < target < reachable:
            continue
        low, high = math.log(lowest), math.log(highest)
        for _ in range(60):  # bisection on log beta: 60 halvings of a ~18-wide interval
            middle = (low + high) / 2
            low, high = (
                (middle, high) if tilted_kl(tilted_weights(scores, math.exp(middle))) > target else (low, middle)
            )
        beta = math.exp((low + high) / 2)
        weights = tilted_weights(scores, beta)
        kl = tilted_kl(weights)
        points.append(
            {
                "beta": beta,
                "kl": kl,
                "sqrt_kl": sqrt_kl(kl),
                "proxy_score": (weights * proxy_scores.double()).sum(1).mean().item(),
                "gold_score": None if gold_scores is None else (weights * gold_scores.double()).sum(1).mean().item(),
                "gold_win_rate_vs_sft": None if gold_scores is None else tilted_win_rate(weights, gold_scores),
            }
        )
    return points
