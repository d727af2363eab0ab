"""The judges' contract: the `judge` config section, what a judgment and a comparison hold, the
`Judge` interface every judge implements, and `combine_batch_info` for a run's totals.

A judge returns, per presentation order, a verdict "A" (first shown is better), "B" (second
shown), "tie" or "invalid" (see rlhf.core.winrates); `Judge.compare` turns the verdicts into one outcome
per prompt for model A vs model B: a symmetric judge is asked once per pair, an asymmetric one
(the LLM judge) in both orders, and `rlhf.core.winrates.outcomes_from_verdicts` combines the two,
cancelling position bias (Zheng et al. 2023, arXiv 2306.05685, "swap positions").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from rlhf.core.errors import UserError
from rlhf.core.winrates import outcomes_from_verdicts, win_rate_summary

Item = tuple[str, str, str]  # (prompt, response shown first, response shown second)

# ----------------------------------------------------------------------------- settings


@dataclass
class JudgeSettings:
    """The `judge` config section (defaults are those of the LLM judge; gold needs none)."""

    model: str = "gpt-4o-mini"  # judge model; any chat model of the server at base_url
    base_url: str | None = None  # OpenAI-compatible endpoint; None: $OPENAI_BASE_URL, else api.openai.com
    max_concurrency: int = 8  # requests in flight at once
    max_retries: int = 5  # retries per request after the first try (429, 5xx, timeouts)
    timeout_s: float = 60.0  # per-request timeout; a timeout is retried
    max_tokens: int = 256  # cap on the judge's answer (a short rationale, then "Winner: ...")
    retry_base_delay_s: float = 1.0  # backoff before retry k (0-based): base * 2**k, jittered to 50-100%
    retry_max_delay_s: float = 60.0  # cap on one backoff delay (Retry-After included)
    usd_per_1m_input_tokens: float = 0.15  # price estimate for the cost line (gpt-4o-mini list price, 2024)
    usd_per_1m_output_tokens: float = 0.60  # price estimate for the cost line
    reward_tie_tolerance: float = 0.0  # RewardJudge: |score_a - score_b| <= this is a tie

    def validate(self) -> None:
        """One-line UserError for values no request could work with."""
        checks = (
            ("max_concurrency", self.max_concurrency >= 1),
            ("max_retries", self.max_retries >= 0),
            ("timeout_s", self.timeout_s > 0),
            ("max_tokens", self.max_tokens >= 1),
            ("retry_base_delay_s", self.retry_base_delay_s >= 0),
            ("retry_max_delay_s", self.retry_max_delay_s >= 0),
            ("usd_per_1m_input_tokens", self.usd_per_1m_input_tokens >= 0),
            ("usd_per_1m_output_tokens", self.usd_per_1m_output_tokens >= 0),
            ("reward_tie_tolerance", self.reward_tie_tolerance >= 0),
        )
        for name, ok in checks:
            if not ok:
                raise UserError(
                    f"judge.{name}={getattr(self, name)!r} is out of range; see JudgeSettings in rlhf/judges/base.py"
                )
        if not self.model:
            raise UserError("judge.model is empty; set it to a chat model name, e.g. judge.model=gpt-4o-mini")


# ----------------------------------------------------------------------------- results


@dataclass
class Judgment:
    """One judge call on one presentation order."""

    verdict: str  # "A" (first shown better) | "B" | "tie" | "invalid"
    scores: tuple[float, float] | None = None  # exact judges: (first, second)
    answer: str | None = None  # LLM judge: its answer text, cut to a bound if longer (see bound_answer)
    error: str | None = None  # why there is no answer (the request failed); verdict is then "invalid"
    answer_chars: int | None = None  # LLM judge: the answer's full length when it was cut; None: kept whole
    cache_key: str | None = None  # LLM judge: key of the cache entry holding the answer; None: not cached
    cached: bool = False  # LLM judge: answer read from the cache, nothing billed
    attempts: int = 0  # LLM judge: requests sent for it in this run (retries included)
    prompt_tokens: int = 0  # LLM judge: usage reported by the API
    completion_tokens: int = 0

    @property
    def unparsed(self) -> bool:
        """An answer came back but holds no verdict."""
        return self.verdict == "invalid" and self.error is None


@dataclass
class Comparison:
    """Model A vs model B under one judge, one entry per prompt."""

    judge: str
    outcomes: list[str]  # per prompt, model A's outcome: "A" | "B" | "tie" | "invalid"
    judgments_ab: list[Judgment]  # model A shown first
    judgments_ba: list[Judgment] | None  # model B shown first; None for a symmetric judge
    info: dict = field(default_factory=dict)  # judge settings, prompt version, counts, usage and cost

    def summary(self) -> dict:
        """`rlhf.core.winrates.win_rate_summary` of the outcomes."""
        return win_rate_summary(self.outcomes)

    def problems(self) -> list[str]:
        """One line per thing a reader must know: failed requests, unparseable answers."""
        lines = []
        if self.info.get("n_failed"):
            errors = "; ".join(f"{msg} (x{n})" for msg, n in self.info.get("errors", {}).items())
            lines.append(
                f"{self.judge}: {self.info['n_failed']} of {self.info['n_judgments']} judgments failed, "
                f"counted invalid: {errors}"
            )
        if self.info.get("n_unparsed"):
            lines.append(
                f"{self.judge}: {self.info['n_unparsed']} answers had no 'Winner: A|B|tie' line, counted invalid"
            )
        if self.info.get("n_truncated"):
            lines.append(
                f"{self.judge}: {self.info['n_truncated']} answers were longer than {self.info['answer_char_limit']} "
                f"characters (judge.max_tokens={self.info['max_tokens']} not honoured by the server); "
                "the verdict was read from the whole answer, only its start and end are kept"
            )
        return lines

    def to_dict(self) -> dict:
        """JSON-ready: judge info, win-rate summary and one record per prompt. An answer held by the
        judge's cache is referred to by its cache key (`cache_key_ab`), not copied: each answer is
        stored once, however many pairings share the request."""
        records = []
        for i, outcome in enumerate(self.outcomes):
            record = {"outcome": outcome}
            orders = [("ab", self.judgments_ab[i])] + ([("ba", self.judgments_ba[i])] if self.judgments_ba else [])
            for order, j in orders:
                suffix = f"_{order}" if self.judgments_ba else ""
                record[f"verdict{suffix}"] = j.verdict
                for name in ("scores", "cache_key", "answer", "error"):
                    value = getattr(j, name)
                    if name == "answer" and j.cache_key is not None:
                        continue  # in the cache, under cache_key
                    if value is not None:
                        record[f"{name}{suffix}"] = list(value) if name == "scores" else value
            records.append(record)
        return {"judge": self.judge, "info": self.info, "summary": self.summary(), "records": records}


# ----------------------------------------------------------------------------- the interface


class Judge:
    """Base class: subclasses set `name`, `symmetric` and implement `judge_many`."""

    name = "judge"
    symmetric = True  # the verdict does not depend on the order: judge each pair once

    @property
    def unavailable_reason(self) -> str | None:
        """None when the judge can run, else one line saying why not (e.g. SKIPPED_NO_KEY)."""
        return None

    def available(self) -> bool:
        return self.unavailable_reason is None

    def info(self) -> dict:
        """What the results need to be reproduced; never a secret."""
        return {"judge": self.name}

    def judge_many(self, items: Sequence[Item], progress: bool = False) -> list[Judgment]:
        raise NotImplementedError

    def judge(self, prompt: str, first: str, second: str) -> str:
        """The verdict for one order: "A" (first is better), "B", "tie" or "invalid"."""
        return self.judge_many([(prompt, first, second)])[0].verdict

    def batch_info(self, judgments: Sequence[Judgment]) -> dict:
        """Counts over one batch, merged into Comparison.info."""
        return {"n_judgments": len(judgments), "n_invalid": sum(j.verdict == "invalid" for j in judgments)}

    def compare(
        self, prompts: Sequence[str], responses_a: Sequence[str], responses_b: Sequence[str], progress: bool = False
    ) -> Comparison:
        """Model A vs model B on each prompt: both orders (one for a symmetric judge), combined."""
        if not len(prompts) == len(responses_a) == len(responses_b):
            raise ValueError(
                f"got {len(prompts)} prompts, {len(responses_a)} responses_a, {len(responses_b)} responses_b"
            )
        if not self.available():
            raise UserError(f"judge '{self.name}' {self.unavailable_reason}")
        items_ab = list(zip(prompts, responses_a, responses_b))
        if self.symmetric:
            judgments_ab, judgments_ba = self.judge_many(items_ab, progress), None
            every = judgments_ab
        else:
            every = self.judge_many(items_ab + list(zip(prompts, responses_b, responses_a)), progress)
            judgments_ab, judgments_ba = every[: len(items_ab)], every[len(items_ab) :]
        outcomes = outcomes_from_verdicts(
            [j.verdict for j in judgments_ab], None if judgments_ba is None else [j.verdict for j in judgments_ba]
        )
        return Comparison(self.name, outcomes, judgments_ab, judgments_ba, {**self.info(), **self.batch_info(every)})


def _is_count(key: str) -> bool:
    return key.startswith(("n_", "prompt_tokens", "completion_tokens", "estimated_cost_usd"))


def combine_batch_info(infos: Sequence[dict]) -> dict:
    """One info dict for several comparisons (e.g. every pairing of a run): counts (`n_*`), token
    usage and costs are summed; settings (temperature, prices, ...) are kept from the first; error
    counts are added per message."""
    combined: dict = {}
    for info in infos:
        for key, value in info.items():
            if key not in combined:
                combined[key] = dict(value) if isinstance(value, dict) else value
            elif key == "errors":
                combined[key] = {msg: combined[key].get(msg, 0) + n for msg, n in value.items()} | {
                    msg: n for msg, n in combined[key].items() if msg not in value
                }
            elif isinstance(value, dict):
                combined[key] = combine_batch_info([combined[key], value])
            elif _is_count(key) and isinstance(value, (int, float)) and not isinstance(value, bool):
                combined[key] += value
    return combined


def verdict_from_scores(first: float, second: float, tolerance: float) -> str:
    """The verdict for (first, second) scores: the higher wins, within `tolerance` a tie, "invalid"
    if one is not finite."""
    if not (math.isfinite(first) and math.isfinite(second)):
        return "invalid"
    return "A" if first - second > tolerance else "B" if second - first > tolerance else "tie"
