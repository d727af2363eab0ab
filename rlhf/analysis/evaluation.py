"""Evaluation math: diversity, best-of-N, ROUGE-L, win-rate pairings, and the summary statistics every model gets.

Pure functions over lists and tensors, tested by hand in tests/test_evaluation.py.
"""

from __future__ import annotations

import math
import statistics

import torch

from rlhf.core.ops import kl_k1, masked_sum


def distinct_n(token_lists: list[list[int]], n: int) -> float:
    """Share of distinct n-grams among all n-grams of all responses (Li et al. 2016, "distinct-n").

    1.0 means no n-gram repeats anywhere; a model that says the same thing to every prompt scores low.
    """
    grams = [tuple(tokens[i : i + n]) for tokens in token_lists for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def repetition_within(token_lists: list[list[int]], n: int = 4) -> float:
    """Mean over responses of seq-rep-n = 1 - distinct n-grams / n-grams within the one response (Welleck et al.
    2020, "Neural Text Generation with Unlikelihood Training", ICLR, §5): 0 when no n-gram of an answer repeats,
    near 1 for an answer that loops. A response shorter than n counts 0; no responses, 0.0."""
    rates = []
    for tokens in token_lists:
        grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
        rates.append(1 - len(set(grams)) / len(grams) if grams else 0.0)
    return sum(rates) / len(rates) if rates else 0.0


# A model is flagged degenerate against SFT when its answers loop (within-answer repetition at least twice SFT's and
# over 0.2) or say the same things across prompts (distinct-2 under 3/4 of SFT's). Fixed heuristics, the same for
# every run, shown with their numbers wherever a flagged model's win rate is.
DEGENERATE_REPETITION, DEGENERATE_DISTINCT_RATIO = 0.2, 0.75


def degeneration_reasons(metrics: dict, sft_metrics: dict) -> list[str]:
    """Why a model's answers look degenerate next to SFT's (empty: they do not), from `repetition_4` and
    `distinct_2` of each."""
    reasons = []
    rep, sft_rep = metrics.get("repetition_4"), sft_metrics.get("repetition_4")
    if rep is not None and sft_rep is not None and rep > DEGENERATE_REPETITION and rep >= 2 * sft_rep:
        reasons.append(f"within-answer repetition {rep:.2f} against SFT's {sft_rep:.2f}")
    d2, sft_d2 = metrics.get("distinct_2"), sft_metrics.get("distinct_2")
    if d2 is not None and sft_d2 and d2 < DEGENERATE_DISTINCT_RATIO * sft_d2:
        reasons.append(f"distinct-2 {d2:.2f} against SFT's {sft_d2:.2f}")
    return reasons


def sequence_kl(policy_logprobs: torch.Tensor, ref_logprobs: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Monte Carlo KL(pi || pi_ref) per sampled response: sum over its tokens of log pi - log pi_ref.

    Unbiased for the sequence-level KL when the responses were sampled from pi. (B, T) x 2 -> (B,)
    """
    return masked_sum(kl_k1(policy_logprobs, ref_logprobs), response_mask, dim=-1)


def best_of_n_kl(n: int) -> float:
    """Analytic KL of best-of-n sampling from its base policy: log n - (n - 1)/n
    (Stiennon et al. 2020, appendix; Gao et al. 2022, arXiv 2210.10760, sec. 2)."""
    return math.log(n) - (n - 1) / n


def best_of_n_choice(scores: torch.Tensor, n: int) -> torch.Tensor:
    """Index of the highest-scoring sample among the first n of each prompt: (P, N) -> (P,)."""
    return scores[:, :n].argmax(dim=-1)


def mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), statistics.pstdev(values)


def rouge_l(predictions: list[str], references: list[str]) -> float:
    """Mean ROUGE-L F-measure (Lin 2004) of each prediction against its reference, `rouge_score`'s
    tokenizer without stemming: F = 2PR/(P + R) with P = LCS/|prediction|, R = LCS/|reference| in words.
    Huang et al. 2024 report SFT ROUGE-L on TL;DR (0.247 at Pythia 1B, external)."""
    from rouge_score import rouge_scorer

    if len(predictions) != len(references) or not predictions:
        raise ValueError(f"need as many predictions as references, at least one: {len(predictions)}, {len(references)}")
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)
    return statistics.fmean(scorer.score(ref, pred)["rougeL"].fmeasure for pred, ref in zip(predictions, references))


def win_rate_pairings(models: list[str], baseline: str, reference: str) -> list[tuple[str, str]]:
    """The (a, b) pairs the eval stage judges, a first. `models` starts with "sft"; `reference` names the
    dataset's responses. baseline "sft": every other model vs sft, every pair of the others, and every model vs
    the reference. baseline "reference": every model vs the reference only, as Huang et al. 2024 report win
    rates against the reference summaries."""
    if baseline == "reference":
        return [(name, reference) for name in models]
    others = [name for name in models if name != "sft"]
    pairings = [(name, "sft") for name in others]
    pairings += [(a, b) for i, a in enumerate(others) for b in others[i + 1 :]]
    return pairings + [(name, reference) for name in models]
