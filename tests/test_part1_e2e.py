"""End-to-end through the real command line: data -> SFT -> reward model, re-runs, bad input, gpt2-hh offline. (A killed
SFT resumes to the uninterrupted run's weights: tests/faults/test_kill.py; a killed PPO: tests/test_ppo_grpo_e2e.py.)"""

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


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_summary_has_the_documented_part1_keys(tiny_run):
    summary = read_summary(tiny_run)
    assert summary["data"]["n_pairs"]["train"] > 0 and summary["data"]["n_pairs"]["val"] > 0
    assert set(summary["data"]["dropped"]) >= {"tie", "diverging_prompts", "prompt_too_long"}
    assert 0.5 < summary["data"]["embedded"]["noise_ceiling"]["test"] <= 1.0
    for key in (
        "sft.val_loss",
        "reward_model.val_accuracy",
        "reward_model.test_accuracy",
        "timing_s.data",
        "timing_s.sft",
        "timing_s.reward",
    ):
        section, name = key.split(".")
        assert isinstance(summary[section][name], float), key
    for name in ("lengths.png",):
        assert (tiny_run / "data" / name).stat().st_size > 1000
    assert (tiny_run / "reward" / "rewards_test.png").is_file() and (
        tiny_run / "reward" / "error_analysis.json"
    ).is_file()
    by_family = summary["reward_model"]["gold_accuracy_by_family"]
    assert set(by_family) == {"val", "test"} and set(by_family["test"]) == {
        "fact",
        "arith",
        "context",
        "harmful",
        "risky_benign",
        "multiturn",
    }
    assert all(0.0 <= acc <= 1.0 for split in by_family.values() for acc in split.values())


def test_sft_learned_and_reward_model_beats_chance(tiny_run):
    summary = read_summary(tiny_run)
    # A uniform guess over the vocabulary has NLL log(V) (6.93 nats for V = 1024); SFT must at least halve it.
    assert summary["sft"]["val_loss"] < 0.5 * math.log(summary["data"]["tokenizer_vocab_size"])
    # Binomial(n >= 100, 0.5): 0.62 is more than 2.4 sd above chance.
    assert summary["reward_model"]["val_accuracy"] > 0.62
    assert summary["reward_model"]["test_gold_accuracy"] > 0.62


def test_reward_training_changed_the_backbone_and_left_sft_untouched(tiny_run):
    sft_weights = load_file(tiny_run / "sft" / "model" / "model.safetensors")
    reward_weights = load_file(tiny_run / "reward" / "model" / "model.safetensors")
    name = next(k for k in sft_weights if k.endswith("h.0.attn.c_attn.weight"))
    assert not torch.equal(sft_weights[name], reward_weights[name])  # trainable: changed
    # Frozen input: the SFT folder is as the SFT stage wrote it (its files predate the reward stage).
    complete = json.loads((tiny_run / "sft" / "complete.json").read_text())
    assert complete["steps"] == read_summary(tiny_run)["sft"]["steps"]
    assert (tiny_run / "sft" / "model" / "model.safetensors").stat().st_mtime < (
        tiny_run / "reward" / "complete.json"
    ).stat().st_mtime


def test_reward_model_loads_with_plain_transformers(tiny_run):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from rlhf.models.modeling import load_reward_model, reward_scores

    path = tiny_run / "reward" / "model"
    plain = AutoModelForSequenceClassification.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    text = "\n\nHuman: What is 2 plus 3?\n\nAssistant: 2 plus 3 is 5." + tokenizer.eos_token
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        plain_score = plain(**ids).logits.item()
        ours = reward_scores(load_reward_model(path).eval(), ids["input_ids"], ids["attention_mask"]).item()
    assert plain_score == pytest.approx(ours, abs=1e-4)


