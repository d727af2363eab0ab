"""Training scores from a reward spec (`rlhf.rollout.reward_spec`, where the spec's grammar is documented): the
reward model's scores, reward functions called on the text, and their weighted sum; and a reward model as a text
scorer.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import Tensor

from rlhf.core.batching import collate_sequences, encode_responses, encode_texts
from rlhf.core.errors import UserError
from rlhf.models.modeling import reward_scores
from rlhf.rollout.reward_spec import MODEL, RewardFunction, format_reward_spec, load_reward_spec


def columns_for(function: RewardFunction, columns: dict[str, list]) -> dict[str, list]:
    """The prompt rows' columns `function` takes as keyword arguments, as TRL gives a reward function the dataset's
    columns: all of them when it has **kwargs, else those it names, else none (a plain fn(prompts, responses))."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable without a signature: the plain call
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return columns
    named = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {name: values for name, values in columns.items() if name in named}


def required_columns(function: RewardFunction) -> list[str]:
    """The keyword parameters `function` needs beyond (prompts, responses): columns every prompt row must carry."""
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return []
    named = [p for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return [p.name for p in named[2:] if p.default is inspect.Parameter.empty]


def call_reward_function(
    source: str,
    function: RewardFunction,
    prompts: list[str],
    responses: list[str],
    columns: dict[str, list] | None = None,
) -> Tensor:
    """function(prompts, responses, **columns it takes) as a (B,) float32 tensor, checked: one finite float per
    response, or a one-line UserError naming the function. `columns`: each prompt row's other fields, by name."""
    values = function(prompts, responses, **columns_for(function, columns or {}))
    try:
        scores = [float(value) for value in values]
    except (TypeError, ValueError):
        raise UserError(
            f"reward function '{source}' returned {type(values).__name__} {str(values)[:60]!r}; "
            f"it must return one float per response"
        ) from None
    if len(scores) != len(responses):
        raise UserError(
            f"reward function '{source}' returned {len(scores)} scores for {len(responses)} responses; "
            f"it must return one float per response, in order"
        )
    bad = [i for i, score in enumerate(scores) if not math.isfinite(score)]
    if bad:
        raise UserError(
            f"reward function '{source}' returned {scores[bad[0]]} for response {bad[0]} "
            f"({len(bad)} non-finite in all); "
            f"every score must be a finite float"
        )
    return torch.tensor(scores, dtype=torch.float32)


def check_finite_model_scores(key: str, scores: Tensor) -> None:
    """A NaN or infinite reward-model score would turn the loss non-finite a step later, with a
    misleading hint; stop here and name the model as the cause."""
    bad = ~torch.isfinite(scores)
    if bad.any():
        raise UserError(
            f"{key}: the reward model gave {int(bad.sum())} of {scores.numel()} responses a non-finite score "
            f"({scores[bad][0].item()}); the reward model is broken: re-train it "
            "(part1_reward/train_reward.py --force, e.g. with a lower reward.lr)"
        )


def combine_rewards(weights: list[float], scores: list[Tensor]) -> Tensor:
    """sum_k weights[k] * scores[k]: K tensors of shape (B,) -> (B,), in float32 or wider."""
    total = torch.zeros_like(scores[0], dtype=torch.promote_types(scores[0].dtype, torch.float32))
    for weight, score in zip(weights, scores):
        total = total + weight * score.to(total.dtype)
    return total


class RewardSource:
    """A parsed, imported reward spec: `score()` turns one rollout batch into its training scores."""

    def __init__(self, spec: str, key: str):
        self.key = key
        self.terms, self.functions = load_reward_spec(spec, key)

    def check_columns(self, available: set[str], hint: str) -> None:
        """Every function's required columns are among the prompt rows' `available` ones, or a one-line error."""
        for source, function in self.functions.items():
            if missing := [name for name in required_columns(function) if name not in available]:
                raise UserError(
                    f"{self.key}: reward function '{source}' needs the prompt column(s) {', '.join(missing)}, which "
                    f"these prompts do not have; {hint}"
                )

    @property
    def uses_model(self) -> bool:
        """Whether the reward model must score the training rollouts."""
        return any(term.source == MODEL for term in self.terms)

    @property
    def spec(self) -> str:
        return format_reward_spec(self.terms)

    def score(
        self,
        prompts: list[str],
        responses: list[str],
        model_scores: Tensor | None,
        columns: dict[str, list] | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """-> (the weighted sum (B,), each term's unweighted scores (B,) by term name).

        model_scores: (B,) reward-model scores of the batch (None when no term uses the model);
        the functions' scores come back on its device, or the CPU. columns: the prompt rows' other fields by
        name, one value per response (`columns_for` says which a function is given).
        """
        device = model_scores.device if model_scores is not None else torch.device("cpu")
        parts = {}
        for term in self.terms:
            if term.source == MODEL:
                if model_scores is None:
                    raise ValueError(f"{self.key}: the spec uses the reward model but no model scores were given")
                check_finite_model_scores(self.key, model_scores)
                parts[term.name] = model_scores.float()
            else:
                parts[term.name] = call_reward_function(
                    term.source, self.functions[term.source], prompts, responses, columns
                ).to(device)
        return combine_rewards([term.weight for term in self.terms], list(parts.values())), parts


def load_reward_source(stage: str, spec: str) -> RewardSource:
    """`<stage>.reward` parsed and its functions imported (start-up validation and use)."""
    return RewardSource(spec, f"{stage}.reward")


def text_scorer(
    reward_model,
    tokenizer,
    device,
    batch_size: int,
    known: dict[tuple[str, str], float] | None = None,
    autocast: Callable[[], AbstractContextManager] = nullcontext,
) -> RewardFunction:
    """A reward model as a reward function, `score(prompts, responses) -> list[float]` on text:
    each (prompt, response) is tokenized with the reward model's own `tokenizer`, scored once in
    batches of `batch_size`, and remembered in `known` (pass the scores already computed to reuse them).
    `autocast`: the stage's `accelerator.autocast`, so these scores share the precision of those in `known`."""
    known = {} if known is None else known

    @torch.no_grad()
    def score(prompts: list[str], responses: list[str]) -> list[float]:
        missing = sorted({(p, r) for p, r in zip(prompts, responses) if (p, r) not in known})
        for start in range(0, len(missing), batch_size):
            chunk = missing[start : start + batch_size]
            batch = collate_sequences(
                encode_texts(tokenizer, [p for p, _ in chunk]),
                encode_responses(tokenizer, [r for _, r in chunk]),
                tokenizer.pad_token_id,
            )
            with autocast():
                values = reward_scores(reward_model, batch["input_ids"].to(device), batch["attention_mask"].to(device))
            known.update(zip(chunk, values.tolist()))
        return [known[(p, r)] for p, r in zip(prompts, responses)]

    return score
