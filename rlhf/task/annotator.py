"""Preference pairs and the annotator that labels them.

A pair is two demonstrator candidates (`behaviours.sample_candidate`) for one prompt with different
gold scores. The annotator is noisy and length-biased, as human raters are (Bai et al. 2022 and
Stiennon et al. 2020 report human-human agreement of about 0.63-0.77; raters favour longer answers):
with probability `length_bias` it picks the longer response (by characters; a coin flip on a tie),
otherwise with probability `annotator_noise` the gold-worse one, otherwise the gold-better one:

    P(better) = length_bias * L + (1 - length_bias) * (1 - annotator_noise),
    L = 1 if the better response is longer, 0 if it is shorter, 1/2 on a tie.

`p_label` is P(the label this row has) = P(better) if chosen is gold-better, else 1 - P(better).
The Bayes-optimal predictor of the annotator's labels picks the likelier response of each pair,
so its expected accuracy (`noise_ceiling`) is mean over pairs of max(P(better), 1 - P(better)) =
mean(max(p_label, 1 - p_label)); with the defaults (0.1, 0.2) each pair has 0.72, 0.82 or 0.92.

The same annotator labels pairs of any two responses (`simulated_preference`), e.g. a policy's own
samples in the `collect` stage. Two responses of equal gold score are a tie: the dataset never pairs
them (`_sample_pair` draws until the scores differ), and the collected pairs follow the same rule.
"""

from __future__ import annotations

import random

from rlhf.task.behaviours import resolve_weights, sample_candidate
from rlhf.task.gold import judge
from rlhf.task.prompts import TaskSpec, check_split, parse_prompt, prompt_split, sample_prompt


def _sample_pair(
    spec: TaskSpec, rng: random.Random, weights: dict, tries: int = 20
) -> tuple[str, float, str, float] | None:
    """Two candidates with different gold scores, (text_a, gold_a, text_b, gold_b), or None after `tries`."""
    a = sample_candidate(spec, rng, weights)[1]
    gold_a = judge(spec, a)["score"]
    for _ in range(tries):
        b = sample_candidate(spec, rng, weights)[1]
        gold_b = judge(spec, b)["score"]
        if gold_b != gold_a:
            return a, gold_a, b, gold_b
    return None


def p_better(better: str, worse: str, annotator_noise: float, length_bias: float) -> float:
    """P(annotator picks `better`): length_bias * L + (1 - length_bias) * (1 - annotator_noise)."""
    longer = 1.0 if len(better) > len(worse) else 0.0 if len(better) < len(worse) else 0.5
    return length_bias * longer + (1 - length_bias) * (1 - annotator_noise)


def picks_better(better: str, worse: str, rng: random.Random, annotator_noise: float, length_bias: float) -> bool:
    """One draw of the annotator: True when it prefers `better` (the gold-better response).

    With probability `length_bias` a length-biased judgement (the longer response, a coin flip on
    equal lengths), otherwise a careful one, wrong with probability `annotator_noise`; so
    P(True) = p_better(better, worse, annotator_noise, length_bias).
    """
    if rng.random() < length_bias:
        return len(better) > len(worse) or (len(better) == len(worse) and rng.random() < 0.5)
    return rng.random() >= annotator_noise


def simulated_preference(
    prompt: str, first: str, second: str, rng: random.Random, annotator_noise: float, length_bias: float
) -> tuple[str, float, float]:
    """The annotator on any two responses: ("A" if it prefers `first`, "B" for `second`, "tie" when
    their gold scores are equal), with the gold scores of `first` and `second`."""
    spec = parse_prompt(prompt)
    gold_first, gold_second = judge(spec, first)["score"], judge(spec, second)["score"]
    if gold_first == gold_second:
        return "tie", gold_first, gold_second
    better, worse = (first, second) if gold_first > gold_second else (second, first)
    first_wins = picks_better(better, worse, rng, annotator_noise, length_bias) == (better is first)
    return ("A" if first_wins else "B"), gold_first, gold_second


def _annotate(prompt: str, family: str, pair: tuple, rng: random.Random, noise: float, length_bias: float) -> dict:
    a, gold_a, b, gold_b = pair
    (better, gold_better), (worse, gold_worse) = sorted(((a, gold_a), (b, gold_b)), key=lambda x: -x[1])
    chose_better = picks_better(better, worse, rng, noise, length_bias)
    p = p_better(better, worse, noise, length_bias)
    chosen, rejected = (better, gold_better), (worse, gold_worse)
    if not chose_better:
        chosen, rejected = rejected, chosen
    return {
        "chosen": f"{prompt} {chosen[0]}",
        "rejected": f"{prompt} {rejected[0]}",
        "gold_chosen": chosen[1],
        "gold_rejected": rejected[1],
        "family": family,
        "p_label": p if chose_better else 1 - p,
    }


def generate_split(
    split: str,
    n_pairs: int,
    seed: int,
    annotator_noise: float = 0.1,
    length_bias: float = 0.2,
    weights: dict | None = None,
) -> list[dict]:
    """`n_pairs` labelled HH rows whose prompts all hash to `split`; deterministic in all arguments.

    Rows: {"chosen", "rejected", "gold_chosen", "gold_rejected", "family", "p_label"}. Several rows
    may share a prompt. `weights` overrides entries of DEFAULT_BEHAVIOUR_WEIGHTS.
    """
    check_split(split)
    if n_pairs < 0:
        raise ValueError(f"n_pairs must be >= 0, got {n_pairs}")
    for name, value in (("annotator_noise", annotator_noise), ("length_bias", length_bias)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {value}")
    pool = resolve_weights(weights)
    rng = random.Random(f"pairs/{split}/{seed}")
    rows, failures = [], 0  # failures: prompts in a row without a valid pair
    while len(rows) < n_pairs:
        prompt = sample_prompt(rng)
        if prompt_split(prompt) != split:
            continue
        spec = parse_prompt(prompt)
        pair = _sample_pair(spec, rng, pool)
        if pair is None:
            failures += 1
            if failures > 1000:
                raise ValueError(f"behaviour weights {pool} rarely give two responses with different gold scores")
            continue
        failures = 0
        rows.append(_annotate(prompt, spec.family, pair, rng, annotator_noise, length_bias))
    return rows


def noise_ceiling(rows: list[dict]) -> float:
    """Accuracy of the Bayes-optimal predictor of the annotator's labels.

    With p = P(annotator picks the gold-better response | pair), the best any model can do on a
    pair is max(p, 1 - p); since p_label is p or 1 - p, this is mean(max(p_label, 1 - p_label)).
    """
    if not rows:
        raise ValueError("noise_ceiling needs at least one row")
    return sum(max(r["p_label"], 1 - r["p_label"]) for r in rows) / len(rows)


def gold_agreement(rows: list[dict]) -> float:
    """Fraction of rows whose chosen response has the higher gold score."""
    if not rows:
        raise ValueError("gold_agreement needs at least one row")
    return sum(r["gold_chosen"] > r["gold_rejected"] for r in rows) / len(rows)
