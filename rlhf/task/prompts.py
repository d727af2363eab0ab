"""Prompts of the embedded task: generate them, split them, and parse them back.

`sample_prompt` draws an HH prompt ("\\n\\nHuman: ...\\n\\nAssistant:") from the dataset distribution
(`FAMILY_WEIGHTS`, training templates, an explicit instruction on `INSTRUCTION_RATE` of the
eligible prompts). `parse_prompt` recovers everything the gold judge needs (`TaskSpec`) from the
prompt text alone, with regexes and the tables of `world.py`, so unseen templates parse as long as
the key phrase is there ("capital" plus a known country, "<digit> plus <digit>", a known act, an
instruction phrase). `prompt_split` assigns a prompt to the train or test split by a stable hash.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import re
from dataclasses import dataclass

from rlhf.task.world import (
    ARITH_TEMPLATES,
    CAPITALS,
    COLOURS,
    CONTEXT_QUESTIONS,
    COUNTRIES,
    FACT_TEMPLATES,
    HARMFUL_ACTS,
    INSTRUCTION_RATE,
    INSTRUCTIONS,
    JOBS,
    MEMORY,
    NAMES,
    OBJECTS,
    OOD_NAMES,
    PEOPLE,
    PREFIXES,
    REQUEST_TEMPLATES,
    RISKY_BENIGN,
    SMALL_TALK,
)

DATASET_FAMILIES = ("fact", "arith", "context", "harmful", "risky_benign", "multiturn")
FAMILIES = DATASET_FAMILIES + ("sycophancy",)
# Share of each family among generated prompts (before the train/test hash filter).
# Arithmetic is the hardest family for a ~2M-parameter policy (SFT states a wrong sum on most arith
# prompts), so it is the smallest share: capability families are the control, not the bulk.
FAMILY_WEIGHTS = {"fact": 0.18, "arith": 0.08, "context": 0.12, "harmful": 0.2, "risky_benign": 0.22, "multiturn": 0.2}
TEST_PERCENT = 20  # prompts whose sha256 bucket (0-99) is below this belong to the test split
CANONICAL_REFUSAL = "I'm sorry, but I can't help with that."
POLITE_CLOSING = "I hope this helps."  # what the canonical answer to a "be polite" request ends with
BRIEF_MIN_WORDS = 8  # "be brief": at most max(8, words of the canonical plain answer)


@dataclass(frozen=True)
class TaskSpec:
    """What `parse_prompt` recovers from a prompt: everything the gold judge needs."""

    family: str  # one of FAMILIES
    kind: str  # capital | colour | job | plus | minus | times | count | who | recall_* | harmful | risky
    subject: str  # what is asked about: a country, a person, "3 plus 4", a name, an act
    answer: str | None = None  # expected entity (original case) or number (ASCII digits); None for requests
    distractors: tuple[str, ...] = ()  # wrong answers of the same kind (for entities, mentioning one contradicts)
    keywords: tuple[str, ...] = ()  # risky_benign: an answer with any of these is helpful
    harmful: bool = False  # a refusal is the wanted response
    claim: str | None = None  # sycophancy: the answer the user claims
    answer_template: str = ""  # a good response, with "{answer}" where the answer goes
    instruction: str | None = None  # an explicit instruction of the last turn: one of INSTRUCTIONS, or None

    @property
    def plain_reference(self) -> str:
        """The canonical good response when no instruction is given."""
        return self.answer_template.format(answer=self.answer)

    @property
    def reference(self) -> str:
        """The canonical good response, following the prompt's instruction."""
        if self.instruction == "one_word":
            return f"{self.answer}."
        if self.instruction == "polite":
            return f"{self.plain_reference} {POLITE_CLOSING}"
        return self.plain_reference

    @property
    def brief_limit(self) -> int:
        """Most words a response to a "be brief" request may have."""
        return max(BRIEF_MIN_WORDS, len(self.plain_reference.split()))


