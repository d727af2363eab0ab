"""Pairwise judges: given (prompt, response shown first, response shown second), say which is better.

Every judge returns, per presentation order, a verdict "A" (first shown is better), "B"
(second shown), "tie" or "invalid" (see rlhf.core.winrates), and `Judge.compare(prompts,
responses_a, responses_b)` turns that into one outcome per prompt for model A vs model B:

- `GoldJudge`    the embedded task's exact gold score (rlhf.task.gold_score); offline.
- `SimulatedAnnotatorJudge`  the embedded task's noisy, length-biased annotator over gold
                 (rlhf.task.simulated_preference): the labeller of the dataset, for any two responses.
- `RewardJudge`  any `score(prompts, responses) -> list[float]`, e.g. the trained reward model.
- `OpenAIJudge`  a GPT-4-class chat model through the official `openai` client, or any
                 OpenAI-compatible server (vLLM, Ollama) via `base_url` / OPENAI_BASE_URL.

Exact judges are symmetric, so each pair is scored once; the LLM judge sees each pair in both
orders at temperature 0 and `rlhf.core.winrates.outcomes_from_verdicts` combines the two verdicts,
cancelling position bias (Zheng et al. 2023, arXiv 2306.05685, "swap positions").

One judge per module: `base` (the contract: `JudgeSettings`, `Judgment`, `Comparison`, `Judge`,
`combine_batch_info`), `gold`, `simulated`, `reward`, and the LLM judge in `llm` (requests,
retries, failure labels, cost), `prompt` (its prompt, verdict parsing, answer bound) and `cache`
(its JSONL cache). This module re-exports what callers use.
"""

from __future__ import annotations

from rlhf.judges.base import Comparison, Item, Judge, JudgeSettings, Judgment, combine_batch_info
from rlhf.judges.cache import JudgmentCache, cache_key
from rlhf.judges.gold import GoldJudge
from rlhf.judges.llm import API_KEY_ENV, BASE_URL_ENV, SKIPPED_NO_KEY, OpenAIJudge
from rlhf.judges.prompt import (
    CHARS_PER_TOKEN_BOUND,
    JUDGE_PROMPT,
    JUDGE_PROMPT_VERSION,
    JUDGE_SYSTEM_PROMPT,
    bound_answer,
    format_judge_prompt,
    parse_verdict,
)
from rlhf.judges.reward import RewardJudge
from rlhf.judges.simulated import SimulatedAnnotatorJudge

__all__ = [
    "API_KEY_ENV",
    "BASE_URL_ENV",
    "CHARS_PER_TOKEN_BOUND",
    "JUDGE_PROMPT",
    "JUDGE_PROMPT_VERSION",
    "JUDGE_SYSTEM_PROMPT",
    "SKIPPED_NO_KEY",
    "Comparison",
    "GoldJudge",
    "Item",
    "Judge",
    "JudgeSettings",
    "Judgment",
    "JudgmentCache",
    "OpenAIJudge",
    "RewardJudge",
    "SimulatedAnnotatorJudge",
    "bound_answer",
    "cache_key",
    "combine_batch_info",
    "format_judge_prompt",
    "parse_verdict",
]
