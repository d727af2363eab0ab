"""End-to-end through the real command line with model.lora.enabled=true: data -> sft -> reward -> ppo -> grpo ->
raft -> dpo -> online_dpo, with adapters in every stage, and full SFT then adapters in reward, ppo and dpo
(model.lora.stages). (The real model's LoRA runs, tests/test_smollm2_e2e.py and tests/test_ifeval_e2e.py, train
adapters in SFT, the reward models, PPO, GRPO and DPO.)

Every stage publishes a merged model that plain transformers loads, and its adapters beside it, which peft
loads on the model the stage started from; the policy stages move the policy and leave the reference alone."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import TINY_TEST_OVERRIDES, read_summary, run_script
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from rlhf.stage.config import LORA_AFTER_SFT

pytestmark = pytest.mark.slow

# Few steps of each stage. LoRA on the tiny preset's randomly initialised model learns little (its base is
# random), so the rates are higher than the preset's full fine-tuning ones: enough to see every stage move.
# Naming sft in model.lora.stages allows adapters on the random base, which model.lora.stages=all refuses.
LORA_OVERRIDES = [
    *TINY_TEST_OVERRIDES,
    "model.lora.enabled=true",
    "model.lora.stages=sft,reward,ppo,grpo,raft,dpo,online_dpo",
    "sft.max_steps=20",
    "sft.lr=1e-2",
    "sft.gold_eval_prompts=20",
    "reward.max_steps=20",
    "reward.logprob_distill_coef=0",
    "ppo.total_episodes=128",
    "ppo.lr=3e-3",
    "ppo.eval_prompts=32",
    "dpo.max_steps=4",
    "dpo.lr=3e-3",
    "dpo.max_train_pairs=128",
    "dpo.eval_prompts=32",
    "dpo.precompute_ref=false",  # the reference (adapters disabled) scores every training batch
    "grpo.total_episodes=128",
    "grpo.lr=3e-3",
    "grpo.eval_prompts=32",
    "raft.rounds=1",
    "raft.prompts_per_round=32",
    "raft.lr=3e-3",
    "raft.eval_prompts=32",
    "online_dpo.total_episodes=128",
    "online_dpo.lr=3e-3",
    "online_dpo.eval_prompts=32",
]
STAGES = {
    "part1_reward/analyze_data.py": "data",
    "part1_reward/train_sft.py": "sft",
    "part1_reward/train_reward.py": "reward",
    "part2_ppo_grpo/train_ppo.py": "ppo",
    "part2_ppo_grpo/train_grpo.py": "grpo",
    "part2_ppo_grpo/train_raft.py": "raft",
    "part3_dpo/train_dpo.py": "dpo",
    "part3_dpo/train_online_dpo.py": "online_dpo",
}
AFTER_SFT_STAGES = ("data", "sft", "reward", "ppo", "dpo")


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("lora_run")
    for script in STAGES:
        run_script(script, output_dir, *LORA_OVERRIDES)
    return output_dir


def sequences(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(2, 200, (4, 12), generator=torch.Generator().manual_seed(seed))
    return ids, torch.ones_like(ids)


def assert_merged_model_and_adapters_on_the_sft_model(run, stage):
    merged = AutoModelForCausalLM.from_pretrained(run / stage / "model", use_safetensors=True)
    assert not any("lora" in key for key in load_file(run / stage / "model" / "model.safetensors"))
    base = AutoModelForCausalLM.from_pretrained(run / "sft" / "model", use_safetensors=True)
    ids, mask = sequences()
    with torch.no_grad():
        sft_logits = base(input_ids=ids, attention_mask=mask).logits
        adapted = PeftModel.from_pretrained(base, run / stage / "adapter")
        expected = merged(input_ids=ids, attention_mask=mask).logits
        assert (adapted(input_ids=ids, attention_mask=mask).logits - expected).abs().max() <= 1e-4
        assert (expected - sft_logits).abs().max() > 1e-3  # the policy moved away from SFT


@pytest.mark.parametrize("stage", ["ppo", "grpo", "raft", "dpo", "online_dpo"])
def test_policy_stages_publish_a_merged_model_and_adapters_on_the_sft_model(lora_run, stage):
    assert_merged_model_and_adapters_on_the_sft_model(lora_run, stage)


def test_reward_model_merged_loads_as_sequence_classification_and_adapters_score_before_normalising(lora_run):
    path = lora_run / "reward" / "model"
    merged = AutoModelForSequenceClassification.from_pretrained(path, use_safetensors=True)
    offset = json.loads((path / "reward_config.json").read_text())["offset"]
    base = AutoModelForSequenceClassification.from_pretrained(lora_run / "sft" / "model", num_labels=1)
    adapted = PeftModel.from_pretrained(base, lora_run / "reward" / "adapter")
    ids, mask = sequences(1)
    with torch.no_grad():
        normalised = merged(input_ids=ids, attention_mask=mask).logits.squeeze(-1)
        raw = adapted(input_ids=ids, attention_mask=mask).logits.squeeze(-1)
    assert offset != 0.0
    assert torch.allclose(raw - offset, normalised, atol=1e-4)  # the offset is folded into the merged weights only


def test_summaries_show_frozen_references_and_small_adapters(lora_run):
    summary = read_summary(lora_run)
    assert summary["ppo"]["frozen_roles_unchanged"] is True
    assert summary["ppo"]["iterations"] == 2 and summary["dpo"]["steps"] == 4
    assert summary["dpo"]["reference"] == "on_the_fly"
    sft = load_file(lora_run / "sft" / "model" / "model.safetensors")
    adapter = load_file(lora_run / "sft" / "adapter" / "adapter_model.safetensors")
    assert 0 < sum(t.numel() for t in adapter.values()) < 0.2 * sum(t.numel() for t in sft.values())
    for stage in STAGES.values():
        assert not (lora_run / stage / "checkpoint").exists()  # removed once the stage completed


# Full SFT, then LoRA: the session's tiny_run (data, full SFT, reward) with adapters in every later stage. Its data and
# SFT are complete for this config (model.lora.stages leaves them as full fine-tuning computes them); the reward
# stage re-runs with adapters. LoRA rates about 10x the preset's full fine-tuning ones, few steps.
AFTER_SFT_OVERRIDES = [
    *TINY_TEST_OVERRIDES,
    "model.lora.enabled=true",
    f"model.lora.stages={LORA_AFTER_SFT}",
    "reward.max_steps=20",
    "reward.lr=3e-3",
    "ppo.total_episodes=128",
    "ppo.lr=1e-3",
    "ppo.eval_prompts=32",
    "dpo.max_steps=4",
    "dpo.lr=6e-4",
    "dpo.max_train_pairs=128",
    "dpo.eval_prompts=32",
]


@pytest.fixture(scope="module")
def after_sft_run(tiny_run, tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("lora_after_sft_run") / "run"
    shutil.copytree(tiny_run, output_dir)
    scripts = [script for script, stage in STAGES.items() if stage in AFTER_SFT_STAGES]
    logs = {STAGES[script]: run_script(script, output_dir, *AFTER_SFT_OVERRIDES).stdout for script in scripts}
    return output_dir, logs


def test_full_sft_then_lora_reuses_the_full_sft_and_trains_adapters_on_it(after_sft_run, tiny_run):
    run, logs = after_sft_run
    for stage in ("data", "sft"):
        assert f"[{stage}] already complete for this config" in logs[stage]
    assert not (run / "sft" / "adapter").exists()
    sft = (run / "sft" / "model" / "model.safetensors").read_bytes()
    assert sft == (tiny_run / "sft" / "model" / "model.safetensors").read_bytes()  # the full SFT, not re-trained
    for stage in ("reward", "ppo", "dpo"):
        assert "already complete" not in logs[stage] and (run / stage / "adapter" / "adapter_config.json").is_file()
    for stage in ("ppo", "dpo"):
        assert_merged_model_and_adapters_on_the_sft_model(run, stage)
    summary = read_summary(run)
    # above chance on 240 val pairs after 20 steps (0.59 when written; the full model reaches 0.68 in 270)
    assert summary["reward_model"]["steps"] == 20 and summary["reward_model"]["val_accuracy"] > 0.55
    assert summary["ppo"]["frozen_roles_unchanged"] is True and summary["ppo"]["iterations"] == 2
    assert summary["dpo"]["steps"] == 4
