"""Reward over-optimisation curves (Gao et al. 2022, "Scaling Laws for Reward Model
Overoptimization", arXiv 2210.10760): the math behind part4_eval/overoptimization.py.

Gao et al. plot the gold reward and the proxy (reward-model) reward of a policy against
d = sqrt(KL(pi || pi_init)), for RL checkpoints along training and for best-of-n sampling, whose KL
is known analytically: log n - (n - 1)/n. Optimising a proxy first raises both; past some KL the
gold score falls while the proxy keeps rising.

A *point* is one policy measured on the held-out prompts:
    {"kl": nats, "sqrt_kl": sqrt(max(kl, 0)), "proxy_score": mean RM score, "gold_score": mean gold score or None}
plus "iteration" and "episodes" for an RL checkpoint, or "n" for best-of-n. Pure functions, tested in
tests/test_overoptimization.py.
"""

from __future__ import annotations

import math

import torch

from rlhf.evaluation import best_of_n_choice, best_of_n_kl


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
