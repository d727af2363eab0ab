"""End-to-end through the real command line: PPO and GRPO on the (reduced) tiny preset.

Each stage runs once on a copy of the session's `tiny_run` (data -> sft -> reward); the tests then
check behaviour: the reward-model score rose over SFT on held-out prompts, the frozen roles did
not change while the policy did, the outputs are complete (held-out evaluations along training
included), a killed run resumes to the same weights, a reward function (alone or summed with the
reward model) is the training score, and bad settings fail in one line before any model loads.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import TINY_TEST_OVERRIDES, kill_at_first_checkpoint, read_summary, run_script
from safetensors.torch import load_file

pytestmark = pytest.mark.slow

# Few, small iterations: enough for the RM score to move, short enough for the test budget.
FAST = {
    "ppo": [
        "ppo.total_episodes=256",
        "ppo.batch_size=32",
        "ppo.micro_batch_size=16",
        "ppo.forward_batch_size=64",
        "ppo.epochs=2",
        "ppo.lr=1e-4",
        "ppo.value_lr=1e-3",
        "ppo.max_new_tokens=24",
        "ppo.eval_prompts=64",
        "ppo.samples_every=4",
        "ppo.save_every=0",
        "ppo.cpu_threads=1",
        "ppo.eval_every=4",
    ],
    "grpo": [
        "grpo.total_episodes=256",
        "grpo.batch_size=32",
        "grpo.group_size=4",
        "grpo.micro_batch_size=16",
        "grpo.forward_batch_size=64",
        "grpo.lr=1e-4",
        "grpo.max_new_tokens=24",
        "grpo.eval_prompts=64",
        "grpo.samples_every=4",
        "grpo.save_every=0",
        "grpo.cpu_threads=1",
        "grpo.eval_every=4",
    ],
}
SCRIPTS = {"ppo": "part2_ppo_grpo/train_ppo.py", "grpo": "part2_ppo_grpo/train_grpo.py"}
METRICS = {
    "ppo": [
        "objective/kl",
        "objective/entropy",
        "objective/non_score_reward",
        "objective/rlhf_reward",
        "objective/scores",
        "policy/approxkl",
        "policy/clipfrac",
        "val/loss",
        "val/clipfrac",
        "val/explained_variance",
        "responses/length_mean",
        "responses/eos_rate",
        "responses/length_score_corr",
        "time/generate_s",
        "time/score_s",
        "time/train_s",
        "time/tokens_per_s",
        "memory/peak_mb",
        "gold/score_mean",
    ],
    "grpo": [
        "objective/kl",
        "objective/entropy",
        "objective/scores",
        "objective/zero_std_groups",
        "policy/approxkl",
        "policy/clipfrac",
        "policy/k3_kl",
        "responses/length_mean",
        "responses/eos_rate",
        "responses/length_score_corr",
        "time/generate_s",
        "time/score_s",
        "time/train_s",
        "time/tokens_per_s",
        "memory/peak_mb",
        "gold/score_mean",
    ],
}
SUMMARY_KEYS = [
    "reward_mean",
    "sft_reward_mean",
    "kl_to_ref",
    "length_mean",
    "eos_rate",
    "time_per_sample_ms",
    "peak_memory_mb",
    "peak_memory_source",
    "gold_score_mean",
    "sft_gold_score_mean",
    "gold_good_rate",
    "sft_gold_good_rate",
    "gold_win_rate_vs_sft",
    "gold_wins",
    "gold_losses",
    "gold_ties",
    "eval_prompts",
    "iterations",
    "episodes",
    "reward_source",
]
EVAL_KEYS = ["reward_mean", "kl_to_ref", "gold_score_mean", "length_mean", "eos_rate"]


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def metric_rows(run: Path, stage: str) -> list[dict]:
    return [json.loads(line) for line in (run / stage / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def rl_run(tiny_run, tmp_path_factory):
    """PPO then GRPO on one copy of the tiny run, with the input folders' digests taken before."""
    run = tmp_path_factory.mktemp("rl") / "run"
    shutil.copytree(tiny_run, run)
    before = {name: digest(run / name / "model") for name in ("sft", "reward")}
    outputs = {stage: run_script(SCRIPTS[stage], run, *TINY_TEST_OVERRIDES, *FAST[stage]) for stage in ("ppo", "grpo")}
    return run, before, outputs