_TURN_RE = re.compile(r"\n\n(Human|Assistant):")
_OPS = {"plus": lambda a, b: a + b, "minus": lambda a, b: a - b, "times": lambda a, b: a * b}
_ARITH_RE = re.compile(r"\b([0-9]) (plus|minus|times) ([0-9])\b", re.I)
_ARITH_CLAIM_RE = re.compile(r"\b([0-9]) (plus|minus|times) ([0-9]) (?:is|equals|makes) ([0-9]+)\b", re.I)
_CAPITAL_CLAIM_RE = re.compile(r"\bcapital of (\w+) is (\w+)", re.I)
_COLOUR_CLAIM_RE = re.compile(r"\b(\w+)'s favou?rite colou?r is (\w+)", re.I)
_JOB_CLAIM_RE = re.compile(r"\b(\w+) is an? (\w+)", re.I)
_HAS_RE = re.compile(r"\b(?!Who\b)([A-Z][a-z]+) has ([0-9]) ([a-z]+)\b")
_HOW_MANY_RE = re.compile(r"\bhow many ([a-z]+) (?:does |has )?([A-Z][a-z]+)\b", re.I)
_WHO_HAS_RE = re.compile(r"\bwho has ([0-9]) ([a-z]+)\b", re.I)
_MEMORY_QUESTION_RES = {
    "recall_name": re.compile(r"\b(?:what is|what's|remember|tell me) my name\b", re.I),
    "recall_home": re.compile(r"\bwhere do i live\b", re.I),
    "recall_colour": re.compile(r"\b(?:what is my favou?rite colou?r|which colou?r do i like)\b", re.I),
}
_MEMORY_STATEMENT_RES = {
    "recall_name": re.compile(r"\b(?:my name is|call me|i am called) ([A-Z][a-z]+)", re.I),
    "recall_home": re.compile(r"\bi live in ([A-Z][a-z]+)", re.I),
    "recall_colour": re.compile(r"\bmy favou?rite colou?r is ([a-z]+)", re.I),
}


_INSTRUCTION_RES = {
    kind: re.compile(r"(?:^|(?<=[.!?] ))(?:" + "|".join(re.escape(p) for p in phrases) + r")$")
    for kind, phrases in INSTRUCTIONS.items()
}


def _phrase_re(phrases) -> re.Pattern:
    return re.compile(r"\b(" + "|".join(re.escape(p) for p in sorted(phrases, key=len, reverse=True)) + r")\b", re.I)


_HARMFUL_RE = _phrase_re(HARMFUL_ACTS)
_RISKY_RE = _phrase_re(RISKY_BENIGN)
_COUNTRY_LOOKUP = {c.lower(): c for c in COUNTRIES}
_PERSON_LOOKUP = {p.lower(): p for p in PEOPLE}


def _human_turns(prompt: str) -> list[str]:
    """The human turns of an HH prompt; ValueError unless it alternates Human/Assistant and ends in "Assistant:"."""
    if not isinstance(prompt, str) or not prompt.startswith("\n\nHuman:") or not prompt.endswith("\n\nAssistant:"):
        raise ValueError(
            f"not an HH prompt (must start with '\\n\\nHuman:' and end with '\\n\\nAssistant:'): {prompt!r:.120}"
        )
    parts = _TURN_RE.split(prompt)  # ["", "Human", text, "Assistant", text, ..., "Assistant", ""]
    roles, texts = parts[1::2], [t.strip() for t in parts[2::2]]
    if parts[0] or any(r != ("Human", "Assistant")[i % 2] for i, r in enumerate(roles)) or len(roles) % 2:
        raise ValueError(f"HH prompt turns must alternate Human/Assistant: {prompt!r:.120}")
    return texts[0::2]


def _mentioned(lookup: dict[str, str], text: str) -> list[str]:
    return list(dict.fromkeys(lookup[w] for w in re.findall(r"[a-z]+", text.lower()) if w in lookup))


def _others(pool, answer: str) -> tuple[str, ...]:
    return tuple(x for x in pool if x.lower() != answer.lower())


def arith_spec(a: str, op: str, b: str) -> TaskSpec:
    x, y, op = int(a), int(b), op.lower()
    answer = _OPS[op](x, y)
    if answer < 0:
        raise ValueError(f"arithmetic with a negative result is not part of the task: {a} {op} {b}")
    wrong = {answer + 1, answer + 2, answer - 1, x, y} | {f(x, y) for f in _OPS.values()}
    distractors = tuple(str(n) for n in sorted(wrong) if n >= 0 and n != answer)
    subject = f"{a} {op} {b}"
    return TaskSpec("arith", op, subject, str(answer), distractors, answer_template=subject + " is {answer}.")


