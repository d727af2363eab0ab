"""Every model's answer to the same evaluation prompt, and the prompts where the models' answers differ in score.

Shared by the markdown Samples section (a handful of prompts) and the HTML sample browser (all of them), so both
group, score and order the answers the same way. Scores are gold scores where the run has the gold judge, else the
reward model's (real data has no gold judge).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlhf.report.format import is_number, order_models


@dataclass(frozen=True)
class PromptSamples:
    prompt: str
    family: str | None  # the embedded task's prompt family; None on other data
    answers: dict[str, dict]  # model -> its eval/responses row for this prompt, in canonical model order


def side_by_side(responses: dict[str, list[dict]], families: dict[str, str] | None = None) -> list[PromptSamples]:
    """One entry per evaluation prompt, in the order the models first answered them, with each model's first
    answer to it (a model that answered fewer prompts, like best-of-N, is absent from the others)."""
    names = order_models(name for name, rows in responses.items() if rows)
    by_model = {name: {} for name in names}
    for name in names:
        for row in responses[name]:
            by_model[name].setdefault(row.get("prompt"), row)
    prompts = dict.fromkeys(prompt for name in names for prompt in by_model[name])
    return [
        PromptSamples(
            prompt=prompt,
            family=(families or {}).get(prompt),
            answers={name: by_model[name][prompt] for name in names if prompt in by_model[name]},
        )
        for prompt in prompts
    ]


def score_key(samples: list[PromptSamples]) -> str:
    """The row key the samples are compared on: "gold_score" where any answer has one, else "reward"."""
    has_gold = any(is_number(row.get("gold_score")) for s in samples for row in s.answers.values())
    return "gold_score" if has_gold else "reward"


def score_range(sample: PromptSamples, key: str) -> tuple[float, float] | None:
    """(worst, best) score among the answers to one prompt; None when no answer has a score."""
    scores = [row[key] for row in sample.answers.values() if is_number(row.get(key))]
    return (min(scores), max(scores)) if scores else None


def score_spread(sample: PromptSamples, key: str) -> float:
    """Best minus worst score among the answers to one prompt (0 when fewer than two answers have a score)."""
    low, high = score_range(sample, key) or (0.0, 0.0)
    return high - low


def pick_disagreements(samples: list[PromptSamples], key: str, k: int) -> list[PromptSamples]:
    """Up to k prompts whose answers differ in score, deterministically: ranked by largest spread, then the most
    distinct answers, then evaluation order; the best-ranked prompt of each family comes first, so a few prompts
    cover several families. Prompts on which every answer scores the same are never picked."""
    ranked = sorted(
        (i for i, s in enumerate(samples) if score_spread(s, key) > 0),
        key=lambda i: (
            -score_spread(samples[i], key),
            -len({row.get("response") for row in samples[i].answers.values()}),
            i,
        ),
    )
    seen: set[str | None] = set()
    firsts = [i for i in ranked if not (samples[i].family in seen or seen.add(samples[i].family))]
    return [samples[i] for i in (firsts + [i for i in ranked if i not in firsts])[:k]]
