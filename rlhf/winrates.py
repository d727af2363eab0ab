"""Pairwise win-rate statistics: position-swap aggregation, win rate with a 95% interval,
the length-controlled win rate, and judge agreement. Pure functions, no model, no I/O.

Vocabulary
----------
A *verdict* is what a judge says about one presentation order of a pair: "A" (the response
shown first is better), "B" (the one shown second is), "tie", or "invalid" (no usable answer:
unparseable, or the request failed). An *outcome* is the per-prompt result of comparing model
A with model B, in the same four strings, where "A" now means *model A* wins.

An LLM judge sees each pair twice, A first and B first, to cancel position bias (Zheng et al.
2023, "Judging LLM-as-a-judge", arXiv 2306.05685, section 3.4). `outcome_from_verdicts`
combines the two; exact judges (gold, reward) are symmetric and give one verdict.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

VERDICTS = ("A", "B", "tie", "invalid")
OUTCOMES = VERDICTS
Z_95 = 1.959963984540054  # standard normal 97.5% quantile

_SCORE = {"A": 1.0, "tie": 0.5, "B": 0.0}  # model A's score for one outcome
_SWAP = {"A": "B", "B": "A", "tie": "tie", "invalid": "invalid"}


def _check(values: Sequence[str], what: str) -> None:
    bad = sorted({v for v in values if v not in VERDICTS}, key=str)
    if bad:
        raise ValueError(f"{what} must be one of {VERDICTS}, got {bad}")


def outcome_from_verdicts(verdict_ab: str, verdict_ba: str | None = None) -> str:
    """Combine the verdicts of the two presentation orders into model A's outcome on one prompt.

    verdict_ab: the verdict with model A shown first ("A" = model A better).
    verdict_ba: the verdict with model B shown first, in *position* terms ("A" = the first shown,
        i.e. model B, is better); None for a symmetric judge that gives one verdict.

    Each order gives model A a score in {1, 0.5, 0} (win, tie, loss); A wins iff the two scores
    sum to more than 1 (wins both orders, or wins one and ties the other), loses iff less than 1,
    and ties otherwise: two ties, or an inconsistent pair (each order prefers the response shown
    in the same position), which is pure position bias. An invalid verdict in either order makes
    the prompt invalid: it is never counted as a tie or a win.
    """
    _check([verdict_ab] + ([] if verdict_ba is None else [verdict_ba]), "verdicts")
    if verdict_ba is None:
        return verdict_ab
    if "invalid" in (verdict_ab, verdict_ba):
        return "invalid"
    total = _SCORE[verdict_ab] + _SCORE[_SWAP[verdict_ba]]
    return "A" if total > 1 else "B" if total < 1 else "tie"


def outcomes_from_verdicts(verdicts_ab: Sequence[str], verdicts_ba: Sequence[str] | None = None) -> list[str]:
    """`outcome_from_verdicts` over prompts; `verdicts_ba` None for a symmetric judge."""
    if verdicts_ba is None:
        return [outcome_from_verdicts(v) for v in verdicts_ab]
    if len(verdicts_ab) != len(verdicts_ba):
        raise ValueError(f"got {len(verdicts_ab)} A-first verdicts but {len(verdicts_ba)} B-first verdicts")
    return [outcome_from_verdicts(ab, ba) for ab, ba in zip(verdicts_ab, verdicts_ba)]


def swap_outcomes(outcomes: Sequence[str]) -> list[str]:
    """Outcomes of B vs A from those of A vs B."""
    _check(outcomes, "outcomes")
    return [_SWAP[o] for o in outcomes]


def wilson_interval(p: float, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval (Wilson 1927) for a proportion p observed on n trials.

    centre = (p + z²/2n) / (1 + z²/n),  half = z / (1 + z²/n) · sqrt(p(1-p)/n + z²/4n²)
    """
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(max(p * (1 - p), 0.0) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def win_rate_summary(outcomes: Sequence[str]) -> dict:
    """Win/loss/tie rates of model A over the valid prompts, with a 95% interval on the win rate.

    With W wins, L losses, T ties over n = W + L + T valid prompts (invalid ones are excluded
    from every rate and counted in n_invalid):

        win_rate = (W + T/2) / n   (ties count half, as in AlpacaEval)
        loss_rate = L / n,  tie_rate = T / n      so win_rate + loss_rate + tie_rate/2 = 1

    Interval: the Wilson score interval for win_rate with n trials. The per-prompt score s in
    {0, 0.5, 1} has variance E[s²] - p² <= p(1-p), with equality when there are no ties, so the
    Bernoulli variance behind Wilson is an upper bound (slightly conservative with ties). Unlike
    the normal (Wald) interval, it keeps non-zero width at win_rate 0 or 1 and stays in [0, 1].

    Keys: win_rate, loss_rate, tie_rate, wins, losses, ties, n, n_invalid, ci95_low, ci95_high.
    Rates and interval are None when n == 0.
    """
    _check(outcomes, "outcomes")
    wins, losses, ties = (sum(o == k for o in outcomes) for k in ("A", "B", "tie"))
    n = wins + losses + ties
    summary = {
        "win_rate": None,
        "loss_rate": None,
        "tie_rate": None,
        "wins": wins,
        "losses": losses,
        "ties": ties,
        "n": n,
        "n_invalid": len(outcomes) - n,
        "ci95_low": None,
        "ci95_high": None,
    }
    if n:
        win_rate = (wins + ties / 2) / n
        low, high = wilson_interval(win_rate, n)
        summary.update(win_rate=win_rate, loss_rate=losses / n, tie_rate=ties / n, ci95_low=low, ci95_high=high)
    return summary


def _fit_logistic(x: np.ndarray, y: np.ndarray, l2: float, iters: int = 100, tol: float = 1e-10) -> np.ndarray:
    """Newton's method for  min_w  -Σ[y log σ(Xw) + (1-y) log(1-σ(Xw))] + (l2/2)·w₁²,  X = [1, x].

    y may be fractional (0.5 for a tie: the same as one half-weighted win and one half-weighted
    loss). The objective is strictly convex for l2 > 0, and a backtracking line search keeps
    each step a descent step, so the iteration converges from w = 0.
    """
    X = np.stack([np.ones_like(x), x], axis=1)  # (n, 2)
    penalty = np.array([0.0, l2])  # the intercept is not shrunk: it carries the win rate

    def loss(w: np.ndarray) -> float:
        z = X @ w
        return float(np.sum(np.logaddexp(0.0, z) - y * z) + 0.5 * np.sum(penalty * w * w))

    w = np.zeros(2)
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-(X @ w)))  # (n,)
        grad = X.T @ (p - y) + penalty * w  # (2,)
        hess = (X * (p * (1 - p))[:, None]).T @ X + np.diag(penalty) + 1e-12 * np.eye(2)  # (2, 2)
        step = np.linalg.solve(hess, grad)
        t, current = 1.0, loss(w)
        while loss(w - t * step) > current - 1e-4 * t * float(grad @ step) and t > 1e-8:
            t /= 2
        w = w - t * step
        if float(np.max(np.abs(t * step))) < tol:
            break
    return w


