"""Seed spread: how much a method's result moves with its seeds, and an interval for its mean over seeds that
also counts the prompts. `part4_eval/seeds.py` re-runs the alignment stages on one run's data, SFT policy and
reward model with K method seeds (or, with `--scope pipeline`, every stage with K seeds), each evaluated with its own
sampling seed, and calls `aggregate_seed_runs` here; each win rate also gets a p-value from the same standard error
(on at most K − 1 degrees of freedom when the seeds' variance is estimated at zero: `p_value_df`), Holm-adjusted over
its family (`add_holm`), and over all the comparisons as one family as a sensitivity check.

The design is crossed: every seed answers the SAME n evaluation prompts, so the outcomes of one comparison form a
K × n matrix Y (seed k, prompt j), and a prompt that is hard for a method is hard in every seed. The two-way
random-effects model with one observation per cell (Searle, Casella & McCulloch 1992, *Variance Components*,
§4.5, the 2-way crossed classification without interaction; Owen 2007, "The pigeonhole bootstrap", Ann. Appl.
Stat. 1(2), for the same decomposition without normality):

    Y_kj = μ + a_k + b_j + e_kj,    Var a = σ²_seed,  Var b = σ²_prompt,  Var e = σ²_resid (interaction + noise)

μ is the expected outcome over new seeds and new prompts of the task, and the grand mean Ȳ estimates it with

    Var(Ȳ) = σ²_seed / K  +  σ²_prompt / n  +  σ²_resid / (nK).

The spread of the K per-seed means estimates σ²_seed + σ²_resid/n only: b̄, the prompts' share, is common to
every seed, so an interval from the per-seed means alone leaves out σ²_prompt/n. With the ANOVA mean squares

    MS_seed   = n Σ_k (Ȳ_k. − Ȳ)² / (K − 1)                       E = σ²_resid + n σ²_seed
    MS_prompt = K Σ_j (Ȳ_.j − Ȳ)² / (n − 1)                       E = σ²_resid + K σ²_prompt
    MS_resid  = Σ_kj (Y_kj − Ȳ_k. − Ȳ_.j + Ȳ)² / ((K − 1)(n − 1))  E = σ²_resid

the unbiased estimate is V = (MS_seed + MS_prompt − MS_resid) / (nK). A component whose estimate is negative
(MS_seed < MS_resid, or MS_prompt < MS_resid) is set to zero, as usual: its mean square leaves V, and MS_resid's
coefficient rises by one. The interval is Ȳ ± t(0.975, ν) √V, with Satterthwaite's (1946, Biometrics Bulletin
2(6)) degrees of freedom for a linear combination Σ c_i MS_i of independent mean squares,
ν = (Σ c_i MS_i)² / Σ (c_i MS_i)² / df_i, df = K − 1, n − 1 and (K − 1)(n − 1): about K − 1 when seeds
dominate, hundreds when prompts do.

Chosen by simulation (2,000 synthetic 4 × 300 matrices of win / tie / loss against SFT, 75% ties, a uniform seed
effect on the win probability and a uniform prompt effect; tests/test_seeds.py has the first): coverage of the
95% interval, by seed effect U(±s) and prompt effect U(±p) on the win probability,

    s, p          this interval      per-seed means, t(3)   K·n outcomes as independent   two-way bootstrap*
    0.05, 0.45    0.958 (ν ≈ 10)     0.909                  0.872                         0.984
    0.15, 0.45    0.936 (ν ≈ 4)      0.940                  0.701                         0.960
    0.30, 0.10    0.942 (ν ≈ 3)      0.947                  0.454                         0.890

(*percentile interval of 400 resamples of seeds and prompts, independently; 500 matrices.) With K = 4 and the
seeds dominating, ν ≈ 3 and coverage is a little under 95% (uniform seed effects, and the zero truncation): an
interval from 4 seeds cannot do much better. The bootstrap over-covers when prompts dominate and under-covers
when seeds do (only 4⁴ seed resamples); the per-seed means miss the prompt term, the pooled outcomes the seeds.
Fewer seeds cover less where the seeds matter (s = 0.15 / 0.30: K = 2 0.876 / 0.853, K = 3 0.914 / 0.927,
K = 8 0.947 / 0.950), hence `FEW_SEEDS`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import combinations
from pathlib import Path
from statistics import NormalDist

import numpy as np

from rlhf import task
from rlhf.core.errors import UserError
from rlhf.core.winrates import holm_adjust
from rlhf.data import read_jsonl
from rlhf.judges import GoldJudge

LEVEL = 0.95
SCOPE_DIRS = {"methods": "seeds", "pipeline": "pipeline_seeds"}  # part4_eval/seeds.py's --scope: its folder in a run
FEW_SEEDS = 4  # below this many seeds the interval under-covers when seed variance dominates (measured above)


# ----------------------------------------------------------------------------- Student's t quantile


def _beta_continued_fraction(a: np.ndarray, b: np.ndarray, x: np.ndarray, max_terms: int = 2000) -> np.ndarray:
    """The continued fraction of the incomplete beta function, by the modified Lentz method (Numerical Recipes,
    3rd ed., §6.4, `betacf`); converges fast for x < (a + 1)/(a + b + 2)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = np.ones_like(x)
    d = 1.0 - qab * x / qap
    d = 1.0 / np.where(np.abs(d) < tiny, tiny, d)
    h = d
    for m in range(1, max_terms + 1):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / np.where(np.abs(d) < tiny, tiny, d)
            c = 1.0 + aa / c
            c = np.where(np.abs(c) < tiny, tiny, c)
            h = h * d * c
        if np.all(np.abs(d * c - 1.0) < 1e-15):
            break
    return h


