"""Stage `judge_rm`: the independent judge's reward model, for data without a gold judge.

    python part4_eval/train_judge_rm.py --preset smollm2-hh

A second Bradley-Terry reward model, trained exactly as the reward stage's (section `reward`, same SFT
initialisation), but on `<run>/data/judge.jsonl`: the pairs data.judge_fraction holds out, which neither the
training reward model nor any policy sees. Optimising the training reward model cannot fool it the way it
fools that model itself, so eval uses it as the `independent` judge, the way Gao et al. 2022 (arXiv 2210.10760)
used a gold reward model. Writes `<run>/judge_rm/model/` and `judge_reward_model` in summary.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlhf, even under another clone's .venv

from rlhf.methods.rules import STAGE_RULES
from rlhf.stage.cli import answer_early, run_stage

if __name__ == "__main__":
    answer_early("judge_rm", STAGE_RULES["judge_rm"])  # --help and config errors at once, before torch loads below

from part1_reward import train_reward


def main(argv: list[str] | None = None) -> None:
    train_reward.main(argv, stage="judge_rm")


if __name__ == "__main__":
    run_stage(main)
