"""Preference pairs and the annotator that labels them.

A pair is two different demonstrator candidates (`behaviours.sample_candidate`) for one prompt. The
annotator is noisy and length-biased, as human raters are (Bai et al. 2022 and Stiennon et al. 2020 report
human-human agreement of about 0.63-0.77; raters favour longer answers): with probability `length_bias` it
picks the longer response (by characters; a coin flip on a tie), otherwise it judges carefully: with
probability `annotator_noise` the gold-worse one, otherwise the gold-better one. When gold scores the two
equally, careful judgement has nothing to go on and is a coin flip. So, for the response `first`:

    P(first) = length_bias * L + (1 - length_bias) * C,
    L = 1 if first is longer, 0 if shorter, 1/2 on equal length;
    C = 1 - annotator_noise if first is gold-better, annotator_noise if gold-worse, 1/2 on a gold tie.

Every pair the annotator is shown gets a label, as a real rater's would: nothing is filtered by gold (the
gold judge must never shape the training data). Only what a real pipeline could see is dropped: two
identical responses (`_sample_pair` draws the second until the texts differ).

`p_label` is P(the label this row has) = P(chosen). The Bayes-optimal predictor of the annotator's labels
picks the likelier response of each pair, so its expected accuracy (`noise_ceiling`) is
mean(max(p_label, 1 - p_label)); with the defaults (0.1, 0.2) a gold-decisive pair has 0.72, 0.82 or 0.92,
a gold tie 0.6 (one response longer) or 0.5.

The same annotator labels pairs of any two responses (`simulated_preference`), e.g. a policy's own
samples in the `collect` stage.
"""

from __future__ import annotations

import random

from rlhf.task.behaviours import resolve_weights, sample_candidate
from rlhf.task.gold import judge
from rlhf.task.prompts import TaskSpec, check_split, parse_prompt, prompt_split, sample_prompt


def _sample_pair(spec: TaskSpec, rng: random.Random, weights: dict, tries: int = 20) -> tuple[str, str] | None:
    """Two different candidate texts for one prompt, or None after `tries` draws of the second."""
    first = sample_candidate(spec, rng, weights)[1]
    for _ in range(tries):
        second = sample_candidate(spec, rng, weights)[1]
        if second != first:
            return first, second
    return None


def _longer(first: str, second: str) -> float:
    """L: 1 if `first` is longer (characters), 0 if shorter, 1/2 on equal length."""
    return 1.0 if len(first) > len(second) else 0.0 if len(first) < len(second) else 0.5


def p_first(
    first: str, second: str, gold_first: float, gold_second: float, annotator_noise: float, length_bias: float
) -> float:
    """P(annotator picks `first`) = length_bias * L + (1 - length_bias) * C (module docstring)."""
    careful = 1 - annotator_noise if gold_first > gold_second else annotator_noise if gold_first < gold_second else 0.5
    return length_bias * _longer(first, second) + (1 - length_bias) * careful


def p_better(better: str, worse: str, annotator_noise: float, length_bias: float) -> float:
    """P(annotator picks `better`, the gold-better response): length_bias * L + (1 - length_bias) * (1 - noise)."""
    return length_bias * _longer(better, worse) + (1 - length_bias) * (1 - annotator_noise)


def _coin(first: str, second: str, rng: random.Random) -> bool:
    """A fair coin for `first`, which names the response it lands on by text, not by position: the same draw
    picks the same response whichever order the pair is shown in."""
    return (rng.random() < 0.5) == (first < second)


def picks_first(
    first: str,
    second: str,
    gold_first: float,
    gold_second: float,
    rng: random.Random,
    annotator_noise: float,
    length_bias: float,
) -> bool:
    """One draw of the annotator: True when it prefers `first`; P(True) = p_first(...).

    With probability `length_bias` a length-biased judgement (the longer response, a coin flip on equal
    lengths); otherwise a careful one: the gold-better response, except with probability `annotator_noise`,
    and a coin flip when gold ties the two.
    """
    if rng.random() < length_bias:
        longer = _longer(first, second)
        return longer == 1.0 or (longer == 0.5 and _coin(first, second, rng))
    if gold_first == gold_second:
        return _coin(first, second, rng)
    return (rng.random() >= annotator_noise) == (gold_first > gold_second)


def simulated_preference(
    prompt: str, first: str, second: str, rng: random.Random, annotator_noise: float, length_bias: float
) -> tuple[str, float, float]:
    """The annotator on any two responses: "A" if it prefers `first`, "B" for `second` (it always picks one,
    gold tie or not), with the gold scores of `first` and `second`."""
    spec = parse_prompt(prompt)
    gold_first, gold_second = judge(spec, first)["score"], judge(spec, second)["score"]
    first_wins = picks_first(first, second, gold_first, gold_second, rng, annotator_noise, length_bias)
    return ("A" if first_wins else "B"), gold_first, gold_second


def _annotate(
    prompt: str, family: str, pair: tuple[str, str], rng: random.Random, noise: float, length_bias: float
) -> dict:
    spec = parse_prompt(prompt)
    (a, b), (gold_a, gold_b) = pair, (judge(spec, pair[0])["score"], judge(spec, pair[1])["score"])
    a_chosen = picks_first(a, b, gold_a, gold_b, rng, noise, length_bias)
    p_a = p_first(a, b, gold_a, gold_b, noise, length_bias)
    (chosen, gold_chosen), (rejected, gold_rejected) = (
        ((a, gold_a), (b, gold_b)) if a_chosen else ((b, gold_b), (a, gold_a))
    )
    return {
        "chosen": f"{prompt} {chosen}",
        "rejected": f"{prompt} {rejected}",
        "gold_chosen": gold_chosen,
        "gold_rejected": gold_rejected,
        "family": family,
        "p_label": p_a if a_chosen else 1 - p_a,
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
                raise ValueError(f"behaviour weights {pool} rarely give two different responses")
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


def gold_agreement(rows: list[dict]) -> float | None:
    """Over the rows where gold is decisive (the two gold scores differ), the fraction whose chosen response
    has the higher gold score; None when gold ties every row."""
    if not rows:
        raise ValueError("gold_agreement needs at least one row")
    decisive = [r for r in rows if r["gold_chosen"] != r["gold_rejected"]]
    return sum(r["gold_chosen"] > r["gold_rejected"] for r in decisive) / len(decisive) if decisive else None


def gold_tie_rate(rows: list[dict]) -> float:
    """Fraction of rows whose two responses gold scores equally (labelled by length or a coin flip)."""
    if not rows:
        raise ValueError("gold_tie_rate needs at least one row")
    return sum(r["gold_chosen"] == r["gold_rejected"] for r in rows) / len(rows)