@pytest.mark.parametrize("stage", ["ppo", "grpo"])
def test_reward_model_score_rises_over_sft_on_held_out_prompts(rl_run, stage):
    run, _, _ = rl_run
    results = read_summary(run)[stage]
    # Same held-out prompts, sampling settings and seed for both policies.
    assert results["eval_prompts"] > 0
    assert results["reward_mean"] > results["sft_reward_mean"], results
    assert results["kl_to_ref"] > 0


@pytest.mark.parametrize("stage", ["ppo", "grpo"])
def test_frozen_roles_unchanged_and_the_policy_trained(rl_run, stage):
    run, before, _ = rl_run
    assert {
        name: digest(run / name / "model") for name in ("sft", "reward")
    } == before  # files of the reference and the RM
    assert read_summary(run)[stage]["frozen_roles_unchanged"] is True  # in-memory weights, checked by the stage
    sft, trained = (
        load_file(run / "sft" / "model" / "model.safetensors"),
        load_file(run / stage / "model" / "model.safetensors"),
    )
    assert sft.keys() == trained.keys()
    assert any(not torch.equal(sft[k], trained[k]) for k in sft)


@pytest.mark.parametrize("stage", ["ppo", "grpo"])
def test_outputs_metrics_and_summary_are_complete(rl_run, stage):
    from transformers import AutoModelForCausalLM

    run, _, outputs = rl_run
    summary = read_summary(run)
    assert set(SUMMARY_KEYS) <= set(summary[stage]), set(SUMMARY_KEYS) - set(summary[stage])
    assert summary["timing_s"][stage] > 0 and summary[stage]["peak_memory_source"] == "cpu_max_rss"
    rows = [row for row in metric_rows(run, stage) if f"{stage}/objective/scores" in row]
    assert len(rows) == summary[stage]["iterations"] == 256 // 32
    missing = [key for key in METRICS[stage] if f"{stage}/{key}" not in rows[-1]]
    assert not missing
    assert summary[stage]["reward_source"] == "model"
    # Held-out evaluations every 4 iterations and before training; the final one at iteration 8 (same prompts and seed).
    evals = [row for row in metric_rows(run, stage) if f"{stage}/eval/kl_to_ref" in row]
    assert [row["step"] for row in evals] == [0, 4, 8]
    assert all(f"{stage}/eval/{key}" in row for row in evals for key in EVAL_KEYS)
    assert (
        evals[0][f"{stage}/eval/kl_to_ref"] == 0.0
        and evals[-1][f"{stage}/eval/kl_to_ref"] == summary[stage]["kl_to_ref"]
    )
    assert (run / stage / "curves.png").stat().st_size > 10_000
    samples = [json.loads(line) for line in (run / stage / "samples.jsonl").read_text().splitlines()]
    assert samples and {"prompt", "response", "score", "gold_score", "iteration"} <= set(samples[0])
    assert len((run / stage / "eval_samples.jsonl").read_text().splitlines()) == summary[stage]["eval_prompts"]
    assert not (run / stage / "checkpoint").exists() and (run / stage / "complete.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(run / stage / "model")  # plain Hugging Face format
    assert model.config.eos_token_id is not None
    assert "gold win rate vs SFT" in outputs[stage].stdout
    assert f"[{stage}] held-out check: {summary[stage]['eval_prompts']} validation prompts" in outputs[stage].stdout


def test_grpo_without_kl_never_loads_a_reference_but_still_measures_kl_when_evaluating(rl_run, tmp_path):
    """Also the variants' options end to end: DAPO's token normalisation and clip-higher, Dr. GRPO's unscaled
    advantages, RLOO's leave-one-out baseline and GSPO's sequence ratio (their math: test_ops, test_losses)."""
    run = tmp_path / "run"
    shutil.copytree(rl_run[0], run, ignore=shutil.ignore_patterns("ppo", "grpo"))
    result = run_script(
        SCRIPTS["grpo"],
        run,
        *TINY_TEST_OVERRIDES,
        *FAST["grpo"],
        "grpo.kl_coef=0",
        "grpo.total_episodes=64",
        "grpo.eval_prompts=8",
        "grpo.loss_normalization=token",
        "grpo.scale_rewards=false",
        "grpo.clip_high=0.28",
        "grpo.baseline=leave_one_out",
        "grpo.ratio_level=sequence",
        "grpo.eval_every=1",
    )
    assert "reference not loaded (kl_coef=0); SFT policy loaded for evaluation" in result.stdout
    assert read_summary(run)["grpo"]["reference_loaded_for_training"] is False
    rows = [row for row in metric_rows(run, "grpo") if "grpo/objective/scores" in row]
    assert rows and "grpo/objective/kl" not in rows[-1] and rows[-1]["grpo/policy/k3_kl"] == 0.0
    evals = [row for row in metric_rows(run, "grpo") if "grpo/eval/kl_to_ref" in row]
    assert [row["step"] for row in evals] == [0, 1, 2] and evals[0]["grpo/eval/kl_to_ref"] == 0.0
    assert evals[-1]["grpo/eval/kl_to_ref"] != 0.0  # the trained policy, measured against the SFT policy


def test_grpo_trains_the_same_with_and_without_packed_groups_and_with_a_token_budget(rl_run, tmp_path):
    """grpo.pack_groups computes each group's prompt once (rlhf/rollout/packing.py): the same samples, losses and
    weights as separate rows, to float rounding. And grpo.micro_batch_tokens: packed groups of about 55-170 positions
    (prompts of 14-67 tokens and four responses of up to 25) cut by a budget of 160, one or two groups a
    micro-batch (micro_batch_size makes two of four), each weighed by its loss units, train what micro_batch_size
    trains."""
    runs = {}
    for name, sizing in (
        ("packed", []),
        ("rows", ["grpo.pack_groups=false"]),
        ("budget", ["grpo.micro_batch_tokens=160"]),
    ):
        runs[name] = tmp_path / name
        shutil.copytree(rl_run[0], runs[name], ignore=shutil.ignore_patterns("ppo", "grpo"))
        run_script(
            SCRIPTS["grpo"],
            runs[name],
            *TINY_TEST_OVERRIDES,
            *FAST["grpo"],
            "grpo.total_episodes=64",
            "grpo.eval_prompts=8",
            "grpo.eval_every=0",
            *sizing,
        )
    rows = {name: [r for r in metric_rows(run, "grpo") if "grpo/train/loss" in r] for name, run in runs.items()}
    assert len(rows["packed"]) == len(rows["rows"]) == len(rows["budget"]) == 2
    # The layouts and sizings put different rows in a micro-batch (whole groups by packed width, rows by length, or
    # groups by the budget); token means (entropy, k3 KL) are the minibatch's all the same.
    for other in ("rows", "budget"):
        for packed, row in zip(rows["packed"], rows[other]):
            for key, value in row.items():
                if "time" in key or "memory" in key or not isinstance(value, float):
                    continue
                assert packed[key] == pytest.approx(value, rel=1e-4, abs=1e-5), (other, key)
    weights = {name: load_file(run / "grpo" / "model" / "model.safetensors") for name, run in runs.items()}
    for other in ("rows", "budget"):
        for key, tensor in weights[other].items():
            torch.testing.assert_close(weights["packed"][key], tensor, atol=1e-5, rtol=1e-4, msg=f"{other} {key}")


def test_a_ppo_token_budget_trains_as_one_pass_over_each_minibatch(rl_run, tmp_path):
    """ppo.micro_batch_tokens: each minibatch of 32 rollouts (rows of about 20-90 positions: prompts of 14-67 tokens,
    responses of up to 25) cut into micro-batches of at most 256 positions, 3-10 rows each, so several a step,
    each weighed by its response tokens, trains what one pass over the minibatch trains (micro_batch_size = 32)."""
    weights = {}
    for name, sizing in (("one_pass", "ppo.micro_batch_tokens=null"), ("budget", "ppo.micro_batch_tokens=256")):
        run = tmp_path / name
        shutil.copytree(rl_run[0], run, ignore=shutil.ignore_patterns("ppo", "grpo"))
        overrides = [*FAST["ppo"], "ppo.total_episodes=64", "ppo.micro_batch_size=32", "ppo.eval_prompts=8"]
        run_script(SCRIPTS["ppo"], run, *TINY_TEST_OVERRIDES, *overrides, "ppo.eval_every=0", sizing)
        weights[name] = load_file(run / "ppo" / "model" / "model.safetensors")
    for key, one_pass in weights["one_pass"].items():
        torch.testing.assert_close(weights["budget"][key], one_pass, atol=1e-5, rtol=1e-4, msg=key)


@pytest.mark.parametrize(
    "stage, spec, model_weight, function_weight",
    [
        ("grpo", "tests.reward_fixtures:constant_reward", 0.0, 1.0),
        ("ppo", "model + 0.5*tests.reward_fixtures:constant_reward", 1.0, 0.5),
    ],
)
def test_a_reward_function_is_the_training_score(rl_run, tmp_path, stage, spec, model_weight, function_weight):
    from reward_fixtures import CONSTANT

    from rlhf.models.modeling import load_tokenizer

    run = tmp_path / "run"
    shutil.copytree(rl_run[0], run, ignore=shutil.ignore_patterns("ppo", "grpo"))
    calls = tmp_path / "calls.jsonl"
    run_script(
        SCRIPTS[stage],
        run,
        *TINY_TEST_OVERRIDES,
        *FAST[stage],
        f"{stage}.reward={spec}",
        f"{stage}.total_episodes=64",
        f"{stage}.eval_prompts=8",
        f"{stage}.eval_every=0",
        env={"RLHF_TEST_REWARD_LOG": str(calls)},
    )
    assert read_summary(run)[stage]["reward_source"] == spec
    # The function saw each training batch once: prompts ending where the response starts, responses without EOS.
    batches = [json.loads(line) for line in calls.read_text().splitlines()]
    eos = load_tokenizer(run / "sft" / "model").eos_token
    assert [len(b["responses"]) for b in batches] == [32, 32] and all(len(b["prompts"]) == 32 for b in batches)
    assert all(p.endswith("\n\nAssistant:") for b in batches for p in b["prompts"])
    assert not any(eos in r for b in batches for r in b["responses"])
    # score = model_weight * RM + function_weight * CONSTANT - missing-EOS penalty (1.0) x share without EOS
    rows = [row for row in metric_rows(run, stage) if f"{stage}/objective/scores" in row]
    assert len(rows) == 2
    for row in rows:
        assert row[f"{stage}/reward/constant_reward"] == CONSTANT
        rm = row.get(f"{stage}/reward/model", 0.0)
        assert (f"{stage}/reward/model" in row) == (
            model_weight > 0
        )  # the RM scores training batches only when the spec uses it
        expected = model_weight * rm + function_weight * CONSTANT - 1.0 * (1 - row[f"{stage}/responses/eos_rate"])
        assert abs(row[f"{stage}/objective/scores"] - expected) < 1e-5, (row, expected)


def test_a_reward_function_that_breaks_its_contract_stops_the_stage_in_one_line(rl_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(rl_run[0], run, ignore=shutil.ignore_patterns("ppo", "grpo"))
    result = run_script(
        SCRIPTS["grpo"],
        run,
        *TINY_TEST_OVERRIDES,
        *FAST["grpo"],
        "grpo.reward=tests.reward_fixtures:wrong_count",
        "grpo.total_episodes=32",
        "grpo.eval_every=0",
        check=False,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (
        "error: reward function 'tests.reward_fixtures:wrong_count' returned 31 scores for 32 responses; "
        "it must return one float per response, in order\n"
    ) in result.stderr
    assert not (run / "grpo" / "complete.json").exists()


def test_killed_ppo_resumes_to_the_same_weights(rl_run, tmp_path):
    """Kill PPO after a checkpoint, resume, and end where an uninterrupted run ends
    (shared value head, to cover that option)."""
    overrides = [
        *TINY_TEST_OVERRIDES,
        *FAST["ppo"],
        "ppo.total_episodes=128",
        "ppo.batch_size=16",
        "ppo.save_every=2",
        "ppo.eval_prompts=8",
        "ppo.value_model=shared",
    ]
    runs = {}
    for name in ("killed", "straight"):
        runs[name] = tmp_path / name
        shutil.copytree(rl_run[0], runs[name], ignore=shutil.ignore_patterns("ppo", "grpo"))
    kill_at_first_checkpoint(SCRIPTS["ppo"], runs["killed"], "ppo", *overrides)

    resumed = run_script(SCRIPTS["ppo"], runs["killed"], *overrides)
    assert "resumed from iteration" in resumed.stdout
    assert read_summary(runs["killed"])["ppo"]["iterations"] == 8
    run_script(SCRIPTS["ppo"], runs["straight"], *overrides)
    a = load_file(runs["killed"] / "ppo" / "model" / "model.safetensors")
    b = load_file(runs["straight"] / "ppo" / "model" / "model.safetensors")
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


@pytest.mark.parametrize(
    "stage, args, message",
    [
        (
            "grpo",
            ["grpo.batch_size=30", "grpo.group_size=4"],
            "grpo.batch_size=30 must be divisible by grpo.group_size=4",
        ),
        ("ppo", ["ppo.batch_size=32", "ppo.micro_batch_size=12"], "not divisible by ppo.micro_batch_size=12"),
        ("ppo", ["ppo.max_new_tokens=500"], "exceeds the model's"),
        ("ppo", ["ppo.value_model=critic"], "ppo.value_model must be 'separate' or 'shared'"),
        (
            "ppo",
            ["ppo.reward=tests.reward_fixtures:no_such_function"],
            "ppo.reward: module 'tests.reward_fixtures' has no function",
        ),
        ("grpo", ["grpo.reward=model + gold"], "grpo.reward: unknown reward source 'gold'"),
        ("grpo", ["grpo.micro_batch_size=2"], "grpo.pack_groups needs whole groups of grpo.group_size=4"),
    ],
)
def test_bad_batch_sizes_are_one_line_errors_before_any_model_loads(rl_run, tmp_path, stage, args, message):
    run = tmp_path / "run"
    shutil.copytree(rl_run[0], run, ignore=shutil.ignore_patterns("ppo", "grpo"))
    result = run_script(SCRIPTS[stage], run, *TINY_TEST_OVERRIDES, *args, check=False)
    assert result.returncode == 2, result.stderr[-2000:]
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Loading weights" not in result.stdout + result.stderr


# One iteration (PPO, GRPO) or round (RAFT) each; eval_every stays on, so the evaluation before training is due too.
NO_EVAL = {
    "ppo": [*FAST["ppo"], "ppo.total_episodes=32"],
    "grpo": [*FAST["grpo"], "grpo.total_episodes=32"],
    "raft": [
        "raft.rounds=1",
        "raft.prompts_per_round=16",
        "raft.samples_per_prompt=2",
        "raft.top_k=1",
        "raft.batch_size=16",
        "raft.micro_batch_size=16",
        "raft.cpu_threads=1",
        "raft.eval_every=1",
    ],
}
FINAL_EVAL_KEYS = ["reward_mean", "sft_reward_mean", "kl_to_ref", "eos_rate", "gold_score_mean", "gold_win_rate_vs_sft"]


@pytest.mark.parametrize("stage", ["ppo", "grpo", "raft"])
def test_zero_eval_prompts_skip_the_held_out_evaluation(tiny_run, tmp_path, stage):
    """`<stage>.eval_prompts=0` is the way to skip held-out evaluation: the stage trains, publishes and
    says it did not evaluate, with no evaluation results (and no NaN) in summary.json."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    script = SCRIPTS.get(stage, "part2_ppo_grpo/train_raft.py")
    result = run_script(script, run, *TINY_TEST_OVERRIDES, *NO_EVAL[stage], f"{stage}.eval_prompts=0")
    assert f"[{stage}] no held-out evaluation ({stage}.eval_prompts=0)" in result.stdout.splitlines()
    summary = read_summary(run)
    assert summary[stage]["eval_prompts"] == 0 and summary[stage]["episodes"] > 0
    assert not set(FINAL_EVAL_KEYS) & set(summary[stage]), summary[stage]
    assert "NaN" not in (run / "summary.json").read_text()
    assert summary["cpu_threads"][stage] == 1  # the stage's cpu_threads, beside its timing_s entry
    assert not any(f"{stage}/eval/reward_mean" in row for row in metric_rows(run, stage))
    assert (run / stage / "eval_samples.jsonl").read_text() == ""
    assert (run / stage / "complete.json").is_file() and (run / stage / "model" / "model.safetensors").is_file()
