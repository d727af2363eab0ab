"""The embedded task's simulated annotator as a judge: the labeller of the dataset, for any two responses."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence

from rlhf import task
from rlhf.core.errors import UserError
from rlhf.judges.base import Item, Judge, Judgment


class SimulatedAnnotatorJudge(Judge):
    """The embedded task's annotator (rlhf/task/annotator.py) as a judge: noisy and length-biased
    over gold, and it always picks one ("A" or "B", never "tie"): when the gold scores are equal its
    careful judgement is a coin flip (`task.picks_first`). It labelled the dataset; the `collect`
    stage uses it to label the policy's own samples.

    Each pair gets one draw from a generator seeded by (seed, prompt, the two responses as a set),
    so the label does not depend on the order shown or on the batch, and a re-run labels alike.
    """

    name = "simulated"

    def __init__(self, annotator_noise: float, length_bias: float, seed: int = 0):
        for key, value in (("annotator_noise", annotator_noise), ("length_bias", length_bias)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{key} must be in [0, 1], got {value}")
        self.annotator_noise, self.length_bias, self.seed = annotator_noise, length_bias, seed

    def _rng(self, prompt: str, first: str, second: str) -> random.Random:
        blob = json.dumps([self.seed, prompt, sorted((first, second))], ensure_ascii=False)
        return random.Random(hashlib.sha256(blob.encode("utf-8")).hexdigest())

    def judge_many(self, items: Sequence[Item], progress: bool = False) -> list[Judgment]:
        judgments = []
        for prompt, first, second in items:
            try:
                verdict, *scores = task.simulated_preference(
                    prompt, first, second, self._rng(prompt, first, second), self.annotator_noise, self.length_bias
                )
            except ValueError as err:
                raise UserError(
                    f"simulated annotator: {err}; it only labels prompts of the embedded task (data.path=embedded)"
                ) from err
            judgments.append(Judgment(verdict, scores=tuple(scores)))
        return judgments

    def info(self) -> dict:
        return {
            "judge": self.name,
            "exact": False,
            "annotator_noise": self.annotator_noise,
            "length_bias": self.length_bias,
            "seed": self.seed,
        }
