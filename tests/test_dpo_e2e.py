"""End-to-end through the real command line: the DPO stage on a copy of the session's tiny run."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from conftest import TINY_TEST_OVERRIDES, read_summary, run_script
from safetensors.torch import load_file

pytestmark = pytest.mark.slow

SCRIPT = "part3_dpo/train_dpo.py"
# The tiny preset's dpo section (all its 2,048 training pairs: with fewer, the implicit reward's test
# accuracy sits too near the 3-sd bar to be a reliable check) with fewer evaluation prompts.
DPO_TEST_OVERRIDES = ["dpo.eval_prompts=120", "dpo.save_every=0"]


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def dpo_run(tiny_run, tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("dpo_run")
    shutil.copytree(tiny_run, output_dir, dirs_exist_ok=True)
    sft_before = {path.name: file_digest(path) for path in (output_dir / "sft" / "model").iterdir()}
    result = run_script(SCRIPT, output_dir, *TINY_TEST_OVERRIDES, *DPO_TEST_OVERRIDES)
    return output_dir, sft_before, result


def test_reference_is_unchanged_and_the_policy_moved(dpo_run):
    output_dir, sft_before, _ = dpo_run
    assert {path.name: file_digest(path) for path in (output_dir / "sft" / "model").iterdir()} == sft_before
    sft = load_file(output_dir / "sft" / "model" / "model.safetensors")
    dpo = load_file(output_dir / "dpo" / "model" / "model.safetensors")
    assert sft.keys() == dpo.keys()
    name = next(k for k in sft if k.endswith("h.0.attn.c_attn.weight"))
    assert not torch.equal(sft[name], dpo[name])


def test_implicit_reward_beats_chance_on_held_out_pairs(dpo_run):
    results = read_summary(dpo_run[0])["dpo"]
    # Above chance by a margin: more than 3 sd of Binomial(n, 0.5) / n above 0.5, with n the split's pairs.
    n_pairs = read_summary(dpo_run[0])["data"]["n_pairs"]
    three_sd = {split: 0.5 + 3 * math.sqrt(0.25 / n_pairs[split]) for split in ("val", "test")}
    assert results["val_accuracy"] > three_sd["val"] and results["test_accuracy"] > three_sd["test"]
    assert results["test_gold_accuracy"] > three_sd["test"]
    assert isinstance(results["reward_model_test_accuracy"], float)  # the explicit RM on the same pairs, side by side


def test_outputs_are_complete_and_described(dpo_run):
    output_dir, _, _result = dpo_run
    summary = read_summary(output_dir)
    results = summary["dpo"]
    assert summary["timing_s"]["dpo"] > 0
    assert results["reference"] == "precomputed" and results["ref_cached_splits"] == []
    assert results["peak_memory_source"] == "cpu_max_rss" and results["peak_memory_mb"] > 0
    assert results["tokens_per_s"] > 0 and results["steps"] == 2048 // 32
    stage = output_dir / "dpo"
    assert (stage / "complete.json").is_file() and not (stage / "checkpoint").exists()
    assert (stage / "ref_logps.safetensors").is_file()
    assert (stage / "curves.png").stat().st_size > 1000
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(str(stage / "model"))  # plain transformers loads the final policy
    samples = [json.loads(line) for line in (stage / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == results["eval_prompts"]
    # the held-out comparison under the keys of every policy stage's (rlhf.online.held_out.gold_against_sft)
    assert {"gold_win_rate_vs_sft", "gold_wins", "gold_losses", "gold_ties", "gold_sign_test_p"} <= results.keys()
    assert results["gold_wins"] + results["gold_losses"] + results["gold_ties"] == results["eval_prompts"]
    assert {"prompt", "sft_response", "dpo_response", "sft_gold_score", "dpo_gold_score"} <= samples[0].keys()
    rows = [json.loads(line) for line in (stage / "metrics.jsonl").read_text().splitlines()]
    logged = set().union(*rows)
    for name in (
        "rewards/chosen",
        "rewards/rejected",
        "rewards/margins",
        "rewards/accuracies",
        "logps/chosen",
        "logps/rejected",
        "loss",
        "lr",
        "tokens_per_s",
        "peak_memory_mb_cpu_max_rss",
    ):
        assert f"dpo/train/{name}" in logged, name
    assert {"dpo/val/rewards/accuracies", "dpo/test/rewards/accuracies", "dpo/test/gold_accuracy"} <= logged
    assert {"dpo/eval/gold_score_mean", "dpo/eval/gold_win_rate_vs_sft"} <= logged  # at step 0 and at the end


def test_a_complete_stage_skips(dpo_run):
    again = run_script(SCRIPT, dpo_run[0], *TINY_TEST_OVERRIDES, *DPO_TEST_OVERRIDES)
    assert "already complete" in again.stdout


def test_a_bad_loss_type_fails_in_one_line_before_reading_inputs(tmp_path):
    bad = run_script(SCRIPT, tmp_path, "dpo.loss_type=kto", check=False)  # an empty run folder: validated first
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == ["error: dpo.loss_type='kto' is not one of: sigmoid, ipo, cdpo"]
