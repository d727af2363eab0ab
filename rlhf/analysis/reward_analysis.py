"""Reward-model diagnostics: length correlation and a categorised look at misclassified pairs."""

from __future__ import annotations

import math
import statistics

# A misclassified pair can fall in several categories; each is counted separately.
ERROR_CATEGORIES = (
    "longer_rejected_preferred",  # the RM preferred the rejected response, and it is the longer one
    "small_margin",  # |r_c - r_r| below a quarter of the margins' std: the RM is unsure (ambiguous pair)
    "confident_wrong",  # |r_c - r_r| above one std of the margins: confidently wrong
    "very_short",  # either response has at most VERY_SHORT_TOKENS tokens
)
VERY_SHORT_TOKENS = 3


def pearson(xs: list[float], ys: list[float]) -> float:
    """Pearson correlation; 0 when either side is constant."""
    if len(xs) < 2:
        return 0.0
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    cov = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys))
    var_x = sum((x - mean_x) ** 2 for x in xs)
    var_y = sum((y - mean_y) ** 2 for y in ys)
    return cov / math.sqrt(var_x * var_y) if var_x > 0 and var_y > 0 else 0.0


def accuracy_by_group(groups: list[str], correct: list[bool]) -> dict[str, float]:
    """Share of `correct` within each group (e.g. the embedded task's prompt families), sorted by name."""
    totals: dict[str, list[int]] = {}
    for group, ok in zip(groups, correct):
        hits_and_count = totals.setdefault(group, [0, 0])
        hits_and_count[0] += bool(ok)
        hits_and_count[1] += 1
    return {group: hits / count for group, (hits, count) in sorted(totals.items())}


def error_categories(chosen_tokens: int, rejected_tokens: int, margin: float, margin_std: float) -> list[str]:
    """Categories of one misclassified pair (margin = r_chosen - r_rejected <= 0). Token counts exclude EOS."""
    found = []
    if rejected_tokens > chosen_tokens:
        found.append("longer_rejected_preferred")
    if abs(margin) < 0.25 * margin_std:
        found.append("small_margin")
    if abs(margin) > margin_std:
        found.append("confident_wrong")
    if min(chosen_tokens, rejected_tokens) <= VERY_SHORT_TOKENS:
        found.append("very_short")
    return found


def error_analysis(rows: list[dict], pairs: list, scores: list[tuple[float, float]], n_examples: int) -> dict:
    """Counts per category over misclassified pairs, plus up to `n_examples` examples per category."""
    margins = [c - r for c, r in scores]
    margin_std = statistics.pstdev(margins) if len(margins) > 1 else 0.0
    counts = dict.fromkeys(ERROR_CATEGORIES, 0)
    examples: dict[str, list[dict]] = {category: [] for category in ERROR_CATEGORIES}
    wrong = 0
    for row, pair, (chosen, rejected) in zip(rows, pairs, scores):
        if chosen > rejected:
            continue
        wrong += 1
        for category in error_categories(
            len(pair.chosen_ids) - 1, len(pair.rejected_ids) - 1, chosen - rejected, margin_std
        ):
            counts[category] += 1
            if len(examples[category]) < n_examples:
                examples[category].append(
                    {
                        "prompt": row["prompt"],
                        "chosen": row["chosen"],
                        "rejected": row["rejected"],
                        "reward_chosen": chosen,
                        "reward_rejected": rejected,
                        **{k: row[k] for k in ("gold_chosen", "gold_rejected", "family") if k in row},
                    }
                )
    return {"misclassified": wrong, "n": len(scores), "margin_std": margin_std, "counts": counts, "examples": examples}