def length_controlled_win_rate(
    outcomes: Sequence[str], lengths_a: Sequence[float], lengths_b: Sequence[float], l2: float = 0.01
) -> dict:
    """Win rate of model A predicted at zero length difference (Dubois et al. 2024, AlpacaEval-LC,
    arXiv 2404.04475), reduced to the pairwise case with no per-instruction terms.

    Over valid prompts, fit  P(A beats B) = σ(b0 + b1·tanh(Δ / std(Δ))),  Δ = len_A - len_B
    (AlpacaEval-LC's `np.tanh(std_delta_len)` feature), by maximum likelihood on the per-prompt
    score y in {1, 0.5, 0}: a tie counts as half a win and half a loss. The length-controlled
    win rate is σ(b0), the prediction at Δ = 0. With Δ unrelated to the outcomes b1 = 0 and it
    equals the raw win rate; when length explains the outcomes it moves toward 0.5.

    l2: ridge penalty on b1 only, i.e. a N(0, 1/l2) prior (default: sd 10 on the tanh scale,
        where |b1| of a few is already a strong length effect). It keeps b1 finite when length
        separates the outcomes perfectly (the unpenalised maximum then does not exist, and the
        boundary sits midway between the closest longer and shorter pairs, so lc -> ~0.5), and
        moves the estimate by well under 0.01 otherwise.
    Lengths: any unit (characters, tokens), the same for both models.

    Keys: lc_win_rate, win_rate (raw, ties half), length_coef (b1), intercept (b0), n, n_invalid.
    lc_win_rate is None when n == 0; when every valid prompt has the same outcome, there is
    nothing to regress and it equals the raw win rate (0, 0.5 or 1).
    """
    _check(outcomes, "outcomes")
    if not len(outcomes) == len(lengths_a) == len(lengths_b):
        raise ValueError(f"got {len(outcomes)} outcomes, {len(lengths_a)} lengths_a and {len(lengths_b)} lengths_b")
    valid = [i for i, o in enumerate(outcomes) if o != "invalid"]
    y = np.array([_SCORE[outcomes[i]] for i in valid], dtype=float)  # (n,)
    delta = np.array([float(lengths_a[i]) - float(lengths_b[i]) for i in valid], dtype=float)  # (n,)
    result = {
        "lc_win_rate": None,
        "win_rate": None,
        "length_coef": None,
        "intercept": None,
        "n": len(valid),
        "n_invalid": len(outcomes) - len(valid),
    }
    if not valid:
        return result
    raw = float(y.mean())
    result["win_rate"] = raw
    if np.all(y == y[0]):
        return {**result, "lc_win_rate": raw, "length_coef": 0.0}
    std = float(delta.std())
    x = np.tanh(delta / std) if std > 0 else np.zeros_like(delta)  # (n,)
    b0, b1 = _fit_logistic(x, y, l2)
    return {
        **result,
        "lc_win_rate": float(1.0 / (1.0 + math.exp(-b0))),
        "length_coef": float(b1),
        "intercept": float(b0),
    }


