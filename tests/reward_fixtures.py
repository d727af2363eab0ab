"""Reward functions for the end-to-end tests: `ppo.reward=tests.reward_fixtures:constant_reward`.

The stage scripts run from the repository root, so `tests.reward_fixtures` imports there. Each call
is appended to the JSONL file named by RLHF_TEST_REWARD_LOG (when set), so a test can check what
the stage passed in.
"""

from __future__ import annotations

import json
import os

CONSTANT = 0.25


def constant_reward(prompts: list[str], responses: list[str]) -> list[float]:
    """CONSTANT for every response: a training score the test can predict exactly."""
    log = os.environ.get("RLHF_TEST_REWARD_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"prompts": prompts, "responses": responses}) + "\n")
    return [CONSTANT] * len(responses)


def wrong_count(prompts: list[str], responses: list[str]) -> list[float]:
    """One score too few: the stage must stop with a one-line error naming this function."""
    return [0.0] * (len(responses) - 1)
