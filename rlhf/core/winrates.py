"""Pairwise win-rate statistics: position-swap aggregation, win rate with a 95% interval and a
sign test, the length-controlled win rate with a bootstrap interval, Holm's adjustment for a family
of comparisons, and judge agreement. Pure functions, no model, no I/O.

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


def _tango_score(wins, losses, n, delta):
    """Numerator and standard deviation of Tango's score statistic at a hypothesised Δ0 = `delta`
    (see `win_rate_interval`): Z(Δ0) = numerator / sd. Arrays broadcast."""
    a = 2 * n
    b = -wins - losses + (2 * n - wins + losses) * delta
    c = -losses * delta * (1 - delta)
    root = np.sqrt(np.maximum(b * b - 4 * a * c, 0.0))
    # l̃ = (root - b) / 2a, written as -2c / (b + root) where b > 0 to avoid cancellation
    positive = b > 0
    loss_prob = np.where(positive, -2 * c / np.where(positive, b + root, 1.0), (root - b) / (2 * a))
    variance = n * (2 * loss_prob + delta * (1 - delta))
    return wins - losses - n * delta, np.sqrt(np.maximum(variance, 0.0))


def win_rate_interval(wins, losses, ties, z: float = Z_95, iters: int = 60):
    """Score interval for the win rate p = (W + T/2)/n of paired outcomes (Tango 1998, "Equivalence
    test and confidence interval for the difference in proportions for the paired-sample design",
    Stat. Med. 17:891; recommended by Fagerland, Lydersen & Laake 2014, Stat. Med. 33:2850).

    Each prompt is a win, loss or tie with probabilities (w, l, t), so p = w + t/2 = 1/2 + Δ/2 with
    Δ = w - l: the win rate is a shifted difference of paired proportions (the McNemar setting, wins
    and losses the discordant pairs, ties the concordant ones). The per-prompt score s ∈ {1, ½, 0}
    has variance (w + l - Δ²)/4, against the Bernoulli (1 - Δ²)/4 behind a Wilson interval on p:
    a quarter of it at 75% ties, hence intervals twice too wide. Tango's score statistic is

        Z(Δ0) = (W - L - nΔ0) / sqrt(n · (2·l̃ + Δ0(1 - Δ0))),
        l̃ = (sqrt(B² - 4AC) - B) / 2A,  A = 2n,  B = -W - L + (2n - W + L)·Δ0,  C = -L·Δ0(1 - Δ0),

    where l̃ is the maximum-likelihood loss probability given Δ = Δ0. The interval is the set
    {Δ0 : |Z(Δ0)| <= z}, found by bisection (Z decreases in Δ0), reported as 1/2 + Δ0/2.

    Why a score interval and not mean ± t·sd/√n: the variance is that of each hypothesised Δ0, not
    the observed one, so the interval never has zero width. All ties gives 1/2 ± z²/(2(n + z²)):
    no decisive prompt in n bounds the decisive rate at about z²/n (as Wilson's interval bounds a
    rate after 0 successes), so the width shrinks like 1/n, and it is still 0.49 wide at n = 4.
    With no ties it is exactly Wilson's interval (l̃ leaves no mass on ties), e.g. all wins gives
    [n/(n + z²), 1]. At Δ0 = 0, Z = (W - L)/sqrt(W + L) is McNemar's statistic, so the interval
    excludes 1/2 exactly when McNemar's test rejects at 5%: it agrees with `sign_test_p` up to the
    exact test's discreteness. Exact coverage (tests/test_winrates.py): 0.950 at n = 300 with
    (w, l, t) = (0.15, 0.10, 0.75) (Wilson: 0.9999), and at least 0.93 over (w, l) at n = 20 and 50.

    wins, losses, ties: counts, scalars or arrays of one shape (evaluations side by side).
    -> (low, high): floats for scalar counts, else arrays of that shape.
    """
    wins, losses, ties = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (wins, losses, ties)))
    n = wins + losses + ties
    if np.any(np.minimum(np.minimum(wins, losses), ties) < 0) or np.any(n <= 0):
        raise ValueError("win_rate_interval needs non-negative counts and at least one valid prompt")
    estimate = (wins - losses) / n
    # lower end: the smallest Δ0 in [-1, estimate] with Z(Δ0) <= z
    below, above = np.full_like(estimate, -1.0), estimate.copy()
    for _ in range(iters):
        mid = (below + above) / 2
        numerator, sd = _tango_score(wins, losses, n, mid)
        inside = numerator <= z * sd
        below, above = np.where(inside, below, mid), np.where(inside, mid, above)
    low = above
    # upper end: the largest Δ0 in [estimate, 1] with Z(Δ0) >= -z
    below, above = estimate.copy(), np.full_like(estimate, 1.0)
    for _ in range(iters):
        mid = (below + above) / 2
        numerator, sd = _tango_score(wins, losses, n, mid)
        inside = numerator >= -z * sd
        below, above = np.where(inside, mid, below), np.where(inside, above, mid)
    high = below
    low, high = 0.5 + low / 2, 0.5 + high / 2
    return (float(low), float(high)) if low.ndim == 0 else (low, high)


def sign_test_p(wins: int, losses: int) -> float:
    """Exact two-sided sign test of wins against losses, ties dropped (the exact McNemar test;
    Dixon & Mood 1946, "The statistical sign test", JASA 41:557):

        p = min(1, 2 · Σ_{k <= min(W, L)} C(W + L, k) / 2^(W + L))

    the chance, if each decisive prompt were a fair coin, of a split at least as uneven. p = 1 when
    W + L = 0 (nothing decisive to test). Exact integer arithmetic, so tiny p are not rounded to 0.
    """
    if wins < 0 or losses < 0:
        raise ValueError(f"wins and losses must be non-negative, got {wins} and {losses}")
    m, k = wins + losses, min(wins, losses)
    term, tail = 1, 0
    for i in range(k + 1):  # term = C(m, i)
        tail += term
        term = term * (m - i) // (i + 1)
    return min(1.0, 2 * tail / 2**m)


def wilson_interval(hits: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson's score interval for a proportion (Wilson 1927, "Probable inference, the law of succession, and
    statistical inference", JASA 22:209): with p = hits/n,

        (p + z²/2n ± z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)

    which stays inside [0, 1] and keeps its coverage near 0 and 1, where the Wald interval does not."""
    if n <= 0 or not 0 <= hits <= n:
        raise ValueError(f"wilson_interval needs 0 <= hits <= n and n > 0, got hits={hits}, n={n}")
    p = hits / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    scale = 1 + z * z / n
    return max(0.0, (centre - spread) / scale), min(1.0, (centre + spread) / scale)


