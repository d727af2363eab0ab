"""bf16 on CPU, the GPU presets' precision path: run.mixed_precision=bf16 builds an autocasting Accelerator without a
GPU, the forward passes then run in bf16, and what the stages compute from them (log-probs, values, rewards, KL,
losses) comes out in float32. The end-to-end run of every stage in bf16 is tests/test_bf16_e2e.py."""

from __future__ import annotations

import copy

import pytest
import torch
from accelerate.state import AcceleratorState
from transformers import GPT2Config, GPT2LMHeadModel

from rlhf.core.batching import EncodedPair, collate_shared_prompt_pairs
from rlhf.core.errors import UserError
from rlhf.core.losses import bradley_terry_loss, dpo_loss, ppo_policy_loss, ppo_value_loss, sft_loss
from rlhf.core.ops import gae_advantages, kl_k3, shifted_entropy, shifted_logprobs
from rlhf.methods.passes import align_values
from rlhf.models.modeling import (
    PolicyAndValue,
    SharedPromptPairRewards,
    build_reward_model,
    disable_dropout,
    position_ids_from_mask,
    reward_scores,
    shared_prompt_response_logprobs,
    token_logprobs,
    value_model_from_reward,
)
from rlhf.models.training import make_accelerator
from rlhf.stage.config import load_config, preset_path
from rlhf.stage.schema import RewardConfig

PAD = 0
PAIRS = [EncodedPair([3, 7], [9, 4, 1], [5, 1]), EncodedPair([6], [2, 1], [8, 8, 8, 1])]


def accelerator_for(mixed_precision: str):
    """A fresh Accelerator (accelerate keeps one process-wide state; it is reset around each test here)."""
    AcceleratorState._reset_state(reset_partial_state=True)
    return make_accelerator(load_config(preset_path("tiny"), [f"run.mixed_precision={mixed_precision}"]))


@pytest.fixture
def bf16():
    yield accelerator_for("bf16")
    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.fixture
def policy():
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=40, n_embd=32, n_layer=2, n_head=2, n_positions=32, pad_token_id=PAD))
    disable_dropout(model)
    return model.eval()


def sequences() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(2, 40, (3, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # a right-padded row
    return ids, mask


def test_bf16_runs_on_cpu_and_autocasts_the_forward(bf16, policy):
    assert bf16.device.type == "cpu" and bf16.mixed_precision == "bf16"
    ids, mask = sequences()
    with torch.no_grad(), bf16.autocast():
        assert policy(input_ids=ids, attention_mask=mask).logits.dtype == torch.bfloat16


@pytest.mark.skipif(torch.cuda.is_available(), reason="fp16 is refused only where there is no CUDA GPU")
def test_fp16_without_a_gpu_is_refused_in_one_line():
    try:
        with pytest.raises(UserError, match=r"run\.mixed_precision=fp16 needs a CUDA GPU; on CPU pass") as error:
            accelerator_for("fp16")
        assert "\n" not in str(error.value)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


def test_a_prepared_policy_and_its_unprepared_reference_give_the_same_log_probs(bf16, policy):
    """accelerate returns a prepared model's bf16 logits as float32; a frozen reference that is not prepared returns
    them in bf16. At the sampling temperature both must give the same log-probs, or the KL between a policy and its
    identical reference starts above 0 (it did: 1.7e-3 nats per token, when the logits were divided in bf16)."""
    reference = copy.deepcopy(policy)
    prepared = bf16.prepare(policy)
    ids, mask = sequences()
    with torch.no_grad(), bf16.autocast():
        positions = position_ids_from_mask(mask)
        policy_logits = prepared(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        reference_logits = reference(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        assert (policy_logits.dtype, reference_logits.dtype) == (torch.float32, torch.bfloat16)
        for temperature in (1.0, 0.7):
            expected = token_logprobs(prepared, ids, mask, temperature)
            assert torch.equal(token_logprobs(reference, ids, mask, temperature), expected)
            assert torch.equal(shifted_logprobs(reference_logits, ids, temperature), expected)
            assert torch.equal(
                shifted_entropy(reference_logits, temperature), shifted_entropy(policy_logits, temperature)
            )
        assert kl_k3(token_logprobs(prepared, ids, mask, 0.7), token_logprobs(reference, ids, mask, 0.7)).eq(0).all()


def test_log_probs_values_rewards_and_losses_are_float32_under_bf16(bf16, policy, tmp_path):
    policy.save_pretrained(tmp_path / "sft")
    reward_model = build_reward_model(tmp_path / "sft", RewardConfig(pooling="last")).eval()
    ids, mask = sequences()
    response_mask = mask.bool() & (torch.arange(ids.shape[1]) >= 4)  # (B, T)
    pairs = collate_shared_prompt_pairs(PAIRS, PAD)
    with bf16.autocast():
        logits, values = PolicyAndValue(policy, value_model_from_reward(copy.deepcopy(reward_model)))(ids, mask)
        _, shared_values = PolicyAndValue(policy)(ids, mask)
        assert logits.dtype == torch.bfloat16  # the forward itself runs in bf16
        logprobs = shifted_logprobs(logits, ids, 0.7)  # (B, T)
        with torch.no_grad():
            ref_logprobs = token_logprobs(policy, ids, mask, 0.7)  # (B, T)
            scores = reward_scores(reward_model, ids, mask)  # (B,)
        pair_rewards = SharedPromptPairRewards(reward_model, token_head=True, length_heuristic_lr=0.1)(pairs)
        pair_logprobs = shared_prompt_response_logprobs(policy, pairs)  # (B, T)
    boundaries = {
        "logprobs": logprobs,
        "ref_logprobs": ref_logprobs,
        "values": values,
        "shared_values": shared_values,
        "scores": scores,
        **{f"pair_rewards.{name}": value for name, value in pair_rewards._asdict().items()},
        "pair_logprobs": pair_logprobs,
    }
    assert {name: t.dtype for name, t in boundaries.items()} == dict.fromkeys(boundaries, torch.float32)

    old_values = align_values(values).detach()
    rewards = torch.zeros_like(logprobs).masked_fill(response_mask & ~response_mask.roll(-1, 1), 1.0)  # (B, T)
    advantages, returns = gae_advantages(rewards, old_values, response_mask, 1.0, 0.95)
    losses = {
        "sft": sft_loss(logprobs, response_mask)[0],
        "ppo_policy": ppo_policy_loss(logprobs, logprobs.detach(), advantages, response_mask, 0.2)[0],
        "ppo_value": ppo_value_loss(align_values(values), old_values, returns, response_mask)[0],
        "bradley_terry": bradley_terry_loss(pair_rewards.chosen, pair_rewards.rejected)[0],
        "dpo": dpo_loss(*pair_logprobs.sum(1).chunk(2), *pair_logprobs.detach().sum(1).chunk(2), beta=0.1)[0],
    }
    computed = {"advantages": advantages, "returns": returns, **losses}
    assert {name: t.dtype for name, t in computed.items()} == dict.fromkeys(computed, torch.float32)
    sum(losses.values()).backward()
    assert all(p.grad.dtype == torch.float32 for p in policy.parameters() if p.grad is not None)  # fp32 weights


def test_bf16_log_probs_stay_near_float32(bf16, policy):
    """What bf16 costs at this size: per-token log-probs within a few hundredths of a nat of float32's."""
    ids, mask = sequences()
    with torch.no_grad():
        exact = token_logprobs(policy, ids, mask, 0.7)
        with bf16.autocast():
            rounded = token_logprobs(policy, ids, mask, 0.7)
    difference = (rounded - exact)[mask.bool()].abs()
    assert 0 < difference.max() < 0.05