def agreement(outcomes_a: Sequence[str], outcomes_b: Sequence[str]) -> dict:
    """How often two judges give the same outcome on the same prompts (e.g. reward vs gold).

    Prompts where either judge is invalid are left out (counted in n_invalid).
      agreement           = same outcome / n, over the n prompts valid for both;
      agreement_decisive  = same outcome / n_decisive, over the prompts where neither judge
                            says tie (a reward model almost never ties exactly, a gold judge
                            often does, so this is the fairer number for reward vs gold).
    Keys: agreement, n, agreement_decisive, n_decisive, n_invalid; fractions None when empty.
    """
    _check(outcomes_a, "outcomes_a")
    _check(outcomes_b, "outcomes_b")
    if len(outcomes_a) != len(outcomes_b):
        raise ValueError(f"the judges scored different numbers of prompts: {len(outcomes_a)} vs {len(outcomes_b)}")
    pairs = [(a, b) for a, b in zip(outcomes_a, outcomes_b) if "invalid" not in (a, b)]
    decisive = [(a, b) for a, b in pairs if "tie" not in (a, b)]
    return {
        "agreement": sum(a == b for a, b in pairs) / len(pairs) if pairs else None,
        "n": len(pairs),
        "agreement_decisive": sum(a == b for a, b in decisive) / len(decisive) if decisive else None,
        "n_decisive": len(decisive),
        "n_invalid": len(outcomes_a) - len(pairs),
    }


def agreement_by_group(outcomes_a: Sequence[str], outcomes_b: Sequence[str], groups: Sequence[str | None]) -> dict:
    """`agreement` within each group of prompts: {group: agreement(...)} over the prompts labelled with it,
    in sorted group order; prompts labelled None are left out (e.g. pairs the gold judge ties)."""
    if not len(outcomes_a) == len(outcomes_b) == len(groups):
        raise ValueError(f"got {len(outcomes_a)} and {len(outcomes_b)} outcomes for {len(groups)} group labels")
    members: dict[str, list[int]] = {}
    for i, group in enumerate(groups):
        if group is not None:
            members.setdefault(group, []).append(i)
    return {
        group: agreement([outcomes_a[i] for i in rows], [outcomes_b[i] for i in rows])
        for group, rows in sorted(members.items())
    }
