"""The demonstrator: an imperfect writer of candidate responses, as HH's and InstructGPT's were.

Each candidate comes from a weighted pool of behaviours (`DEFAULT_BEHAVIOUR_WEIGHTS`). Most of
the demonstrator's mistakes are the kind preferences correct in real RLHF data (Bai et al. 2022,
arXiv 2204.05862; Ouyang et al. 2022): complying with a harmful request, refusing a benign one,
hedging, evading, padding and rambling, repeating itself, stopping mid-sentence, and ignoring an
explicit instruction in the prompt. One behaviour, `wrong`, is a capability error (a wrong
capital, sum or count). Behaviours only produce text: quality is decided by the gold judge alone.

Instructions: on a prompt with an explicit instruction, the two good behaviours follow it with
probability `OBEY_RATE` and otherwise write their usual answer (a full sentence to "answer in one
word", no courtesy phrase to "be polite"), so ignoring instructions is a frequent, fixable mistake.
"""

from __future__ import annotations

import random

from rlhf.task.gold import MAX_WORDS
from rlhf.task.prompts import CANONICAL_REFUSAL, TaskSpec
from rlhf.task.world import CAPITALS, COUNTRIES, NAMES, OOD_NAMES, PEOPLE

# Behaviour pool: weights are relative and renormalised over the behaviours that apply to a prompt
# (harmful_compliance only to harmful requests; wrong and over_refusal only to the others).
DEFAULT_BEHAVIOUR_WEIGHTS = {
    "good_concise": 0.26,
    "good_verbose": 0.14,  # polite opener or closing around the answer: good, but graded down for length
    "rambling": 0.10,  # the answer, then filler past MAX_WORDS: longer, so length-biased labels like it
    "hedging": 0.14,  # the answer wrapped in "I think" / "but I am not sure"
    "evasive": 0.06,
    "over_refusal": 0.16,  # non-harmful prompts only
    "harmful_compliance": 0.50,  # harmful prompts only
    "wrong": 0.08,  # the capability error: a wrong entity or number; an unhelpful answer for risky_benign
    "repetitive": 0.06,
    "cut_off": 0.06,
}
OBEY_RATE = 0.4
_BENIGN_ONLY = frozenset({"wrong", "over_refusal"})
_HARMFUL_ONLY = frozenset({"harmful_compliance"})

REFUSALS = (CANONICAL_REFUSAL, "I cannot help with that, sorry.", "Sorry, I won't help with that.")
VERBOSE_REFUSALS = (
    "I'm sorry, but I can't help with that. It could hurt someone.",
    "I won't help with that. Please stay safe and be kind to others.",
    "Sorry, I cannot help you do that. Is there anything else I can do?",
)
COMPLIANCE = (
    "Sure, here is how to {act}. First, wait until nobody is around.",
    "Here is how you {act}: get what you need and do it at night.",
    "You can {act} if you plan it well. First, pick a quiet time.",
    "Sure! To {act}, start by making a plan and telling no one.",
)
POLITE_PREFIXES = ("Good question!", "Sure!", "Happy to help.", "Of course.", "Great question.")
POLITE_SUFFIXES = ("I hope this helps.", "Let me know if you need anything else.", "Have a nice day!")
COURTEOUS_SUFFIXES = ("I hope this helps.", "Have a nice day!", "Thanks for asking!")
# Filler for rambling answers: no numbers, entities, refusal, compliance or hedging cues, and no
# word 3-gram shared between sentences, so rambling costs the rambling penalty and verbosity.
FILLER = (
    "This is something many people like to ask about.",
    "It is always good to learn new things.",
    "Thank you for asking me.",
    "Learning is a long and happy road.",
    "There is much more that could be said here.",
    "Questions like this make the world more interesting.",
    "Feel free to come back any time.",
    "Every day brings a chance to grow.",
    "I am always glad to talk with you.",
    "Asking is a great habit.",
)
EVASIVE = (
    "That is a good question.",
    "Let me think about that.",
    "There are many ways to look at it.",
    "I am not sure what to say.",
    "Hmm, that is an interesting thing to ask.",
)
UNHELPFUL = (
    "You should ask someone else about that.",
    "It depends on many things.",
    "Just do what feels right to you.",
    "Try searching for it later.",
)
HEDGED = (
    "{core}, I think.",
    "{core}, but I am not sure.",
    "I think {lower}.",
    "Maybe {lower}.",
    "I am not sure, but {lower}.",
    "{core}. I might be wrong, though.",
)
HARMFUL_HEDGES = (
    "I am not sure I should answer that.",
    "Maybe that is not a good idea.",
    "I guess that would not be very nice.",
)
_PROPER = frozenset(NAMES + OOD_NAMES + tuple(COUNTRIES) + CAPITALS + tuple(PEOPLE))


def _follows_instruction(spec: TaskSpec, rng: random.Random) -> bool:
    return spec.instruction is not None and rng.random() < OBEY_RATE


def _good_concise(spec: TaskSpec, rng: random.Random) -> str:
    if spec.harmful:
        return rng.choice(REFUSALS)
    return spec.reference if _follows_instruction(spec, rng) else spec.plain_reference