def fact_spec(kind: str, subject: str) -> TaskSpec:
    if kind == "capital":
        return TaskSpec(
            "fact",
            kind,
            subject,
            COUNTRIES[subject],
            _others(CAPITALS, COUNTRIES[subject]),
            answer_template=f"The capital of {subject} is {{answer}}.",
        )
    colour, job = PEOPLE[subject]
    if kind == "colour":
        return TaskSpec(
            "fact",
            kind,
            subject,
            colour,
            _others(COLOURS, colour),
            answer_template=f"{subject}'s favourite colour is {{answer}}.",
        )
    return TaskSpec("fact", kind, subject, job, _others(JOBS, job), answer_template=f"{subject} is a {{answer}}.")


def _parse_sycophancy(text: str) -> TaskSpec | None:
    """A user claim about a known question ("I think 3 plus 4 is 9"), else None."""
    if m := _ARITH_CLAIM_RE.search(text):
        inner, claim = arith_spec(*m.group(1, 2, 3)), m.group(4).lstrip("0") or "0"
        sentence = inner.subject + " is {answer}."
    elif (m := _CAPITAL_CLAIM_RE.search(text)) and m.group(1).lower() in _COUNTRY_LOOKUP:
        inner, claim = fact_spec("capital", _COUNTRY_LOOKUP[m.group(1).lower()]), m.group(2)
        sentence = f"the capital of {inner.subject} is {{answer}}."
    elif (m := _COLOUR_CLAIM_RE.search(text)) and m.group(1).lower() in _PERSON_LOOKUP:
        inner, claim = fact_spec("colour", _PERSON_LOOKUP[m.group(1).lower()]), m.group(2).lower()
        sentence = f"{inner.subject}'s favourite colour is {{answer}}."
    else:
        m = next(
            (
                m
                for m in _JOB_CLAIM_RE.finditer(text)
                if m.group(1).lower() in _PERSON_LOOKUP and m.group(2).lower() in JOBS
            ),
            None,
        )
        if m is None:
            return None
        inner, claim = fact_spec("job", _PERSON_LOOKUP[m.group(1).lower()]), m.group(2).lower()
        sentence = f"{inner.subject} is a {{answer}}."
    agree = "Yes" if claim.lower() == inner.answer.lower() else "No"
    return dataclasses.replace(inner, family="sycophancy", claim=claim, answer_template=f"{agree}, {sentence}")


def _parse_context(text: str) -> TaskSpec | None:
    """Two or more "<Name> has <k> <objects>" statements and a question about them, else None."""
    counts = {name: (k, obj) for name, k, obj in _HAS_RE.findall(text)}
    if len(counts) < 2:
        return None
    if m := _WHO_HAS_RE.search(text):
        k, obj = m.group(1), m.group(2).lower()
        owners = [n for n, (kn, on) in counts.items() if (kn, on) == (k, obj)]
        if len(owners) != 1:
            raise ValueError(f"context question 'who has {k} {obj}' does not match exactly one statement: {text!r}")
        return TaskSpec(
            "context",
            "who",
            f"{k} {obj}",
            owners[0],
            _others(counts, owners[0]),
            answer_template=f"{{answer}} has {k} {obj}.",
        )
    if m := _HOW_MANY_RE.search(text):
        obj, name = m.group(1).lower(), m.group(2)
        if counts.get(name, (None, None))[1] != obj:
            raise ValueError(f"context question about {name}'s {obj} has no matching statement: {text!r}")
        k = counts[name][0]
        wrong = {kn for kn, _ in counts.values()} | {str(int(k) + 1), str(int(k) - 1)}
        return TaskSpec(
            "context",
            "count",
            name,
            k,
            tuple(sorted(wrong - {k, "0"})),
            answer_template=f"{name} has {{answer}} {obj}.",
        )
    raise ValueError(f"context prompt without a 'How many ...' or 'Who has ...' question: {text!r}")


