"""Online DPO: the pair rule, the plan and config rules by hand (rlhf/methods/online_dpo.py), and the stage end to end
through its real command line (part3_dpo/train_online_dpo.py) on a copy of the session's tiny run."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from conftest import TINY_TEST_OVERRIDES, kill_at_first_checkpoint, read_summary, run_script
from safetensors.torch import load_file

from rlhf.core.errors import UserError
from rlhf.loop.step import accumulation_weights
from rlhf.methods.online_dpo import (
    best_worst_pairs,
    pair_indices_to_rows,
    plan_online_dpo,
    split_micro_batches,
)
from rlhf.methods.rules import check_online_dpo_config
from rlhf.stage.schema import OnlineDPOConfig

SCRIPT = "part3_dpo/train_online_dpo.py"
# 4 iterations x 16 prompts x K = 2, one DPO step each.
FAST = [
    "online_dpo.total_episodes=128",
    "online_dpo.batch_size=32",
    "online_dpo.micro_batch_size=8",
    "online_dpo.lr=1e-4",
    "online_dpo.eval_prompts=32",
    "online_dpo.save_every=1",
    "online_dpo.samples_every=1",
]


# ---------------------------------------------------------------- pure parts


def test_best_worst_pairs_by_hand():
    scores = torch.tensor([[0.1, 0.9, 0.5], [0.3, 0.3, 0.3], [2.0, -1.0, 2.0]])
    chosen, rejected, has_pair = best_worst_pairs(scores)
    assert chosen.tolist() == [1, 0, 0]  # the first maximum on a tie
    assert rejected.tolist() == [0, 0, 1]
    assert has_pair.tolist() == [True, False, True]  # all equal: no preference
    chosen_rows, rejected_rows = pair_indices_to_rows(chosen, rejected, has_pair, K=3)
    assert chosen_rows == [1, 6] and rejected_rows == [0, 7]  # prompt 2's rows are 6, 7, 8


def test_split_micro_batches_near_equal_sizes():
    assert [len(r) for r in split_micro_batches(10, 4)] == [4, 3, 3]
    assert [list(r) for r in split_micro_batches(5, 8)] == [[0, 1, 2, 3, 4]]
    assert split_micro_batches(0, 4) == []
    assert [len(r) for r in split_micro_batches(32, 16)] == [16, 16]


def test_online_dpo_weights_every_pair_of_every_process_alike():
    # one process, 10 pairs in chunks of 4, 3, 3: each chunk's mean loss weighs its share of the pairs
    assert accumulation_weights([4, 3, 3], 10 / 1) == pytest.approx([0.4, 0.3, 0.3])
    # two processes keeping 7 and 3 of those pairs (5 per process): DDP averages their gradients, so each process's
    # weights sum to 2 x its share, and a pair's weight in the average, weight / size / 2, is 1/10 on both
    first, second = accumulation_weights([4, 3], 10 / 2), accumulation_weights([3], 10 / 2)
    assert first == pytest.approx([0.8, 0.6]) and second == pytest.approx([0.6])
    assert [w / n / 2 for w, n in zip(first + second, [4, 3, 3])] == pytest.approx([0.1] * 3)


def test_plan_by_hand():
    plan = plan_online_dpo(OnlineDPOConfig(total_episodes=2048, batch_size=64, samples_per_prompt=2), 2, 1000)
    assert (plan.iterations, plan.prompts_per_iteration, plan.local_prompts, plan.optimizer_steps) == (32, 32, 16, 32)
    with pytest.raises(UserError, match=re.escape("multiple of online_dpo.samples_per_prompt=4")):
        plan_online_dpo(OnlineDPOConfig(batch_size=30, samples_per_prompt=4), 1, 1000)
    with pytest.raises(UserError, match="not divisible by 3 processes"):
        plan_online_dpo(OnlineDPOConfig(batch_size=64), 3, 1000)
    with pytest.raises(UserError, match="fewer than the 32 needed"):
        plan_online_dpo(OnlineDPOConfig(batch_size=64), 1, 10)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"judge": "gold"}, "online_dpo.judge='gold' is not one of"),
        ({"reference": "base"}, "online_dpo.reference='base' is not one of"),
        ({"samples_per_prompt": 1}, "must be at least 2"),
        ({"judge": "simulated", "samples_per_prompt": 4}, "set online_dpo.samples_per_prompt=2"),
        ({"loss_type": "ipo", "length_heuristic": 0.2}, "rater model for online_dpo.loss_type=sigmoid, not ipo"),
        ({"temperature": 0.0}, "must be > 0"),
    ],
)
def test_config_errors_name_the_key(kwargs, message):
    with pytest.raises(UserError, match=re.escape(message)):
        check_online_dpo_config(OnlineDPOConfig(**kwargs))


# ---------------------------------------------------------------- the stage, end to end


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.mark.slow
def test_online_dpo_labels_its_own_samples_trains_and_publishes(tiny_run, tmp_path):
    from transformers import AutoModelForCausalLM

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    inputs_before = {name: digest(run / name / "model") for name in ("sft", "reward")}
    result = run_script(SCRIPT, run, *TINY_TEST_OVERRIDES, *FAST)
    results = read_summary(run)["online_dpo"]
    rows = [json.loads(line) for line in (run / "online_dpo" / "metrics.jsonl").read_text().splitlines()]
    iterations = [row for row in rows if "online_dpo/train/loss" in row]
    assert [row["step"] for row in iterations] == [1, 2, 3, 4]
    # The reward model's best of each prompt's two samples is chosen: a positive score margin in every iteration.
    assert all(row["online_dpo/pairs/score_margin"] > 0 for row in iterations)
    assert all(0 < row["online_dpo/pairs/kept_rate"] <= 1 for row in iterations)
    assert iterations[-1]["online_dpo/train/episodes"] == results["episodes"] == 128
    assert results["optimizer_steps"] == 4 and results["judge"] == "reward" and results["reference"] == "sft"

    # The policy moved; the SFT policy and the reward model did not, on disk and in memory.
    assert {name: digest(run / name / "model") for name in ("sft", "reward")} == inputs_before
    assert results["frozen_roles_unchanged"] is True
    sft, trained = (load_file(run / stage / "model" / "model.safetensors") for stage in ("sft", "online_dpo"))
    assert any(not torch.equal(sft[k], trained[k]) for k in sft)
    assert results["kl_to_ref"] > 0 and results["eval_prompts"] == 32
    assert "gold_win_rate_vs_sft" in results

    # Complete, self-describing outputs; the samples file holds pairs (chosen then rejected) with their scores.
    stage = run / "online_dpo"
    assert json.loads((stage / "complete.json").read_text())["iterations"] == 4 and not (stage / "checkpoint").exists()
    assert AutoModelForCausalLM.from_pretrained(stage / "model").config.eos_token_id is not None
    samples = [json.loads(line) for line in (stage / "samples.jsonl").read_text().splitlines()]
    first = [row for row in samples if row["iteration"] == 1]
    assert len(first) % 2 == 0 and all(a["score"] > b["score"] for a, b in zip(first[::2], first[1::2]))
    assert (stage / "curves.png").stat().st_size > 10_000
    assert "gold win rate vs SFT" in result.stdout


@pytest.mark.slow
def test_online_dpo_with_the_simulated_annotator_and_a_moving_reference(tiny_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    run_script(
        SCRIPT,
        run,
        *TINY_TEST_OVERRIDES,
        *FAST,
        "online_dpo.total_episodes=64",
        "online_dpo.judge=simulated",
        "online_dpo.reference=iteration",
    )
    results = read_summary(run)["online_dpo"]
    assert results["judge"] == "simulated" and results["reference"] == "iteration" and results["iterations"] == 2
    rows = [json.loads(line) for line in (run / "online_dpo" / "metrics.jsonl").read_text().splitlines()]
    # The annotator labels every distinct pair (it always picks one): only identical samples are left out.
    assert all(row["online_dpo/pairs/kept_rate"] > 0.5 for row in rows if "online_dpo/pairs/kept_rate" in row)


@pytest.mark.slow
def test_killed_online_dpo_resumes_to_the_same_weights(tiny_run, tmp_path):
    overrides = [*TINY_TEST_OVERRIDES, *FAST, "online_dpo.eval_prompts=8"]
    runs = {}
    for name in ("killed", "straight"):
        runs[name] = tmp_path / name
        shutil.copytree(tiny_run, runs[name])
    kill_at_first_checkpoint(SCRIPT, runs["killed"], "online_dpo", *overrides)
    resumed = run_script(SCRIPT, runs["killed"], *overrides)
    assert "resumed from iteration" in resumed.stdout
    run_script(SCRIPT, runs["straight"], *overrides)
    a = load_file(runs["killed"] / "online_dpo" / "model" / "model.safetensors")
    b = load_file(runs["straight"] / "online_dpo" / "model" / "model.safetensors")
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