def _good_verbose(spec: TaskSpec, rng: random.Random) -> str:
    if spec.harmful:
        return rng.choice(VERBOSE_REFUSALS)
    if _follows_instruction(spec, rng):
        if spec.instruction == "polite":
            return f"{rng.choice(POLITE_PREFIXES)} {spec.plain_reference} {rng.choice(COURTEOUS_SUFFIXES)}"
        return spec.reference
    parts = [rng.choice(POLITE_PREFIXES), spec.plain_reference, rng.choice(POLITE_SUFFIXES)]
    return " ".join(parts[: rng.choice((2, 3))] if rng.random() < 0.5 else parts[1:])


def _rambling(spec: TaskSpec, rng: random.Random) -> str:
    sentences = [rng.choice(REFUSALS) if spec.harmful else spec.plain_reference]
    for sentence in rng.sample(FILLER, len(FILLER)):
        sentences.append(sentence)
        if len(" ".join(sentences).split()) > MAX_WORDS:
            break
    return " ".join(sentences)


def _lower_first(text: str) -> str:
    first = text.split()[0].rstrip("',.")
    return text if first in _PROPER or first.split("'")[0] in _PROPER else text[0].lower() + text[1:]


def _hedging(spec: TaskSpec, rng: random.Random) -> str:
    if spec.harmful:
        return rng.choice(HARMFUL_HEDGES)
    core = spec.plain_reference.rstrip(".!?")
    return rng.choice(HEDGED).format(core=core, lower=_lower_first(core))


def _evasive(spec: TaskSpec, rng: random.Random) -> str:
    return rng.choice(EVASIVE)


def _over_refusal(spec: TaskSpec, rng: random.Random) -> str:
    return rng.choice(REFUSALS + VERBOSE_REFUSALS[:1])


def _harmful_compliance(spec: TaskSpec, rng: random.Random) -> str:
    act = " ".join({"my": "your", "me": "you", "i": "you"}.get(w, w) for w in spec.subject.split())
    return rng.choice(COMPLIANCE).format(act=act)


def _wrong(spec: TaskSpec, rng: random.Random) -> str:
    if spec.keywords:
        return rng.choice(UNHELPFUL)
    text = spec.answer_template.format(answer=rng.choice(spec.distractors))
    return f"{rng.choice(POLITE_PREFIXES)} {text}" if rng.random() < 0.3 else text


def _repetitive(spec: TaskSpec, rng: random.Random) -> str:
    good = rng.choice(REFUSALS) if spec.harmful else spec.plain_reference
    style = rng.randrange(3)
    if style == 0:  # the whole answer twice
        return f"{good} {good}"
    words = good.rstrip(".!?").split()
    if style == 1:  # the last word stutters
        return " ".join(words + [words[-1]] * rng.randint(2, 4)) + "."
    cut = rng.randint(1, len(words) - 1)  # a loop on one word that never ends
    return " ".join(words[:cut] + [words[cut]] * rng.randint(3, 6))


def _cut_off(spec: TaskSpec, rng: random.Random) -> str:
    words = (_good_verbose if rng.random() < 0.5 else _good_concise)(spec, rng).split()
    if len(words) < 2:
        words = spec.plain_reference.split()
    return " ".join(words[: rng.randint(1, len(words) - 1)]).rstrip(".!?,:;")


BEHAVIOURS = {
    "good_concise": _good_concise,
    "good_verbose": _good_verbose,
    "rambling": _rambling,
    "hedging": _hedging,
    "evasive": _evasive,
    "over_refusal": _over_refusal,
    "harmful_compliance": _harmful_compliance,
    "wrong": _wrong,
    "repetitive": _repetitive,
    "cut_off": _cut_off,
}


def resolve_weights(weights: dict | None) -> dict[str, float]:
    """DEFAULT_BEHAVIOUR_WEIGHTS with `weights` overriding some or all entries."""
    merged = {**DEFAULT_BEHAVIOUR_WEIGHTS, **(weights or {})}
    unknown = sorted(set(merged) - set(BEHAVIOURS))
    if unknown:
        raise ValueError(f"unknown behaviours {unknown} in weights; known: {sorted(BEHAVIOURS)}")
    if any(w < 0 for w in merged.values()) or sum(merged.values()) <= 0:
        raise ValueError(f"behaviour weights must be >= 0 with a positive sum, got {merged}")
    return merged


def sample_candidate(spec: TaskSpec, rng: random.Random, weights: dict | None = None) -> tuple[str, str]:
    """(behaviour, response) drawn from the behaviour pool, restricted to behaviours that apply to `spec`."""
    pool = resolve_weights(weights)
    names = [
        b
        for b in BEHAVIOURS
        if pool[b] > 0 and not (spec.harmful and b in _BENIGN_ONLY) and not (not spec.harmful and b in _HARMFUL_ONLY)
    ]
    if not names:
        raise ValueError(f"no behaviour with positive weight applies to a {spec.family} prompt: {pool}")
    behaviour = rng.choices(names, weights=[pool[b] for b in names])[0]
    return behaviour, BEHAVIOURS[behaviour](spec, rng)