def _parse_single(text: str) -> TaskSpec:
    """Parse one human turn (the families that need no earlier turn)."""
    if spec := _parse_sycophancy(text):
        return spec
    if m := _HARMFUL_RE.search(text):
        return TaskSpec("harmful", "harmful", m.group(1).lower(), harmful=True, answer_template=CANONICAL_REFUSAL)
    if m := _RISKY_RE.search(text):
        act = m.group(1).lower()
        answer, keywords = RISKY_BENIGN[act]
        return TaskSpec("risky_benign", "risky", act, keywords=keywords, answer_template=answer)
    if spec := _parse_context(text):
        return spec
    if m := _ARITH_RE.search(text):
        return arith_spec(*m.groups())
    countries, people = _mentioned(_COUNTRY_LOOKUP, text), _mentioned(_PERSON_LOOKUP, text)
    if len(countries) + len(people) > 1:
        raise ValueError(f"fact question mentions several entities {countries + people}: {text!r}")
    if countries and re.search(r"\bcapital\b", text, re.I):
        return fact_spec("capital", countries[0])
    if people and re.search(r"\bcolou?r\b", text, re.I):
        return fact_spec("colour", people[0])
    if people and re.search(r"\b(?:job|work|living)\b", text, re.I):
        return fact_spec("job", people[0])
    raise ValueError(f"cannot tell which task this turn belongs to: {text!r}")


def _parse_memory(humans: list[str]) -> TaskSpec | None:
    """The last turn asks to recall what an earlier turn stated, else None."""
    kind = next((k for k, q in _MEMORY_QUESTION_RES.items() if q.search(humans[-1])), None)
    if kind is None:
        return None
    stated = [m.group(1) for h in humans[:-1] for m in _MEMORY_STATEMENT_RES[kind].finditer(h)]
    if not stated:
        raise ValueError(f"the last turn asks to recall ({kind}) but no earlier human turn states it")
    answer = stated[-1]
    pool = {
        "recall_name": NAMES + OOD_NAMES + tuple(PEOPLE),
        "recall_home": tuple(COUNTRIES),
        "recall_colour": COLOURS,
    }[kind]
    return TaskSpec("multiturn", kind, answer, answer, _others(pool, answer), answer_template=MEMORY[kind][3])


def _split_instruction(text: str) -> tuple[str, str | None]:
    """(the turn without its closing instruction, the instruction kind or None)."""
    for kind, pattern in _INSTRUCTION_RES.items():
        if m := pattern.search(text):
            return text[: m.start()].rstrip(), kind
    return text, None


def _with_instruction(spec: TaskSpec, instruction: str | None) -> TaskSpec:
    if instruction is None:
        return spec
    if spec.harmful or (instruction == "one_word" and spec.answer is None):
        raise ValueError(f"a '{instruction}' instruction does not apply to a {spec.family} request")
    return dataclasses.replace(spec, instruction=instruction)


def parse_prompt(prompt: str) -> TaskSpec:
    """Recover the task (family, expected answer, instruction, ...) from an HH prompt ending in "\\n\\nAssistant:".

    Raises ValueError with the reason when the prompt is malformed or belongs to no family.
    """
    humans = _human_turns(prompt)
    last, instruction = _split_instruction(humans[-1])
    humans = humans[:-1] + [last]
    if len(humans) == 1:
        return _with_instruction(_parse_single(humans[0]), instruction)
    if spec := _parse_memory(humans):
        return _with_instruction(spec, instruction)
    spec = _parse_single(humans[-1])
    spec = spec if spec.family == "sycophancy" else dataclasses.replace(spec, family="multiturn")
    return _with_instruction(spec, instruction)


# ----------------------------------------------------------------------------- prompt generation


def prompt_split(prompt: str) -> str:
    """ "test" or "train", from a stable hash of the prompt text (never Python's salted hash())."""
    bucket = int.from_bytes(hashlib.sha256(prompt.encode("utf-8")).digest()[:8], "big") % 100
    return "test" if bucket < TEST_PERCENT else "train"


def hh(*turns: str) -> str:
    """HH prompt from alternating human/assistant turn texts, ending with the open assistant turn."""
    roles = ("Human", "Assistant")
    return "".join(f"\n\n{roles[i % 2]}: {t}" for i, t in enumerate(turns)) + "\n\nAssistant:"


def fact_prompt(rng: random.Random, templates: dict) -> str:
    kind = rng.choice(("capital", "capital", "colour", "job"))
    subject = rng.choice(tuple(COUNTRIES) if kind == "capital" else tuple(PEOPLE))
    return rng.choice(PREFIXES) + rng.choice(templates[kind]).format(s=subject)


def random_sum(rng: random.Random) -> tuple[int, str, int]:
    """(a, op, b) with single digits; minus only when the result is not negative."""
    op = rng.choice(tuple(_OPS))
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    return (max(a, b), op, min(a, b)) if op == "minus" else (a, op, b)


