"""The gold judge: the embedded task's exact gold score (rlhf.task.gold_score); offline and free."""

from __future__ import annotations

from collections.abc import Sequence

from rlhf import task
from rlhf.core.errors import UserError
from rlhf.judges.base import Item, Judge, Judgment, verdict_from_scores


class GoldJudge(Judge):
    """The embedded task's gold score (rlhf.task.gold_score): higher wins, equal ties. Exact."""

    name = "gold"
    # Gold scores are sums of a few decimal constants (1 - 0.3 - 0.3 vs 0.4): compare with slack.
    TOLERANCE = 1e-9

    def judge_many(self, items: Sequence[Item], progress: bool = False) -> list[Judgment]:
        judgments = []
        for prompt, first, second in items:
            try:
                scores = (task.gold_score(prompt, first), task.gold_score(prompt, second))
            except ValueError as err:
                raise UserError(
                    f"gold judge: {err}; the gold judge only scores prompts of the embedded task (data.path=embedded)"
                ) from err
            judgments.append(Judgment(verdict_from_scores(*scores, self.TOLERANCE), scores=scores))
        return judgments

    def info(self) -> dict:
        return {"judge": self.name, "exact": True}