def regularized_beta(a, b, x) -> np.ndarray:
    """I_x(a, b), the regularised incomplete beta function (elementwise; a, b > 0, 0 ≤ x ≤ 1)."""
    a, b, x = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (a, b, x)))
    inner = np.clip(x, 1e-300, 1.0 - 1e-16)
    lgamma = np.vectorize(math.lgamma, otypes=[float])
    log_front = lgamma(a + b) - lgamma(a) - lgamma(b) + a * np.log(inner) + b * np.log1p(-inner)
    front = np.exp(log_front)
    direct = inner < (a + 1.0) / (a + b + 2.0)
    # Each branch is evaluated where it converges; the other side through I_x(a, b) = 1 − I_{1−x}(b, a).
    result = np.where(
        direct,
        front * _beta_continued_fraction(a, b, np.where(direct, inner, 0.0)) / a,
        1.0 - front * _beta_continued_fraction(b, a, np.where(direct, 0.0, 1.0 - inner)) / b,
    )
    return np.where(x <= 0.0, 0.0, np.where(x >= 1.0, 1.0, result))


def student_t_quantile(p: float, df) -> np.ndarray:
    """The p-quantile (p > 0.5) of Student's t with `df` (> 0, any real; elementwise) degrees of freedom.

    For t ≥ 0, P(T > t) = I_w(df/2, 1/2) / 2 with w = df / (df + t²) (Abramowitz & Stegun §26.5 and §26.7),
    so the quantile solves I_w(df/2, 1/2) = 2(1 − p) for w, by bisection (I_w increases with w), and
    t = √(df (1 − w) / w). An infinite df gives the normal quantile.
    """
    if not 0.5 < p < 1.0:
        raise ValueError(f"p must be in (0.5, 1), got {p}")
    df = np.asarray(df, dtype=float)
    if np.any(~(df > 0)):
        raise ValueError("df must be positive")
    finite = np.isfinite(df)
    nu = np.where(finite, df, 1.0)
    target = 2.0 * (1.0 - p)
    low, high = np.zeros_like(nu), np.ones_like(nu)
    for _ in range(60):  # 2^-60: w to double precision
        mid = (low + high) / 2
        below = regularized_beta(nu / 2, 0.5, mid) < target
        low, high = np.where(below, mid, low), np.where(below, high, mid)
    w = (low + high) / 2
    return np.where(finite, np.sqrt(nu * (1.0 - w) / w), NormalDist().inv_cdf(p))


def student_t_two_sided_p(t, df) -> np.ndarray:
    """P(|T| ≥ |t|) for Student's t with `df` (> 0, any real; elementwise) degrees of freedom: I_w(df/2, 1/2)
    with w = df / (df + t²) (Abramowitz & Stegun §26.7.1, as `student_t_quantile`); an infinite df gives the
    normal's 2(1 − Φ(|t|))."""
    t, df = np.broadcast_arrays(np.asarray(t, dtype=float), np.asarray(df, dtype=float))
    if np.any(~(df > 0)):
        raise ValueError("df must be positive")
    finite = np.isfinite(df)
    nu = np.where(finite, df, 1.0)
    tail = regularized_beta(nu / 2, 0.5, nu / (nu + t**2))
    normal = np.vectorize(lambda z: 2 * (1 - NormalDist().cdf(abs(z))), otypes=[float])(t)
    return np.where(finite, tail, normal)


# ----------------------------------------------------------------------------- the crossed-design interval


