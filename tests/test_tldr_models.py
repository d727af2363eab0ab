"""The TL;DR presets' architectures through the model builders: half-precision checkpoints train in fp32, and a
GPT-NeoX policy (whose LM head is untied) becomes a reward model while a stray backbone key still stops it."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from rlhf.core.errors import UserError
from rlhf.models.modeling import build_policy, build_reward_model, train_tokenizer
from rlhf.stage.schema import ModelConfig, RewardConfig

TINY_NEOX = {"num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64}


@pytest.fixture(scope="module")
def neox_fp16(tmp_path_factory):
    """A tiny GPT-NeoX causal LM saved in fp16, as Pythia's checkpoints are, with its tokenizer."""
    folder = tmp_path_factory.mktemp("neox")
    tokenizer = train_tokenizer(["SUBREDDIT: r/tifu TITLE: a POST: b TL;DR: c"] * 4, 300)
    model = build_policy(
        ModelConfig(name_or_path=None, init="random", model_type="gpt_neox", config_overrides=TINY_NEOX), tokenizer
    )
    model.half().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, tokenizer


def test_a_half_precision_checkpoint_loads_in_fp32(neox_fp16):
    folder, tokenizer = neox_fp16
    assert {t.dtype for t in load_file(folder / "model.safetensors").values()} == {torch.float16}
    model = build_policy(ModelConfig(name_or_path=str(folder), init="pretrained"), tokenizer)
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_gpt_neox_policy_becomes_a_reward_model_without_its_lm_head(neox_fp16):
    folder, _ = neox_fp16
    assert "embed_out.weight" in load_file(folder / "model.safetensors")  # untied: saved, and not in the RM
    model = build_reward_model(folder, RewardConfig())
    assert model.score.weight.shape == (1, TINY_NEOX["hidden_size"])


def test_a_stray_backbone_key_still_stops_the_reward_model(neox_fp16, tmp_path):
    folder, _ = neox_fp16
    for f in folder.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    weights = load_file(folder / "model.safetensors") | {"gpt_neox.stray.weight": torch.zeros(2)}
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UserError, match=r"unexpected: gpt_neox\.stray\.weight"):
        build_reward_model(tmp_path, RewardConfig())
