"""End to end through the real command line with `rollout.engine=vllm` (vLLM's CPU build, in the .venv-vllm that
run_tests.sh builds): GRPO trains with the weights pushed into the engine every iteration, logs the engine-vs-trainer
log-prob mismatch, and ends where the hf engine ends at the same budget, within sampling error; PPO, with
truncated importance sampling on, is killed after a checkpoint and resumes to the weights of an uninterrupted run;
GRPO on two processes, one engine each, matches one process; and collect, RAFT, online DPO and the evaluation
sample through the engine too."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from conftest import TINY_TEST_OVERRIDES, kill_at_first_checkpoint, read_summary, run_script
from safetensors.torch import load_file
from test_distributed import assert_runs_match, metric_rows, run_stage
from test_engines import needs_vllm
from test_ppo_grpo_e2e import FAST, SCRIPTS

pytestmark = [pytest.mark.slow, *needs_vllm]
VLLM = ["rollout.engine=vllm", "rollout.cpu_kv_cache_mb=128"]


def eval_rewards(run) -> tuple[list[float], list[float]]:
    rows = [json.loads(line) for line in (run / "grpo" / "eval_samples.jsonl").read_text().splitlines()]
    return [row["reward"] for row in rows], [row["prompt"] for row in rows]


def test_grpo_through_vllm_logs_the_mismatch_and_ends_where_hf_ends(tiny_run, tmp_path):
    runs = {}
    for engine in ("hf", "vllm"):
        runs[engine] = tmp_path / engine
        shutil.copytree(tiny_run, runs[engine])
        extra = VLLM if engine == "vllm" else []
        run_script(SCRIPTS["grpo"], runs[engine], *TINY_TEST_OVERRIDES, *FAST["grpo"], "grpo.eval_every=0", *extra)

    rows = [json.loads(line) for line in (runs["vllm"] / "grpo" / "metrics.jsonl").read_text().splitlines()]
    iterations = [row for row in rows if "grpo/objective/scores" in row]
    assert len(iterations) == 8
    # Every iteration logs how far the engine's log-probs are from the trainer's; in float32 they agree to
    # rounding, so the weights pushed each iteration are the ones trained (a stale engine would drift away).
    assert all(row["grpo/rollout/logprob_abs_diff"] < 1e-3 for row in iterations), iterations
    assert all(0 <= row["grpo/rollout/mismatch_kl"] < 1e-4 for row in iterations)
    hf_rows = (runs["hf"] / "grpo" / "metrics.jsonl").read_text()
    assert "grpo/rollout/logprob_abs_diff" not in hf_rows  # hf samples from the trainer's own model

    summaries = {engine: read_summary(run)["grpo"] for engine, run in runs.items()}
    for results in summaries.values():
        assert results["reward_mean"] > results["sft_reward_mean"], results
    # The two engines draw different random numbers: compare the final policies' rewards on the same held-out
    # prompts, paired, against the standard error of the per-prompt differences.
    (hf, prompts), (vllm, vllm_prompts) = eval_rewards(runs["hf"]), eval_rewards(runs["vllm"])
    assert prompts == vllm_prompts
    differences = torch.tensor(vllm) - torch.tensor(hf)
    standard_error = differences.std().item() / math.sqrt(len(differences))
    assert abs(differences.mean().item()) < 3 * standard_error, (differences.mean().item(), standard_error)


def test_killed_ppo_through_vllm_resumes_to_the_same_weights(tiny_run, tmp_path):
    overrides = [
        *TINY_TEST_OVERRIDES,
        *FAST["ppo"],
        *VLLM,
        "rollout.tis_cap=2",
        "ppo.total_episodes=64",
        "ppo.batch_size=16",
        "ppo.save_every=2",
        "ppo.eval_prompts=8",
        "ppo.eval_every=0",
    ]
    runs = {}
    for name in ("killed", "straight"):
        runs[name] = tmp_path / name
        shutil.copytree(tiny_run, runs[name])
    kill_at_first_checkpoint(SCRIPTS["ppo"], runs["killed"], "ppo", *overrides)

    resumed = run_script(SCRIPTS["ppo"], runs["killed"], *overrides)
    assert "resumed from iteration" in resumed.stdout
    assert read_summary(runs["killed"])["ppo"]["iterations"] == 4
    run_script(SCRIPTS["ppo"], runs["straight"], *overrides)
    a = load_file(runs["killed"] / "ppo" / "model" / "model.safetensors")
    b = load_file(runs["straight"] / "ppo" / "model" / "model.safetensors")
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
    rows = [json.loads(line) for line in (runs["straight"] / "ppo" / "metrics.jsonl").read_text().splitlines()]
    assert all(row["ppo/rollout/logprob_abs_diff"] < 1e-3 for row in rows if "ppo/objective/scores" in row)


def test_every_other_sampler_runs_through_vllm(tiny_run, tmp_path):
    """Collect, RAFT, online DPO and the evaluation (best-of-N and the suites included) sample through the engine."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    stages = {
        "part1_reward/collect_pairs.py": ["collect.prompts=16"],
        "part2_ppo_grpo/train_raft.py": ["raft.rounds=1", "raft.prompts_per_round=32", "raft.eval_prompts=8"],
        "part3_dpo/train_online_dpo.py": ["online_dpo.total_episodes=64", "online_dpo.eval_prompts=8"],
        "part4_eval/evaluate.py": [
            "eval.num_prompts=8",
            "eval.best_of_n=2",
            "eval.best_of_n_prompts=2",
            "eval.judges=gold,reward",
            "eval.suite_prompts=2",
        ],
    }
    every = [override for overrides in stages.values() for override in overrides]  # one config, as a pipeline has
    for script in stages:
        run_script(script, run, *TINY_TEST_OVERRIDES, *VLLM, *every)
    summary = read_summary(run)
    assert summary["collect"]["samples"] == 64 and summary["collect"]["n_pairs"] > 0
    assert summary["raft"]["eval_prompts"] == summary["online_dpo"]["eval_prompts"] == 8
    answered = {path.stem for path in (run / "eval" / "responses").iterdir()}
    assert {"sft", "raft", "online_dpo", "best_of_2"} <= answered
    gold = json.loads((run / "eval" / "win_rates.json").read_text())["gold"]
    assert {"raft_vs_sft", "online_dpo_vs_sft", "best_of_2_vs_sft"} <= set(gold)
    assert sorted(path.name for path in (run / "eval" / "suites").iterdir())  # the suites were answered