def crossed_mean_squares(y: np.ndarray) -> dict[str, np.ndarray]:
    """The two-way ANOVA mean squares of outcome matrices y (..., K seeds, n prompts), one observation per cell:
    `seed`, `prompt` and `resid` (equations in the module docstring), each of shape (...)."""
    y = np.asarray(y, dtype=float)
    K, n = y.shape[-2:]
    if K < 2 or n < 2:
        raise ValueError(f"need at least 2 seeds and 2 prompts, got {K} x {n}")
    grand = y.mean(axis=(-2, -1))  # (...)
    seed_means = y.mean(axis=-1)  # (..., K)
    prompt_means = y.mean(axis=-2)  # (..., n)
    residuals = y - seed_means[..., :, None] - prompt_means[..., None, :] + grand[..., None, None]  # (..., K, n)
    return {
        "seed": n * ((seed_means - grand[..., None]) ** 2).sum(axis=-1) / (K - 1),
        "prompt": K * ((prompt_means - grand[..., None]) ** 2).sum(axis=-1) / (n - 1),
        "resid": (residuals**2).sum(axis=(-2, -1)) / ((K - 1) * (n - 1)),
    }


def crossed_mean_interval(y: np.ndarray, level: float = LEVEL) -> dict[str, np.ndarray]:
    """Ȳ and its interval for outcome matrices y (..., K, n): `mean`, `se` (√V), `df` (Satterthwaite), `low`,
    `high`, and the variance components `var_seed`, `var_prompt`, `var_resid` (zero-truncated ANOVA estimates),
    each of shape (...). A matrix whose cells are all equal has V = 0 and the interval [Ȳ, Ȳ] (df is inf)."""
    y = np.asarray(y, dtype=float)
    K, n = y.shape[-2:]
    ms = crossed_mean_squares(y)
    seed_on, prompt_on = ms["seed"] > ms["resid"], ms["prompt"] > ms["resid"]
    # V·nK = [MS_seed] + [MS_prompt] + c_resid·MS_resid, a truncated component dropping its term
    resid_coef = 1.0 - seed_on - prompt_on
    terms = (  # (c_i MS_i, df_i)
        (np.where(seed_on, ms["seed"], 0.0), K - 1),
        (np.where(prompt_on, ms["prompt"], 0.0), n - 1),
        (resid_coef * ms["resid"], (K - 1) * (n - 1)),
    )
    total = sum(term for term, _ in terms)  # V·nK
    spread = sum(term**2 / df for term, df in terms)
    with np.errstate(divide="ignore", invalid="ignore"):
        df = np.where(spread > 0, total**2 / spread, np.inf)
    se = np.sqrt(np.maximum(total, 0.0) / (n * K))
    quantile = student_t_quantile(0.5 + level / 2, df)
    mean = y.mean(axis=(-2, -1))
    return {
        "mean": mean,
        "se": se,
        "df": df,
        "low": mean - quantile * se,
        "high": mean + quantile * se,
        "var_seed": np.where(seed_on, (ms["seed"] - ms["resid"]) / n, 0.0),
        "var_prompt": np.where(prompt_on, (ms["prompt"] - ms["resid"]) / K, 0.0),
        "var_resid": ms["resid"],
    }


def seed_block(y: np.ndarray, bounds: tuple[float, float] | None = None) -> dict:
    """What summary.json says of one K × n outcome matrix: `mean`, `sd` (of the K per-seed means), `per_seed`,
    `ci95_low`, `ci95_high` (the crossed interval, clipped to `bounds` for a rate), `se`, `df`, `n_seeds`,
    `n_prompts` and the variance components."""
    y = np.asarray(y, dtype=float)
    if y.ndim != 2:
        raise ValueError(f"expected a seeds x prompts matrix, got shape {y.shape}")
    interval = {key: float(value) for key, value in crossed_mean_interval(y).items()}
    low, high = interval["low"], interval["high"]
    if bounds is not None:
        low, high = max(low, bounds[0]), min(high, bounds[1])
    per_seed = y.mean(axis=1)
    return {
        "mean": interval["mean"],
        "sd": float(per_seed.std(ddof=1)),
        "per_seed": [float(v) for v in per_seed],
        "ci95_low": low,
        "ci95_high": high,
        "se": interval["se"],
        "df": interval["df"],
        "n_seeds": int(y.shape[0]),
        "n_prompts": int(y.shape[1]),
        "variance": {name: interval[f"var_{name}"] for name in ("seed", "prompt", "resid")},
    }