def holm_adjust(p_values: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjusted p-values (Holm 1979, "A simple sequentially rejective multiple test
    procedure", Scand. J. Statist. 6:65). With the m p-values sorted, p_(1) <= ... <= p_(m):

        p̃_(i) = min(1, max_{j <= i} (m - j + 1) · p_(j))

    Rejecting every hypothesis with p̃ < α keeps the chance of any false rejection in the family
    at most α, whatever the dependence between the tests. Same keys, in the input's order.
    """
    order = sorted(p_values, key=lambda key: p_values[key])  # stable: equal p keep their order
    m, running, adjusted = len(order), 0.0, {}
    for rank, key in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[key]))
        adjusted[key] = running
    return {key: adjusted[key] for key in p_values}


def win_rate_summary(outcomes: Sequence[str]) -> dict:
    """Win/loss/tie rates of model A over the valid prompts, with a 95% interval on the win rate
    and a sign test of wins against losses.

    With W wins, L losses, T ties over n = W + L + T valid prompts (invalid ones are excluded
    from every rate and counted in n_invalid):

        win_rate = (W + T/2) / n   (ties count half, as in AlpacaEval)
        loss_rate = L / n,  tie_rate = T / n      so win_rate + loss_rate + tie_rate/2 = 1

    Keys:
      win_rate, loss_rate, tie_rate  the rates above
      wins, losses, ties, n          the counts W, L, T and n
      n_invalid                      prompts with no usable outcome, in no rate
      ci95_low, ci95_high            the 95% score interval of win_rate from the per-prompt
                                     outcomes (`win_rate_interval`, Tango 1998): it uses the real
                                     variance of tie-heavy outcomes, and never has zero width
      sign_test_p                    exact two-sided sign test of W vs L, ties dropped
                                     (`sign_test_p`); 1 when W + L = 0
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
        "sign_test_p": sign_test_p(wins, losses),
    }
    if n:
        low, high = win_rate_interval(wins, losses, ties)
        summary.update(
            win_rate=(wins + ties / 2) / n, loss_rate=losses / n, tie_rate=ties / n, ci95_low=low, ci95_high=high
        )
    return summary


def _fit_logistic(
    x: np.ndarray, y: np.ndarray, weights: np.ndarray, l2: float, iters: int = 100, tol: float = 1e-10
) -> np.ndarray:
    """Newton's method, for R fits side by side (the prompts weighted differently in each, e.g.
    bootstrap resamples), of

        min_w  -Σ_i c_ri [y_i log σ(w0 + w1·x_ri) + (1-y_i) log(1-σ(w0 + w1·x_ri))] + (l2/2)·w1²

    x: (R, n) feature; y: (n,) score; weights c: (R, n) (the number of times prompt i is in fit r).
    y may be fractional (0.5 for a tie: the same as one half-weighted win and one half-weighted
    loss). The objective is strictly convex for l2 > 0, and a backtracking line search keeps
    each step a descent step, so the iteration converges from w = 0, unless every y in a fit is
    0 or every y is 1 (then w0 runs off to infinity: the caller handles those fits).
    -> (R, 2): (w0, w1) per fit.
    """

    def loss(w: np.ndarray, rows: np.ndarray) -> np.ndarray:  # (len(rows),)
        z = w[:, :1] + w[:, 1:] * x[rows]  # (r, n)
        return np.sum(weights[rows] * (np.logaddexp(0.0, z) - y * z), axis=1) + 0.5 * l2 * w[:, 1] ** 2

    w = np.zeros((x.shape[0], 2))
    active = np.arange(x.shape[0])  # fits still moving by more than tol
    for _ in range(iters):
        xa, ca, wa = x[active], weights[active], w[active]
        p = 1.0 / (1.0 + np.exp(-(wa[:, :1] + wa[:, 1:] * xa)))  # (r, n)
        residual, curvature = ca * (p - y), ca * p * (1 - p)  # (r, n)
        g0, g1 = residual.sum(axis=1), (residual * xa).sum(axis=1) + l2 * wa[:, 1]  # (r,)
        h00 = curvature.sum(axis=1) + 1e-12
        h01 = (curvature * xa).sum(axis=1)
        h11 = (curvature * xa * xa).sum(axis=1) + l2 + 1e-12
        det = h00 * h11 - h01 * h01
        step = np.stack([(h11 * g0 - h01 * g1) / det, (h00 * g1 - h01 * g0) / det], axis=1)  # (r, 2): H⁻¹g
        # Backtracking (Armijo) on the fits whose full step is not already below tol, where
        # rounding in the loss would otherwise shrink a converged step for nothing.
        t = np.ones(len(active))
        search = np.flatnonzero(np.max(np.abs(step), axis=1) >= tol)
        current = loss(wa[search], active[search])
        decrease = (g0 * step[:, 0] + g1 * step[:, 1])[search]
        while search.size:
            trial = loss(wa[search] - t[search, None] * step[search], active[search])
            too_long = (trial > current - 1e-4 * t[search] * decrease) & (t[search] > 1e-8)
            t[search[too_long]] /= 2
            search, current, decrease = search[too_long], current[too_long], decrease[too_long]
        moved = t[:, None] * step  # (r, 2)
        w[active] = wa - moved
        active = active[np.max(np.abs(moved), axis=1) >= tol]
        if not active.size:
            break
    return w


def _length_feature(delta: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """tanh(Δ / std(Δ)) per fit, std over the prompts as weighted in that fit (ddof 0); 0 when the
    lengths do not vary. delta: (n,); weights: (R, n) -> (R, n)."""
    count = weights.sum(axis=1, keepdims=True)  # (R, 1)
    mean = (weights * delta).sum(axis=1, keepdims=True) / count
    std = np.sqrt((weights * (delta - mean) ** 2).sum(axis=1, keepdims=True) / count)  # (R, 1)
    return np.where(std > 0, np.tanh(delta / np.where(std > 0, std, 1.0)), 0.0)


def _lc_fits(y: np.ndarray, delta: np.ndarray, weights: np.ndarray, l2: float) -> np.ndarray:
    """The length-controlled win rate σ(b0) of R weighted fits -> (R,); a fit whose prompts all have
    score 0 or all score 1 has nothing to regress and gets that score."""
    mean = (weights * y).sum(axis=1) / weights.sum(axis=1)  # (R,)
    lc = mean.copy()
    fit = (mean > 0) & (mean < 1)
    if fit.any():
        b0 = _fit_logistic(_length_feature(delta, weights[fit]), y, weights[fit], l2)[:, 0]
        lc[fit] = 1.0 / (1.0 + np.exp(-b0))
    return lc


def length_controlled_win_rate(
    outcomes: Sequence[str],
    lengths_a: Sequence[float],
    lengths_b: Sequence[float],
    l2: float = 0.01,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict:
    """Win rate of model A predicted at zero length difference (Dubois et al. 2024, AlpacaEval-LC,
    arXiv 2404.04475), reduced to the pairwise case with no per-instruction terms, with a
    bootstrap 95% interval.

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
    Interval: percentile bootstrap over prompts (Efron & Tibshirani 1993, "An Introduction to the
        Bootstrap", ch. 13): `n_boot` resamples of the n valid prompts with replacement, drawn as
        `np.random.default_rng(seed).integers(0, n, size=(n_boot, n))`, each refitted from scratch
        (std(Δ) included; a resample whose scores are all 0 or all 1 gets that score), and the
        2.5% and 97.5% quantiles of the n_boot values (`np.quantile`, linear interpolation). The
        fixed seed makes it deterministic; the refits run side by side, ~0.2 s for n = 300.
        When every valid prompt has the same outcome, every resample repeats it and the bootstrap
        would claim certainty; the interval is then `win_rate_interval`'s, as lc equals the raw
        win rate there. Like any percentile bootstrap it is first-order accurate: it can be too
        narrow when only a handful of prompts are decisive. n_boot = 0 skips it (keys None).

    Keys: lc_win_rate, lc_ci95_low, lc_ci95_high, win_rate (raw, ties half), length_coef (b1),
    intercept (b0), n, n_invalid. lc_win_rate and its interval are None when n == 0; when every
    valid prompt has the same outcome, there is nothing to regress and lc_win_rate equals the raw
    win rate (0, 0.5 or 1).
    """
    _check(outcomes, "outcomes")
    if not len(outcomes) == len(lengths_a) == len(lengths_b):
        raise ValueError(f"got {len(outcomes)} outcomes, {len(lengths_a)} lengths_a and {len(lengths_b)} lengths_b")
    valid = [i for i, o in enumerate(outcomes) if o != "invalid"]
    y = np.array([_SCORE[outcomes[i]] for i in valid], dtype=float)  # (n,)
    delta = np.array([float(lengths_a[i]) - float(lengths_b[i]) for i in valid], dtype=float)  # (n,)
    n = len(valid)
    result = {
        "lc_win_rate": None,
        "lc_ci95_low": None,
        "lc_ci95_high": None,
        "win_rate": None,
        "length_coef": None,
        "intercept": None,
        "n": n,
        "n_invalid": len(outcomes) - n,
    }
    if not valid:
        return result
    raw = float(y.mean())
    result["win_rate"] = raw
    if np.all(y == y[0]):
        result.update(lc_win_rate=raw, length_coef=0.0)
        if n_boot:
            counts = {score: int(np.sum(y == score)) for score in (1.0, 0.0, 0.5)}
            result["lc_ci95_low"], result["lc_ci95_high"] = win_rate_interval(counts[1.0], counts[0.0], counts[0.5])
        return result
    b0, b1 = _fit_logistic(_length_feature(delta, np.ones((1, n))), y, np.ones((1, n)), l2)[0]
    result.update(lc_win_rate=float(1.0 / (1.0 + math.exp(-b0))), length_coef=float(b1), intercept=float(b0))
    if n_boot:
        rows = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))  # (n_boot, n) prompt indices
        flat = (np.arange(n_boot)[:, None] * n + rows).ravel()
        weights = np.bincount(flat, minlength=n_boot * n).reshape(n_boot, n).astype(float)  # (n_boot, n)
        low, high = np.quantile(_lc_fits(y, delta, weights, l2), [0.025, 0.975])
        result.update(lc_ci95_low=float(low), lc_ci95_high=float(high))
    return result


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


def judge_agreements(
    outcomes: dict[str, dict[str, Sequence[str]]], gold_differences: dict[str, Sequence[str | None]] | None = None
) -> dict[str, dict]:
    """`agreement` of every two judges that ran, over all pairings: outcomes[judge][pairing] are one judge's
    outcomes on a pairing's prompts, in the same prompt order for every judge; a judge that saw fewer prompts
    (the LLM judge sees a prefix) is compared on those. Keys `<a>_vs_<b>`, a and b in the order openai, reward,
    gold, then other judges by name (so gold, the exact judge, comes last: `reward_vs_gold`). Against gold, with
    `gold_differences[pairing]` (per prompt, what separates the two responses in gold; None for a gold tie),
    also `by_gold_difference` (`agreement_by_group`)."""
    ranked = [name for name in ("openai", "reward") if name in outcomes]
    ranked += sorted(set(outcomes) - {"openai", "reward", "gold"}) + (["gold"] if "gold" in outcomes else [])
    result = {}
    for i, judge_a in enumerate(ranked):
        for judge_b in ranked[i + 1 :]:
            flat_a, flat_b, groups = [], [], []
            for pairing, judged_a in outcomes[judge_a].items():
                judged_b = outcomes[judge_b].get(pairing, [])
                n = min(len(judged_a), len(judged_b))
                flat_a += judged_a[:n]
                flat_b += judged_b[:n]
                groups += list((gold_differences or {}).get(pairing, [None] * n))[:n]
            entry = agreement(flat_a, flat_b)
            if judge_b == "gold" and gold_differences is not None:
                entry["by_gold_difference"] = agreement_by_group(flat_a, flat_b, groups)
            result[f"{judge_a}_vs_{judge_b}"] = entry
    return result


def head_to_head(policy_scores: list[float], baseline_scores: list[float]) -> dict:
    """Per-prompt comparison by score: win when higher, tie when equal. `rlhf.core.winrates.win_rate_summary`
    of the outcomes: win_rate = (wins + ties/2) / n with its 95% paired score interval (ci95_low,
    ci95_high) and the exact sign test of wins vs losses (sign_test_p)."""
    outcomes = ["A" if a > b else "B" if a < b else "tie" for a, b in zip(policy_scores, baseline_scores)]
    return win_rate_summary(outcomes)