@pytest.fixture(scope="module")
def one_process_grpo(tiny_run, tmp_path_factory):
    """test_distributed's GRPO run through vLLM in one process: what two processes are compared with."""
    out = tmp_path_factory.mktemp("vllm_grpo") / "single"
    run_stage("single", "grpo", tiny_run, out, extra=tuple(VLLM))
    return out


@pytest.mark.parametrize("launcher", ["ddp", "fsdp"])
def test_grpo_through_vllm_on_two_processes_matches_one_process(tiny_run, one_process_grpo, tmp_path, launcher):
    """One engine per process (vLLM's external launcher over the run's process group), each sampling its own rows
    from their own seeds and given the full weights (under FSDP, gathered from the shards): two processes draw what
    one draws, so test_distributed's comparison holds as it does for `hf`. All but the engine-vs-trainer mismatch,
    which measures the engine's rounding: that depends on the batch the engine ran (measured: a largest difference
    of 1.25e-4 on two processes, 1.16e-4 on one)."""
    shutil.copytree(one_process_grpo, tmp_path / "single")
    run_stage(launcher, "grpo", tiny_run, tmp_path / launcher, extra=tuple(VLLM), master_port=29541)
    mismatch = ("grpo/rollout/logprob_abs_diff", "grpo/rollout/logprob_abs_diff_max", "grpo/rollout/mismatch_kl")
    assert_runs_match(tmp_path, "grpo", unmatched=mismatch, several=launcher)
    iterations = [row for row in metric_rows(tmp_path / launcher, "grpo") if "grpo/objective/scores" in row]
    assert iterations and all(row["grpo/rollout/logprob_abs_diff"] < 1e-3 for row in iterations)