def pairwise_outcomes(scores_a, scores_b, tolerance: float) -> np.ndarray:
    """A's outcome against B per cell: 1 when A scores higher by more than `tolerance`, 0 when lower, ½ a tie
    (the eval stage's judges: rlhf.judges `_verdict_from_scores`, win rate = (wins + ties/2) / n)."""
    diff = np.asarray(scores_a, dtype=float) - np.asarray(scores_b, dtype=float)
    if not np.all(np.isfinite(diff)):
        raise ValueError("non-finite scores; every response needs a finite score to be compared")
    return np.where(diff > tolerance, 1.0, np.where(diff < -tolerance, 0.0, 0.5))


def p_value_df(block: dict) -> float:
    """The degrees of freedom of a seed block's test: the interval's Satterthwaite df, but at most K − 1 when the
    seed component is estimated at zero. That estimate rests on K − 1 degrees of freedom (MS_seed against
    MS_resid), so a test that then borrows the residual's (K − 1)(n − 1), or the prompts' n − 1, claims a
    precision about the seeds that K seeds cannot show: PPO's four seeds on the tiny preset gave ν ≈ 897 and
    p ≈ 3e-27, where a t test on its four per-seed means gives p ≈ 0.001 (issue 51). The interval keeps the
    model's df, whose coverage is the one measured in the module docstring; the cap makes the test conservative.
    Its size at 0.05, simulated as the docstring's table (1,000 matrices of 4 × 300 at a true win rate of ½, by
    seed effect s and prompt effect p): s, p = 0.05, 0.45: 0.010 capped, 0.039 uncapped, 0.076 for the per-seed
    t test (which leaves the prompts' shared variance out); 0.15, 0.45: 0.037, 0.067, 0.063; 0.30, 0.10: 0.071,
    0.074, 0.070; 0, 0.45: 0.002, 0.032, 0.094."""
    df = block["df"]
    return df if block["variance"]["seed"] > 0 else min(df, block["n_seeds"] - 1)


def win_rate_block(outcomes: np.ndarray) -> dict:
    """`seed_block` of a matrix of 1 / ½ / 0 outcomes, with the share of ties and two two-sided tests of a win
    rate of ½: `p_value`, by the crossed standard error with `p_df` = `p_value_df` degrees of freedom,
    t = (Ȳ − ½) / SE (0 when Ȳ = ½; with SE = 0 and Ȳ ≠ ½, p = 0); and `p_per_seed`, the one-sample t test of the
    K per-seed win rates on K − 1 df, which ignores the prompts' shared variance (reported beside it: the test a
    reader would do with the per-seed column alone)."""
    block = {**seed_block(outcomes, bounds=(0.0, 1.0)), "tie_rate": float(np.mean(outcomes == 0.5))}
    block["p_df"] = p_value_df(block)
    block["p_value"] = two_sided_p(block["mean"] - 0.5, block["se"], block["p_df"])
    per_seed = np.asarray(block["per_seed"])
    per_seed_se = float(per_seed.std(ddof=1) / math.sqrt(len(per_seed)))
    block["p_per_seed"] = two_sided_p(float(per_seed.mean()) - 0.5, per_seed_se, len(per_seed) - 1)
    return block


def two_sided_p(gap: float, se: float, df: float) -> float:
    """P(|T| ≥ |gap / se|) on `df` degrees of freedom; with se = 0, 1 when gap = 0 and 0 otherwise."""
    if se > 0:
        return float(student_t_two_sided_p(gap / se, df))
    return 1.0 if gap == 0 else 0.0


def add_holm(blocks: dict[str, dict], key: str = "p_holm") -> None:
    """`key` in each block: its `p_value` Holm-adjusted over the blocks of one family (`holm_adjust`)."""
    for name, adjusted in holm_adjust({name: block["p_value"] for name, block in blocks.items()}).items():
        blocks[name][key] = adjusted


# ----------------------------------------------------------------------------- the seed runs' evaluations


def head_to_head_pairs(methods: Sequence[str]) -> list[tuple[str, str]]:
    """Every pair of methods, the later one first (each method against those listed before it), so that
    online_dpo_vs_dpo reads as online DPO's win rate over DPO."""
    return [(later, earlier) for earlier, later in combinations(methods, 2)]


def read_eval_responses(eval_dir: Path, models: Sequence[str]) -> dict[str, list[dict]]:
    """eval/responses/<model>.jsonl of one seed's run; a missing model is a one-line error."""
    responses = {}
    for model in models:
        path = Path(eval_dir) / "responses" / f"{model}.jsonl"
        if not path.is_file():
            raise UserError(
                f"{path} is missing: the eval stage of {Path(eval_dir).parent} did not evaluate '{model}'; "
                f"run that run's '{model}' and eval stages (or re-run part4_eval/seeds.py, which resumes)"
            )
        responses[model] = read_jsonl(path)
    return responses


