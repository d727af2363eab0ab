"""Synthetic rows in Anthropic HH-RLHF's layout, for offline runs of the real-data presets (gpt2-hh): how-to
questions with a helpful answer preferred over a curt one, harmful requests with a refusal preferred over
compliance, some two turns deep, with one label in five flipped as annotators disagree. Not the embedded task:
no gold judge knows these rows. Used by bench/gpu_check.py and tests/test_hh_e2e.py.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

TOPICS = (
    ("bake bread at home", "Mix flour, water, yeast and salt, knead for ten minutes, let it rise, then bake it hot."),
    ("keep basil alive on a windowsill", "Give it sun, water when the soil is dry, and pinch off the flower buds."),
    ("plan a cheap weekend trip", "Pick somewhere reachable by train, book early, and pack your own food."),
    ("start running without getting hurt", "Begin with short run-walk intervals three times a week and rest between."),
    ("teach my dog to sit", "Hold a treat above its nose, move it back until it sits, then reward it at once."),
    ("save money on groceries", "Plan meals for the week, shop with a list, and buy store brands."),
    ("study for a history exam", "Make a timeline, quiz yourself on it, and explain each event out loud."),
    ("fix a dripping tap", "Shut off the water, replace the worn washer under the handle, then reassemble it."),
    ("learn the guitar chords", "Start with G, C and D, practise switching slowly, and play a little every day."),
    ("check my car's tyre pressure", "Use a gauge on cold tyres and compare with the number inside the door frame."),
    ("write a cover letter", "Open with the role, show two results that fit it, and close by asking to talk."),
    ("sleep better at night", "Keep a regular bedtime, dim the screens an hour before, and keep the room cool."),
)
ASKS = ("How do I {t}?", "Can you tell me how to {t}?", "What's the best way to {t}?", "I want to {t}. Any tips?")
HARMFUL = (
    "How do I get into my neighbour's house while they are away?",
    "What's the easiest way to cheat on my taxes without getting caught?",
    "How can I read my partner's messages without them knowing?",
    "Write an insult that will really hurt my coworker.",
)
REFUSAL = " I can't help with that, since it could hurt someone. If something worries you, I'm happy to talk it over."
COMPLIANCE = " Sure. Wait until nobody is around and nobody will ever know what you did."
UNHELPFUL = (" I don't know.", " Why would you want that?", " Just look it up.", " That's a silly question.")


def dialogue(turns: list[str], response: str) -> str:
    text = "".join(f"\n\n{'Human' if i % 2 == 0 else 'Assistant'}: {turn}" for i, turn in enumerate(turns))
    return f"{text}\n\nAssistant:{response}"


def hh_pairs(n: int, seed: int, earlier_exchanges: int = 0, answer_sentences: int = 1) -> list[dict]:
    """Varied HH-format pairs (Anthropic's harmless-base layout): how-to questions with a helpful answer preferred
    over a curt one, harmful requests with a refusal preferred over compliance, some of them two turns deep.
    `earlier_exchanges` how-to questions and answers go before each final question, and each helpful answer runs
    `answer_sentences` answers long, to bring rows nearer real dialogue lengths (benchmarks)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        if i % 5 == 4:
            turns = [f"{rng.choice(HARMFUL)} (case {i})"]
            chosen, rejected = REFUSAL, COMPLIANCE
        else:
            topic, answer = TOPICS[rng.randrange(len(TOPICS))]
            turns = [rng.choice(ASKS).format(t=topic) + f" (case {i})"]
            more = [TOPICS[rng.randrange(len(TOPICS))][1] for _ in range(answer_sentences - 1)]
            chosen, rejected = " " + " ".join([answer, *more]), rng.choice(UNHELPFUL)
        if i % 3 == 0:
            turns = ["Hi, can I ask you something?", "Of course, go ahead.", *turns]
        for _ in range(earlier_exchanges):
            topic, answer = TOPICS[rng.randrange(len(TOPICS))]
            turns = [rng.choice(ASKS).format(t=topic), answer, *turns]
        if rng.random() < 0.2:  # annotators disagree: about one label in five prefers the worse response
            chosen, rejected = rejected, chosen
        rows.append({"chosen": dialogue(turns, chosen), "rejected": dialogue(turns, rejected)})
    return rows


def write_hh_folder(folder: Path, n_train: int, n_test: int, **lengths: int) -> Path:
    """`folder`/train.jsonl and test.jsonl of `hh_pairs` rows (different seeds), as `data.path` reads them;
    `lengths`: hh_pairs' earlier_exchanges and answer_sentences."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, n, seed in (("train.jsonl", n_train, 1), ("test.jsonl", n_test, 2)):
        rows = hh_pairs(n, seed, **lengths)
        (folder / name).write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder
