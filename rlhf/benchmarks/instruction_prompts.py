"""Training prompts for RL from verifiable rewards on instruction following (Tülu 3, Lambert et al. 2024, §6): a
base request with one to three instructions that IFEval's checkers can verify, each written by the checker's own
generator (`build_description` with random arguments: how IFEval's instructions were made, Zhou et al. 2023 §2).

The base requests are written here, not taken from IFEval: writing tasks (`TASKS`) over everyday subjects
(`SUBJECTS`), rendered as "<task> <instruction> <instruction>". Training and validation prompts use disjoint
subjects, and `ifeval_overlap` checks that no base request shares an 8-word run with an IFEval prompt (the
instructions' own sentences are IFEval's by construction: they come from the same generators). IFEval's 541
prompts stay the test.
"""

from __future__ import annotations

import random
import re
import zlib
from collections.abc import Sequence

from rlhf.benchmarks.ifeval import InstructionPrompt, conflicts, registry

TASKS = (
    "Write a short article for a blog about {}.",
    "Write a poem about {}.",
    "Write a short story that involves {}.",
    "Explain {} to a ten-year-old.",
    "Write an email to a friend about {}.",
    "Give me some advice about {}.",
    "Write a product description for something related to {}.",
    "Write a short essay on {}.",
    "Describe {} to someone who has never heard of it.",
    "Write a limerick about {}.",
    "Write a letter to the editor of a local newspaper about {}.",
    "Write a speech for a school assembly about {}.",
    "List some interesting facts about {}.",
    "Write a dialogue between two friends discussing {}.",
    "Write a review of a book about {}.",
    "Write a social media post announcing an event about {}.",
    "Write a riddle whose answer is related to {}.",
    "Write a diary entry about a day spent on {}.",
    "Write the opening paragraph of a novel about {}.",
    "Summarize the pros and cons of {}.",
    "Write a song about {}.",
    "Write a short guide for beginners on {}.",
    "Write a job advertisement for a role that involves {}.",
    "Write a thank-you note to a teacher who taught you about {}.",
    "Write a short news report about {}.",
)

SUBJECTS = (
    "gardening in a small apartment", "learning to play the guitar", "a rainy day in the city", "the history of bread",
    "keeping bees", "training a puppy", "the first day at a new job", "saving money on groceries",
    "a trip to the mountains", "how volcanoes form", "recycling plastic", "the life of a lighthouse keeper",
    "cooking pasta from scratch", "a lost cat that finds its way home", "the moon landing", "learning a new language",
    "running a marathon", "a village bakery", "the importance of sleep", "building a birdhouse",
    "a robot that learns to paint", "the water cycle", "a summer camp", "how bicycles work",
    "the smell of old books", "a chess tournament", "planting trees", "an old family recipe",
    "a solar eclipse", "moving to a new town", "the ocean at night", "a school science fair",
    "the invention of the telephone", "composting kitchen waste", "a winter festival", "the life of honeybees",
    "learning to swim as an adult", "a street musician", "the rings of Saturn", "knitting a scarf",
    "a night train across the country", "the first snowfall of the year", "a neighbourhood library",
    "public transport in big cities", "a talking parrot", "making homemade ice cream", "the Great Barrier Reef",
    "a power outage", "an antique clock", "the benefits of walking", "a family road trip", "how rainbows form",
    "a friendly dragon", "writing letters by hand", "the Olympic Games", "a farmers market", "caring for houseplants",
    "the history of chocolate", "a hot air balloon ride", "starting a small business", "a museum of strange objects",
    "wild mushrooms", "a rescue dog", "the northern lights", "a kitchen renovation", "learning to code",
    "a time capsule", "desert animals", "a picnic in the park", "the future of electric cars",
    "a forgotten island", "making friends in a new school", "the art of origami", "a thunderstorm",
    "a coffee shop that never closes", "the migration of birds", "a board game night", "fixing a leaky tap",
    "a penguin colony", "the history of the printing press", "a lemonade stand", "stargazing",
    "an unusual pet", "a city without cars", "the joy of baking", "a mountain village", "ancient Egypt",
    "a broken umbrella", "volunteering at an animal shelter", "the science of cooking eggs",
)  # fmt: skip
MAX_INSTRUCTIONS = 3


def all_base_requests() -> list[str]:
    """Every base request the prompts can start with: each task over each subject."""
    return [task.format(subject) for task in TASKS for subject in SUBJECTS]


def subject_split(subject: str, val_fraction: float) -> str:
    """'val' for a stable share of subjects (by CRC32), 'train' for the rest: no subject is in both."""
    return "val" if zlib.crc32(subject.encode()) % 1000 < val_fraction * 1000 else "train"


def build_instruction_prompts(n: int, split: str, val_fraction: float, seed: int) -> list[InstructionPrompt]:
    """`n` prompts of `split` ('train' or 'val'), each a base request with 1-3 instructions (the count and the types
    drawn uniformly, no two that IFEval's table says conflict), deterministic in (seed, split, index)."""
    subjects = [s for s in SUBJECTS if subject_split(s, val_fraction) == split]
    if not subjects:
        raise ValueError(f"no subject falls in split {split!r} at val_fraction={val_fraction}")
    checkers, conflict = registry(), conflicts()
    ids = sorted(checkers)
    rows = []
    state = random.getstate()  # the checkers' generators draw from the global stream: seed it, then give it back
    try:
        for index in range(n):
            random.seed(f"{seed}/{split}/{index}")
            base = random.choice(TASKS).format(random.choice(subjects))
            chosen: list[str] = []
            for _ in range(random.randint(1, MAX_INSTRUCTIONS)):
                allowed = [i for i in ids if not any(i in conflict[c] or c in conflict[i] for c in chosen)]
                if not allowed:
                    break
                chosen.append(random.choice(allowed))
            descriptions, kwargs = [], []
            for instruction_id in chosen:
                checker = checkers[instruction_id](instruction_id)
                if instruction_id == "combination:repeat_prompt":
                    descriptions.append(checker.build_description(prompt_to_repeat=base))
                else:
                    descriptions.append(checker.build_description())
                kwargs.append({k: v for k, v in (checker.get_instruction_args() or {}).items() if v is not None})
            prompt = " ".join([base, *descriptions])
            rows.append(InstructionPrompt(f"{split}-{index}", prompt, tuple(chosen), tuple(kwargs)))
    finally:
        random.setstate(state)
    return rows


def _word_runs(text: str, n: int) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z0-9']+", text.lower())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def ifeval_overlap(base_texts: Sequence[str], ifeval_prompts: Sequence[str], n: int = 8) -> dict:
    """How many base requests equal an IFEval prompt, or share an n-word run with one: the leak check."""
    test = {" ".join(p.lower().split()) for p in ifeval_prompts}
    runs = set().union(*(_word_runs(p, n) for p in ifeval_prompts))
    exact = sum(" ".join(t.lower().split()) in test for t in base_texts)
    shared = sum(bool(_word_runs(t, n) & runs) for t in base_texts)
    return {"n": len(base_texts), "exact": exact, f"shared_{n}_word_run": shared}
