"""Example reward functions for `ppo.reward` / `grpo.reward` (rlhf/rollout/reward_spec.py explains the spec).

A reward function is plain Python: it takes the batch's prompts and responses as text and returns
one float per response. Use one alone or beside the reward model:

    python part2_ppo_grpo/train_grpo.py --preset tiny grpo.reward=rlhf.rollout.reward_functions:concise_sentence
    python part2_ppo_grpo/train_ppo.py --preset tiny \
        "ppo.reward=model + 0.5*rlhf.rollout.reward_functions:concise_sentence"

Your own goes in any importable module (a file next to where you run the command works), named as
`module:function`. Keep it deterministic and cheap: it runs on every rollout batch. A function that also takes
keyword arguments is given the prompt rows' other columns by name (all of them with **kwargs), as TRL gives its
reward functions the dataset's columns: `ifeval_instructions` reads each prompt's instruction ids and arguments.
"""

from __future__ import annotations

import re

from rlhf.benchmarks.ifeval import instruction_reward

MAX_WORDS = 30  # longer answers count as rambling (the embedded task's gold judge draws the same line)
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*$")  # a final . ! or ?, optionally inside closing quotes or brackets


def concise_sentence(prompts: list[str], responses: list[str]) -> list[float]:
    """A format reward in the spirit of DeepSeek-R1's rule-based format rewards: 0.5 for ending on
    sentence punctuation, plus 0.5 for saying it in at most MAX_WORDS words. An empty response
    scores 0. The prompts are not used: the reward judges form, not content."""
    scores = []
    for response in responses:
        text = response.strip()
        ends_sentence = bool(_SENTENCE_END.search(text))
        concise = 0 < len(text.split()) <= MAX_WORDS
        scores.append(0.5 * ends_sentence + 0.5 * concise)
    return scores


def ifeval_instructions(
    prompts: list[str], responses: list[str], instruction_id_list: list[list[str]], kwargs: list[list[dict]]
) -> list[float]:
    """RL from verifiable rewards for instruction following (Tülu 3, Lambert et al. 2024, §6): the share of each
    prompt's instructions that IFEval's strict checker passes, in [0, 1]. Needs the verifiable instruction prompts
    (data.instructions.n_train > 0), whose rows carry instruction_id_list and kwargs:

        python part2_ppo_grpo/train_grpo.py --preset smollm2-ifeval \
            grpo.reward=rlhf.rollout.reward_functions:ifeval_instructions
    """
    fields = [{"instruction_id_list": ids, "kwargs": args} for ids, args in zip(instruction_id_list, kwargs)]
    return instruction_reward(fields, prompts, [response.strip() for response in responses])