def test_rerun_skips_a_complete_stage_and_reruns_after_a_config_change(tiny_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    skipped = run_script("part1_reward/train_reward.py", run, *TINY_TEST_OVERRIDES)
    assert "already complete" in skipped.stdout
    # Re-runs whose upstream stage does not match, or whose config is invalid, fail in one line and keep the
    # finished stage.
    mismatched = run_script(
        "part1_reward/train_reward.py", run, *TINY_TEST_OVERRIDES, "sft.lr=0.5", "reward.lr=0.5", check=False
    )
    assert mismatched.returncode == 2 and "stage 'sft' was run with a different config" in mismatched.stderr
    invalid = run_script(
        "part1_reward/train_reward.py", run, *TINY_TEST_OVERRIDES, "reward.label_smoothing=0.7", check=False
    )
    assert invalid.returncode == 2 and "reward.label_smoothing must be in [0, 0.5)" in invalid.stderr
    negative = run_script(
        "part1_reward/train_reward.py", run, *TINY_TEST_OVERRIDES, "reward.logprob_distill_coef=-1", check=False
    )
    assert negative.returncode == 2 and "reward.logprob_distill_coef=-1.0 must be >= 0" in negative.stderr
    both = run_script(
        "part1_reward/train_reward.py",
        run,
        *TINY_TEST_OVERRIDES,
        "reward.length_heuristic=true",
        "reward.label_smoothing=0.1",
        check=False,
    )
    assert both.returncode == 2 and "reward.length_heuristic replaces the Bradley-Terry likelihood" in both.stderr
    assert "already complete" in run_script("part1_reward/train_reward.py", run, *TINY_TEST_OVERRIDES).stdout
    changed = run_script("part1_reward/train_reward.py", run, *TINY_TEST_OVERRIDES, "reward.max_steps=3")
    assert "already complete" not in changed.stdout
    assert read_summary(run)["reward_model"]["steps"] == 3
    # The upstream stages were not touched by the reward change.
    assert "already complete" in run_script("part1_reward/train_sft.py", run, *TINY_TEST_OVERRIDES).stdout


HH_PROMPT = "\n\nHuman: How do I bake bread?\n\nAssistant:"


def hh_rows() -> list:
    """A local HH-format file with one row of every edge case, and counts we know."""
    good = [
        {
            "chosen": f"\n\nHuman: Tell me fact {i}.\n\nAssistant: Fact {i} is that water is wet.",
            "rejected": f"\n\nHuman: Tell me fact {i}.\n\nAssistant: No.",
        }
        for i in range(60)
    ]
    edge = [
        {"chosen": HH_PROMPT + " Same.", "rejected": HH_PROMPT + " Same."},  # tie
        {
            "chosen": "\n\nHuman: a\n\nAssistant: b\n\nHuman: c\n\nAssistant: d",
            "rejected": "\n\nHuman: a\n\nAssistant: other\n\nHuman: c\n\nAssistant: e",
        },  # diverging_prompts
        {"chosen": HH_PROMPT + "", "rejected": HH_PROMPT + " Knead it."},  # empty_response
        {"chosen": "\n\nHuman: no assistant here", "rejected": "\n\nHuman: none"},  # no_assistant_turn
        {"rejected": HH_PROMPT + " Knead."},  # malformed
        {"chosen": HH_PROMPT + " word" * 400, "rejected": HH_PROMPT + " Knead."},  # response_too_long
    ]
    return good + edge


def test_hh_format_file_counts_every_edge_case(tmp_path):
    data = tmp_path / "hh.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in hh_rows()) + "\n")
    out = tmp_path / "run"
    run_script(
        "part1_reward/analyze_data.py", out, f"data.path={data}", "data.max_response_tokens=64", "data.val_fraction=0.2"
    )
    dropped = read_summary(out)["data"]["dropped"]
    assert dropped == {
        "malformed": 1,
        "no_assistant_turn": 1,
        "diverging_prompts": 1,
        "tie": 1,
        "empty_response": 1,
        "response_too_short": 0,
        "response_too_long": 1,
        "prompt_too_long": 0,
    }
    n_pairs = read_summary(out)["data"]["n_pairs"]
    assert n_pairs["train"] + n_pairs["val"] == 60 and n_pairs["test"] == 0
    train_prompts = {json.loads(line)["prompt"] for line in (out / "data" / "train.jsonl").read_text().splitlines()}
    val_prompts = {json.loads(line)["prompt"] for line in (out / "data" / "val.jsonl").read_text().splitlines()}
    assert not train_prompts & val_prompts


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "does not exist"),
        ("", "no training rows"),
        ('{"rejected": "x"}\n{"rejected": "y"}\n', "malformed"),
        (json.dumps({"chosen": "\n\nHuman: hi", "rejected": "\n\nHuman: yo"}) + "\n", "no_assistant_turn"),
    ],
)
def test_bad_data_is_a_one_line_error_and_loses_nothing(tmp_path, content, message):
    out = tmp_path / "run"
    out.mkdir()
    (out / "summary.json").write_text('{"kept": true}')
    data = tmp_path / "data.jsonl"
    if content is not None:
        data.write_text(content)
    result = run_script("part1_reward/analyze_data.py", out, f"data.path={data}", check=False)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert json.loads((out / "summary.json").read_text()) == {"kept": True}


@pytest.mark.parametrize(
    "args, message",
    [
        (["sft.learnin_rate=1"], "unknown config key"),
        (["sft.lr=fast"], "expects float"),
    ],
)
def test_bad_config_is_a_one_line_error(tmp_path, args, message):
    result = run_script("part1_reward/train_sft.py", tmp_path / "run", *args, check=False)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_unknown_preset_and_missing_upstream_stage(tmp_path):
    result = run_script("part1_reward/train_sft.py", tmp_path / "run", preset="nope", check=False)
    assert result.returncode == 2 and "available presets" in result.stderr
    result = run_script("part1_reward/train_reward.py", tmp_path / "run", check=False)
    assert result.returncode == 2 and "stages 'data', 'sft' have not completed" in result.stderr


def test_gpt2_hh_preset_runs_offline_with_random_init(tmp_path):
    """The full-scale preset's code path: GPT-2's real architecture (random weights, from a local
    config.json), a tokenizer built offline, and a local HH-format file, a few steps per stage."""
    from transformers import GPT2Config

    GPT2Config().save_pretrained(tmp_path / "gpt2-config")  # the 124M architecture
    data = tmp_path / "hh.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in hh_rows()) + "\n")
    overrides = [
        f"data.path={data}",
        "model.init=random",
        f"model.name_or_path={tmp_path / 'gpt2-config'}",
        "tokenizer.train_from_data=true",
        "tokenizer.vocab_size=400",
        "run.mixed_precision=no",
        "sft.batch_size=4",
        "sft.micro_batch_size=2",
        "sft.max_steps=2",
        "sft.eval_batch_size=8",
        "reward.batch_size=4",
        "reward.micro_batch_size=2",
        "reward.max_steps=2",
        "reward.eval_batch_size=8",
        "data.max_response_tokens=32",
        "data.max_prompt_tokens=32",
        "data.val_fraction=0.2",
    ]
    out = tmp_path / "run"
    for script in ("part1_reward/analyze_data.py", "part1_reward/train_sft.py", "part1_reward/train_reward.py"):
        run_script(script, out, *overrides, preset="gpt2-hh")
    summary = read_summary(out)
    assert summary["sft"]["steps"] == 2 and summary["reward_model"]["steps"] == 2
    assert (out / "reward" / "model" / "config.json").is_file()
    config = json.loads((out / "sft" / "model" / "config.json").read_text())
    assert (config["n_layer"], config["n_embd"]) == (12, 768)
