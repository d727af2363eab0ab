"""The whole pipeline through `python -m rlhf.pipeline` (what run_all.sh runs): every stage, then eval and report."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import REPO, TINY_TEST_OVERRIDES, read_summary

pytestmark = pytest.mark.slow

# Few RL iterations and small evaluation sets: this checks the stages fit together, not how well they align.
PIPELINE_OVERRIDES = [
    *TINY_TEST_OVERRIDES,
    "ppo.total_episodes=64",
    "ppo.batch_size=32",
    "ppo.eval_prompts=16",
    "grpo.total_episodes=64",
    "grpo.batch_size=32",
    "grpo.eval_prompts=16",
    "raft.rounds=2",
    "raft.prompts_per_round=32",
    "raft.eval_prompts=16",
    "dpo.max_train_pairs=128",
    "dpo.eval_prompts=16",
    "online_dpo.total_episodes=128",
    "online_dpo.batch_size=32",
    "online_dpo.eval_prompts=16",
    "eval.num_prompts=40",
    "eval.best_of_n=4",
    "eval.best_of_n_prompts=10",
    "eval.batch_size=64",
]


@pytest.fixture(scope="module")
def full_run(tiny_run, tmp_path_factory):
    run = tmp_path_factory.mktemp("pipeline") / "run"
    shutil.copytree(tiny_run, run)
    env = {key: value for key, value in os.environ.items() if key != "OPENAI_API_KEY"}
    result = subprocess.run(
        [sys.executable, "-m", "rlhf.pipeline", "--preset", "tiny", "--output-dir", str(run), *PIPELINE_OVERRIDES],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=1500,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return run, result.stdout


def test_completed_upstream_stages_are_skipped(full_run):
    _, stdout = full_run
    for stage in ("data", "sft", "reward"):
        assert f"[{stage}] already complete" in stdout


def test_eval_measures_every_policy_the_same_way(full_run):
    run, _stdout = full_run
    evaluation = read_summary(run)["eval"]
    assert set(evaluation["models"]) == {"sft", "ppo", "grpo", "raft", "dpo", "online_dpo", "best_of_4"}
    for name, metrics in evaluation["models"].items():
        for key in (
            "reward_mean",
            "reward_std",
            "kl_to_ref",
            "length_mean",
            "eos_rate",
            "distinct_2",
            "gold_score_mean",
        ):
            assert isinstance(metrics[key], float), (name, key)
        assert metrics["n"] == (10 if name == "best_of_4" else 40)
    assert evaluation["models"]["sft"]["kl_to_ref"] == 0.0
    assert evaluation["models"]["best_of_4"]["kl_to_ref"] == pytest.approx(1.3862944 - 0.75)
    for model in ("ppo", "grpo", "raft", "dpo", "online_dpo", "best_of_4"):
        rates = evaluation["win_rates"]["gold"][f"{model}_vs_sft"]
        assert 0.0 <= rates["win_rate"] <= 1.0 and rates["ci95_low"] <= rates["win_rate"] <= rates["ci95_high"]
        assert "lc_win_rate" in rates
    assert "ppo_vs_dpo" in evaluation["win_rates"]["reward"] and "sft_vs_chosen" in evaluation["win_rates"]["gold"]
    assert evaluation["judges"]["openai"]["status"] == "skipped: OPENAI_API_KEY is not set"
    reward_vs_gold = evaluation["judge_agreement"]["reward_vs_gold"]
    by_difference = reward_vs_gold["by_gold_difference"]
    assert set(by_difference) <= {"capability", "content", "flags", "verbosity"}
    assert sum(entry["n_decisive"] for entry in by_difference.values()) == reward_vs_gold["n_decisive"]
    assert set(evaluation["suites"]) >= {"sycophancy", "ood", "harmful", "capability"}
    # Same decoding and seed for every model; each model's responses are on disk.
    assert evaluation["decoding"]["seed"] == 1234
    for name in evaluation["models"]:
        rows = [json.loads(line) for line in (run / "eval" / "responses" / f"{name}.jsonl").read_text().splitlines()]
        assert len(rows) == evaluation["models"][name]["n"] and "gold_score" in rows[0]


def test_report_is_written_with_its_figures(full_run):
    run, _ = full_run
    text = (run / "report.md").read_text()
    for figure in ("reward_vs_kl", "win_rates", "training_curves", "reward_distributions", "response_lengths"):
        assert (run / "report" / f"{figure}.png").stat().st_size > 5000
        assert f"(report/{figure}.png)" in text
    ppo_win = read_summary(run)["eval"]["win_rates"]["gold"]["ppo_vs_sft"]["win_rate"]
    assert f"{ppo_win:.3f}" in text
    assert "timing_s" in read_summary(run) and "report" in read_summary(run)["timing_s"]