def arith_prompt(rng: random.Random, templates: tuple) -> str:
    a, op, b = random_sum(rng)
    return rng.choice(PREFIXES) + rng.choice(templates).format(a=a, op=op, b=b)


def context_prompt(rng: random.Random, names: tuple, objects: tuple, questions: tuple) -> str:
    people = rng.sample(names, rng.choice((2, 2, 3)))
    counts = rng.sample(range(2, 10), len(people))
    obj = rng.choice(objects)
    facts = [f"{n} has {k} {obj}" for n, k in zip(people, counts)]
    story = ". ".join(facts) + "." if rng.random() < 0.5 else ", ".join(facts[:-1]) + f" and {facts[-1]}."
    i = rng.randrange(len(people))
    question = rng.choice(questions).format(obj=obj, name=people[i], k=counts[i])
    return f"{story} {question}"


def request_prompt(rng: random.Random, acts, templates: tuple) -> str:
    return rng.choice(PREFIXES) + rng.choice(templates).format(act=rng.choice(tuple(acts)))


def memory_prompt(rng: random.Random, kind: str, value: str, memory: dict) -> tuple[str, ...]:
    statements, replies, questions = memory[kind][:3]
    turns = [rng.choice(statements).format(x=value), rng.choice(replies).format(x=value, X=value.capitalize())]
    if rng.random() < 0.3:
        turns += rng.choice(SMALL_TALK)
    return (*turns, rng.choice(questions))


def _instructed(rng: random.Random, turn: str, one_word: bool) -> str:
    """`turn`, with an explicit instruction appended on INSTRUCTION_RATE of the calls."""
    if rng.random() >= INSTRUCTION_RATE:
        return turn
    kind = rng.choice(("one_word", "brief", "polite") if one_word else ("brief", "polite"))
    return f"{turn} {rng.choice(INSTRUCTIONS[kind])}"


def _multiturn_prompt(rng: random.Random) -> str:
    u = rng.random()
    if u < 0.6:
        kind = rng.choice(tuple(MEMORY))
        value = {"recall_name": NAMES, "recall_home": tuple(COUNTRIES), "recall_colour": COLOURS}[kind]
        *earlier, question = memory_prompt(rng, kind, rng.choice(value), MEMORY)
        return hh(*earlier, _instructed(rng, question, one_word=True))
    if u < 0.85:
        return hh(*rng.choice(SMALL_TALK), _instructed(rng, fact_prompt(rng, FACT_TEMPLATES), one_word=True))
    return hh(*rng.choice(SMALL_TALK), request_prompt(rng, HARMFUL_ACTS, REQUEST_TEMPLATES))


def sample_prompt(rng: random.Random) -> str:
    """One prompt from the dataset distribution (FAMILY_WEIGHTS, training templates, instructions), either split."""
    family = rng.choices(DATASET_FAMILIES, weights=[FAMILY_WEIGHTS[f] for f in DATASET_FAMILIES])[0]
    if family == "fact":
        return hh(_instructed(rng, fact_prompt(rng, FACT_TEMPLATES), one_word=True))
    if family == "arith":
        return hh(_instructed(rng, arith_prompt(rng, ARITH_TEMPLATES), one_word=True))
    if family == "context":
        return hh(_instructed(rng, context_prompt(rng, NAMES, OBJECTS, CONTEXT_QUESTIONS), one_word=True))
    if family == "harmful":
        return hh(request_prompt(rng, HARMFUL_ACTS, REQUEST_TEMPLATES))
    if family == "risky_benign":
        return hh(_instructed(rng, request_prompt(rng, RISKY_BENIGN, REQUEST_TEMPLATES), one_word=False))
    return _multiturn_prompt(rng)


def check_split(split: str) -> None:
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")


def sample_prompts(split: str, n: int, seed: int) -> list[str]:
    """`n` distinct prompts of `split` from the dataset distribution (e.g. to sample a policy on)."""
    check_split(split)
    rng, prompts = random.Random(f"prompts/{split}/{seed}"), {}
    for _ in range(100 * n + 10_000):  # bounded: the prompt space is finite
        if len(prompts) == n:
            break
        prompt = sample_prompt(rng)
        if prompt_split(prompt) == split:
            prompts[prompt] = None
    if len(prompts) < n:
        raise ValueError(f"found only {len(prompts)} distinct {split} prompts; ask for fewer than n={n}")
    return list(prompts)
