"""Any scalar scorer as a judge, e.g. the run's trained reward model."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rlhf.judges.base import Item, Judge, Judgment, verdict_from_scores


class RewardJudge(Judge):
    """A scalar scorer as a judge: `score_fn(prompts, responses) -> list[float]`, higher wins.

    The whole batch goes to `score_fn` in one call (it does its own micro-batching); a score
    difference within `tie_tolerance` is a tie and a non-finite score makes the verdict invalid.
    """

    symmetric = True

    def __init__(
        self,
        score_fn: Callable[[list[str], list[str]], Sequence[float]],
        tie_tolerance: float = 0.0,
        name: str = "reward",
    ):
        if tie_tolerance < 0:
            raise ValueError(f"tie_tolerance must be >= 0, got {tie_tolerance}")
        self.score_fn, self.tie_tolerance, self.name = score_fn, tie_tolerance, name

    def judge_many(self, items: Sequence[Item], progress: bool = False) -> list[Judgment]:
        if not items:
            return []
        prompts = [p for p, _, _ in items]
        firsts, seconds = [f for _, f, _ in items], [s for _, _, s in items]
        scores = [float(x) for x in self.score_fn(prompts + prompts, firsts + seconds)]
        if len(scores) != 2 * len(items):
            raise ValueError(f"{self.name} score_fn returned {len(scores)} scores for {2 * len(items)} responses")
        return [
            Judgment(verdict_from_scores(a, b, self.tie_tolerance), scores=(a, b))
            for a, b in zip(scores[: len(items)], scores[len(items) :])
        ]

    def info(self) -> dict:
        return {"judge": self.name, "exact": True, "tie_tolerance": self.tie_tolerance}
