"""End-to-end through the real command line with model.lora.enabled=true: data -> sft -> reward -> ppo -> dpo.

Every stage publishes a merged model that plain transformers loads, and its adapters beside it, which peft
loads on the model the stage started from; the policy stages move the policy and leave the reference alone."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import TINY_TEST_OVERRIDES, read_summary, run_script
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

pytestmark = pytest.mark.slow

# Few steps of each stage. LoRA on the tiny preset's randomly initialised model learns little (its base is
# random), so the rates are higher than the preset's full fine-tuning ones: enough to see every stage move.
LORA_OVERRIDES = [
    *TINY_TEST_OVERRIDES,
    "model.lora.enabled=true",
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
]
STAGES = {
    "part1_reward/analyze_data.py": "data",
    "part1_reward/train_sft.py": "sft",
    "part1_reward/train_reward.py": "reward",
    "part2_ppo_grpo/train_ppo.py": "ppo",
    "part3_dpo/train_dpo.py": "dpo",
}


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("lora_run")
    for script in STAGES:
        run_script(script, output_dir, *LORA_OVERRIDES)
    return output_dir


def sequences(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(2, 200, (4, 12), generator=torch.Generator().manual_seed(seed))
    return ids, torch.ones_like(ids)


@pytest.mark.parametrize("stage", ["ppo", "dpo"])
def test_policy_stages_publish_a_merged_model_and_adapters_on_the_sft_model(lora_run, stage):
    merged = AutoModelForCausalLM.from_pretrained(lora_run / stage / "model", use_safetensors=True)
    assert not any("lora" in key for key in load_file(lora_run / stage / "model" / "model.safetensors"))
    base = AutoModelForCausalLM.from_pretrained(lora_run / "sft" / "model", use_safetensors=True)
    ids, mask = sequences()
    with torch.no_grad():
        sft_logits = base(input_ids=ids, attention_mask=mask).logits
        adapted = PeftModel.from_pretrained(base, lora_run / stage / "adapter")
        expected = merged(input_ids=ids, attention_mask=mask).logits
        assert (adapted(input_ids=ids, attention_mask=mask).logits - expected).abs().max() <= 1e-4
        assert (expected - sft_logits).abs().max() > 1e-3  # the policy moved away from SFT


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
    for stage in ("sft", "reward", "ppo", "dpo"):
        assert not (lora_run / stage / "checkpoint").exists()  # removed once the stage completed
