"""Evaluation suites: fixed lists of prompts that probe one failure each.

- sycophancy: 24 wrong user claims and 6 right ones (arith and facts), family "sycophancy";
- ood: unseen templates, names and objects of the known families (never in the dataset);
- harmful: harmful requests, 24 single-turn and 6 after a small-talk turn;
- capability: 10 fact, 10 arith and 10 context prompts with no instruction (the control: what a
  reward model that knows no more than the policy cannot teach);
- risky_benign: 30 benign requests that sound risky (over-refusal);
- instructions: 10 prompts each ending in "answer in one word", "be brief" and "be polite".
Suites other than ood are drawn from test-split prompts; all are deterministic.
"""

from __future__ import annotations

import random

from rlhf.task.prompts import (
    arith_prompt,
    arith_spec,
    context_prompt,
    fact_prompt,
    fact_spec,
    hh,
    memory_prompt,
    prompt_split,
    random_sum,
    request_prompt,
)
from rlhf.task.world import (
    ARITH_TEMPLATES,
    CONTEXT_QUESTIONS,
    COUNTRIES,
    FACT_TEMPLATES,
    HARMFUL_ACTS,
    INSTRUCTIONS,
    NAMES,
    OBJECTS,
    OOD_ARITH_TEMPLATES,
    OOD_CONTEXT_QUESTIONS,
    OOD_FACT_TEMPLATES,
    OOD_MEMORY,
    OOD_NAMES,
    OOD_OBJECTS,
    OOD_REQUEST_TEMPLATES,
    PEOPLE,
    PREFIXES,
    REQUEST_TEMPLATES,
    RISKY_BENIGN,
    SMALL_TALK,
    SYCOPHANCY_TEMPLATES,
)

SUITES = ("sycophancy", "ood", "harmful", "capability", "risky_benign", "instructions")


def _unique_test_prompts(rng: random.Random, make, n: int) -> list[str]:
    """`n` distinct prompts from `make(rng)` that hash to the test split."""
    prompts = {}
    while len(prompts) < n:
        prompt = make(rng)
        if prompt_split(prompt) == "test":
            prompts[prompt] = None
    return list(prompts)


def _sycophancy_prompt(rng: random.Random, wrong: bool) -> str:
    kind = rng.choice(("arith", "capital", "colour", "job"))
    if kind == "arith":
        spec = arith_spec(*map(str, random_sum(rng)))
    else:
        spec = fact_spec(kind, rng.choice(tuple(COUNTRIES) if kind == "capital" else tuple(PEOPLE)))
    claim = rng.choice(spec.distractors) if wrong else spec.answer
    sentence = spec.answer_template.rstrip(".").format(answer=claim)  # "The capital of X is Y", "3 plus 4 is 9"
    sentence = sentence.replace("The capital", "the capital")
    return hh(rng.choice(SYCOPHANCY_TEMPLATES).format(claim=sentence, Claim=sentence[0].upper() + sentence[1:]))


def _ood_prompts(rng: random.Random) -> list[str]:
    prompts = [
        hh(rng.choice(PREFIXES) + t.format(s=rng.choice(tuple(COUNTRIES) if k == "capital" else tuple(PEOPLE))))
        for k, ts in OOD_FACT_TEMPLATES.items()
        for t in ts
        for _ in range(2)
    ]
    prompts += [hh(arith_prompt(rng, (t,))) for t in OOD_ARITH_TEMPLATES for _ in range(2)]
    prompts += [
        hh(context_prompt(rng, OOD_NAMES, OOD_OBJECTS, CONTEXT_QUESTIONS + OOD_CONTEXT_QUESTIONS)) for _ in range(6)
    ]
    prompts += [hh(*memory_prompt(rng, "recall_name", name, OOD_MEMORY)) for name in OOD_NAMES[:4]]
    prompts += [
        hh(request_prompt(rng, acts, OOD_REQUEST_TEMPLATES)) for acts in (HARMFUL_ACTS, RISKY_BENIGN) for _ in range(3)
    ]
    return list(dict.fromkeys(prompts))


def _instruction_prompt(rng: random.Random, kind: str) -> str:
    if kind == "one_word" or rng.random() < 0.5:
        turn = rng.choice(
            (
                lambda: fact_prompt(rng, FACT_TEMPLATES),
                lambda: arith_prompt(rng, ARITH_TEMPLATES),
                lambda: context_prompt(rng, NAMES, OBJECTS, CONTEXT_QUESTIONS),
            )
        )()
    else:
        turn = request_prompt(rng, RISKY_BENIGN, REQUEST_TEMPLATES)
    return hh(f"{turn} {rng.choice(INSTRUCTIONS[kind])}")


def suite_prompts(name: str) -> list[str]:
    """A fixed list of ~30 HH prompts (ending in "\\n\\nAssistant:") for evaluation, one of SUITES
    (module docstring)."""
    rng = random.Random(f"suite/{name}")
    if name == "sycophancy":
        return _unique_test_prompts(rng, lambda r: _sycophancy_prompt(r, wrong=True), 24) + _unique_test_prompts(
            rng, lambda r: _sycophancy_prompt(r, wrong=False), 6
        )
    if name == "ood":
        return _ood_prompts(rng)
    if name == "harmful":
        return _unique_test_prompts(
            rng, lambda r: hh(request_prompt(r, HARMFUL_ACTS, REQUEST_TEMPLATES)), 24
        ) + _unique_test_prompts(
            rng, lambda r: hh(*r.choice(SMALL_TALK), request_prompt(r, HARMFUL_ACTS, REQUEST_TEMPLATES)), 6
        )
    if name == "capability":
        return (
            _unique_test_prompts(rng, lambda r: hh(fact_prompt(r, FACT_TEMPLATES)), 10)
            + _unique_test_prompts(rng, lambda r: hh(arith_prompt(r, ARITH_TEMPLATES)), 10)
            + _unique_test_prompts(rng, lambda r: hh(context_prompt(r, NAMES, OBJECTS, CONTEXT_QUESTIONS)), 10)
        )
    if name == "risky_benign":
        return _unique_test_prompts(rng, lambda r: hh(request_prompt(r, RISKY_BENIGN, REQUEST_TEMPLATES)), 30)
    if name == "instructions":
        return [
            p
            for kind in INSTRUCTIONS
            # called within this iteration only; the default argument just binds `kind` explicitly (B023)
            for p in _unique_test_prompts(rng, lambda r, kind=kind: _instruction_prompt(r, kind), 10)
        ]
    raise ValueError(f"unknown suite {name!r}; choose one of {SUITES}")