def score_matrices(
    runs: Sequence[dict[str, list[dict]]], key: str, models: Sequence[str] | None = None
) -> tuple[list[str], dict[str, np.ndarray]]:
    """The prompts (the first run's sft order) and, per model (`models`, else every one), the K × n matrix of
    row[key]. Every run must have answered the same prompts with every model (eval takes the first
    eval.num_prompts test prompts, in order)."""
    prompts = [row["prompt"] for row in runs[0]["sft"]]
    matrices: dict[str, list[list[float]]] = {}
    for k, run in enumerate(runs):
        for model, rows in run.items():
            if models is not None and model not in models:
                continue
            by_prompt = {row["prompt"]: row for row in rows}
            if set(by_prompt) != set(prompts) or len(rows) != len(prompts):
                raise UserError(
                    f"seed run {k}: '{model}' answered {len(rows)} prompts, not the {len(prompts)} of the first "
                    "seed run's SFT; every seed run must evaluate the same prompts (the same data and eval.num_prompts)"
                )
            matrices.setdefault(model, []).append([float(by_prompt[p][key]) for p in prompts])
    return prompts, {model: np.asarray(rows) for model, rows in matrices.items()}


def summarize_seed_runs(runs: Sequence[dict[str, list[dict]]], methods: Sequence[str], reward_tolerance: float) -> dict:
    """The seeds summary from each seed run's eval responses (`runs[k][model]` = rows of eval/responses/<model>.jsonl,
    with `sft` and every method): per method, its win rate against the SAME run's SFT answers (gold judge on the
    embedded task, else the reward model, within `reward_tolerance` a tie, as eval's reward judge), gold score and
    gold good-rate (SFT's too), the answers' KL to SFT (`kl_to_ref`, where eval measured it), and every
    head-to-head; each a `seed_block` over seeds × prompts."""
    if len(runs) < 2:
        raise ValueError(f"need at least 2 seed runs, got {len(runs)}")
    gold = all("gold_score" in row for run in runs for rows in run.values() for row in rows)
    judge, tolerance = ("gold", GoldJudge.TOLERANCE) if gold else ("reward", reward_tolerance)
    prompts, scores = score_matrices(runs, "gold_score" if gold else "reward")
    summary = {
        "judge": judge,
        "judge_note": (
            "outcomes by the embedded task's gold score (equal scores tie)"
            if gold
            else f"no gold judge on this data: outcomes by the run's reward model (|difference| <= {tolerance} ties)"
        ),
        "n_seeds": len(runs),
        "n_prompts": len(prompts),
        "methods": list(methods),
        "win_rate_vs_sft": {m: win_rate_block(pairwise_outcomes(scores[m], scores["sft"], tolerance)) for m in methods},
        "head_to_head": {
            f"{a}_vs_{b}": win_rate_block(pairwise_outcomes(scores[a], scores[b], tolerance))
            for a, b in head_to_head_pairs(methods)
        },
    }
    # two families of claims, each Holm-adjusted on its own: "beats SFT" (one per method) and the head-to-heads,
    # fixed before the sealed run; and, as a sensitivity check, all of them as one family (`p_holm_all`)
    add_holm(summary["win_rate_vs_sft"])
    add_holm(summary["head_to_head"])
    every = {f"vs_sft/{name}": block for name, block in summary["win_rate_vs_sft"].items()}
    add_holm({**every, **{f"h2h/{name}": block for name, block in summary["head_to_head"].items()}}, "p_holm_all")
    kl_known = all(isinstance(row.get("kl"), (int, float)) for run in runs for m in methods for row in run[m])
    if kl_known:  # each answer's KL to its own seed's SFT (eval's kl_to_ref), over seeds × prompts
        kls = score_matrices(runs, "kl", methods)[1]
        summary["kl_to_ref"] = {m: seed_block(kls[m]) for m in methods}
    if gold:
        models = ["sft", *methods]
        summary["gold_score"] = {m: seed_block(scores[m]) for m in models}
        is_good = np.vectorize(task.is_good_score, otypes=[float])
        summary["gold_good_rate"] = {m: seed_block(is_good(scores[m]), bounds=(0.0, 1.0)) for m in models}
    return summary


def aggregate_seed_runs(eval_dirs: Sequence[Path], methods: Sequence[str], reward_tolerance: float = 0.0) -> dict:
    """`summarize_seed_runs` of the eval folders of K seed runs (the base run's first)."""
    return summarize_seed_runs(
        [read_eval_responses(eval_dir, ["sft", *methods]) for eval_dir in eval_dirs], methods, reward_tolerance
    )
