"""Model contracts: log-prob alignment, padding invariance, reward read at the last real token,
and a reward model that plain transformers loads with the normalisation folded in."""

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification, GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel

from rlhf.core.batching import EncodedPair, collate_pairs, collate_shared_prompt_pairs
from rlhf.core.errors import UserError
from rlhf.models.modeling import (
    MeanPoolRewardModel,
    SharedPromptPairRewards,
    build_reward_model,
    disable_dropout,
    fold_reward_offset,
    load_reward_model,
    reward_scores,
    shared_prompt_response_logprobs,
    token_logprobs,
)
from rlhf.stage.schema import RewardConfig

PAD = 0


def tiny_config(**kw):
    return GPT2Config(vocab_size=32, n_embd=16, n_layer=2, n_head=2, n_positions=32, pad_token_id=PAD, **kw)


@pytest.fixture
def lm():
    torch.manual_seed(0)
    model = GPT2LMHeadModel(tiny_config())
    disable_dropout(model)
    return model.eval()


def test_token_logprobs_are_aligned_with_the_ids(lm):
    ids = torch.tensor([[3, 7, 9, 4]])
    logprobs = token_logprobs(lm, ids, torch.ones_like(ids))
    logits = lm(ids).logits
    expected = [torch.log_softmax(logits[0, t - 1], -1)[ids[0, t]].item() for t in range(1, 4)]
    assert logprobs[0, 0].item() == 0.0
    assert logprobs[0, 1:].tolist() == pytest.approx(expected, abs=1e-5)


def test_temperature_divides_the_logits(lm):
    ids = torch.tensor([[3, 7, 9]])
    logprobs = token_logprobs(lm, ids, torch.ones_like(ids), temperature=0.5)
    logits = lm(ids).logits / 0.5
    assert logprobs[0, 2].item() == pytest.approx(torch.log_softmax(logits[0, 1], -1)[9].item(), abs=1e-5)


def test_left_and_right_padding_give_the_same_logprobs(lm):
    right = torch.tensor([[3, 7, 9, PAD, PAD]])
    left = torch.tensor([[PAD, PAD, 3, 7, 9]])
    lp_right = token_logprobs(lm, right, (right != PAD).long())[0, 1:3]
    lp_left = token_logprobs(lm, left, (left != PAD).long())[0, 3:5]
    assert torch.allclose(lp_right, lp_left, atol=1e-5)


def test_disable_dropout_zeroes_modules_and_config():
    model = GPT2LMHeadModel(tiny_config(resid_pdrop=0.3, attn_pdrop=0.3, embd_pdrop=0.3))
    disable_dropout(model)
    assert all(m.p == 0.0 for m in model.modules() if isinstance(m, torch.nn.Dropout))
    assert model.config.resid_pdrop == model.config.attn_pdrop == model.config.embd_pdrop == 0.0


@pytest.fixture
def sft_dir(tmp_path, lm):
    lm.save_pretrained(tmp_path / "sft")
    return tmp_path / "sft"


def test_last_token_reward_is_read_at_the_last_real_token(sft_dir):
    model = build_reward_model(sft_dir, RewardConfig(pooling="last")).eval()
    ids = torch.tensor([[3, 7, 9, 4, PAD, PAD]])
    padded = reward_scores(model, ids, (ids != PAD).long())
    exact = reward_scores(model, ids[:, :4], torch.ones(1, 4, dtype=torch.long))
    left = torch.tensor([[PAD, PAD, 3, 7, 9, 4]])
    assert padded.item() == pytest.approx(exact.item(), abs=1e-5)
    assert reward_scores(model, left, (left != PAD).long()).item() == pytest.approx(exact.item(), abs=1e-5)


def test_reward_head_init_follows_huang_et_al(sft_dir):
    torch.manual_seed(1)
    model = build_reward_model(sft_dir, RewardConfig(pooling="last"))
    # std of N(0, 1/sqrt(d+1)) with d = 16: 1/sqrt(17) = 0.2425; 16 samples, so only a loose check.
    assert 0.08 < model.score.weight.std().item() < 0.5


def test_folded_offset_is_exact_and_survives_plain_transformers_loading(sft_dir, tmp_path):
    model = build_reward_model(sft_dir, RewardConfig(pooling="last")).eval()
    ids = torch.tensor([[3, 7, 9, 4], [5, 6, 2, 8]])
    before = reward_scores(model, ids, torch.ones_like(ids))
    assert fold_reward_offset(model, 0.75) == 0.0  # GPT-2's head has no bias: folded into ln_f
    after = reward_scores(model, ids, torch.ones_like(ids))
    assert torch.allclose(after, before - 0.75, atol=1e-5)
    model.save_pretrained(tmp_path / "rm")
    plain = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm").eval()
    assert isinstance(plain, GPT2ForSequenceClassification)
    assert torch.allclose(plain(ids).logits.squeeze(-1), after, atol=1e-5)


def test_mean_pool_reward_model_round_trips(sft_dir, tmp_path):
    import json

    model = build_reward_model(sft_dir, RewardConfig(pooling="mean", head_hidden=8)).eval()
    assert isinstance(model, MeanPoolRewardModel)
    ids = torch.tensor([[3, 7, 9, PAD]])
    mask = (ids != PAD).long()
    score = reward_scores(model, ids, mask)
    fold_reward_offset(model, 0.5)
    model.save_pretrained(tmp_path / "rm")
    (tmp_path / "rm" / "reward_config.json").write_text(json.dumps({"pooling": "mean", "head_hidden": 8}))
    loaded = load_reward_model(tmp_path / "rm").eval()
    assert reward_scores(loaded, ids, mask).item() == pytest.approx(score.item() - 0.5, abs=1e-5)


@pytest.mark.parametrize("pooling", ["last", "mean"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_shared_prompt_rows_score_like_separate_sequences(tmp_path, pooling, attention):
    torch.manual_seed(0)
    GPT2LMHeadModel(tiny_config(attn_implementation=attention)).save_pretrained(tmp_path / "sft")
    model = build_reward_model(tmp_path / "sft", RewardConfig(pooling=pooling, head_hidden=8)).eval()
    model.reward_offset = 0.25
    pairs = [
        EncodedPair([3, 7], [9, 4, 1], [5, 1]),
        EncodedPair([6], [2, 1], [8, 8, 8, 1]),
        EncodedPair([4, 4, 4], [1], [1]),
    ]
    separate = collate_pairs(pairs, PAD)
    expected_chosen, expected_rejected = reward_scores(model, separate["input_ids"], separate["attention_mask"]).chunk(
        2
    )
    chosen, rejected, token_values, _ = SharedPromptPairRewards(model)(collate_shared_prompt_pairs(pairs, PAD))
    assert torch.allclose(chosen, expected_chosen, atol=1e-5)
    assert torch.allclose(rejected, expected_rejected, atol=1e-5)
    assert token_values is None


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_shared_prompt_response_logprobs_equal_separate_sequences(attention):
    torch.manual_seed(0)
    policy = GPT2LMHeadModel(tiny_config(attn_implementation=attention)).eval()
    pairs = [
        EncodedPair([3, 7], [9, 4, 1], [5, 1]),
        EncodedPair([6], [2, 1], [8, 8, 8, 1]),
        EncodedPair([4, 4, 4], [1], [1]),
    ]
    separate = collate_pairs(pairs, PAD)
    with torch.no_grad():
        expected = token_logprobs(policy, separate["input_ids"], separate["attention_mask"])  # (2B, T)
    shared = shared_prompt_response_logprobs(policy, collate_shared_prompt_pairs(pairs, PAD))
    for i, pair in enumerate(pairs):
        p, c, r = len(pair.prompt_ids), len(pair.chosen_ids), len(pair.rejected_ids)
        assert torch.allclose(shared[i, p : p + c], expected[i, p : p + c], atol=1e-5)
        assert torch.allclose(shared[i, p + c : p + c + r], expected[len(pairs) + i, p : p + r], atol=1e-5)
        assert shared[i, :p].eq(0).all() and shared[i, p + c + r :].eq(0).all()


def test_token_head_reads_every_column_and_is_not_saved(sft_dir, tmp_path):
    model = build_reward_model(sft_dir, RewardConfig(pooling="last")).eval()
    pairwise = SharedPromptPairRewards(model, token_head=True)
    batch = collate_shared_prompt_pairs([EncodedPair([3, 7], [9, 1], [5, 5, 1])], PAD)
    token_values = pairwise(batch).token_values
    assert token_values.shape == batch["input_ids"].shape
    model.save_pretrained(tmp_path / "rm")
    assert "token_head.weight" not in load_file(tmp_path / "rm" / "model.safetensors")


def test_length_heuristic_weight_is_learnt_beside_the_model_and_not_saved(sft_dir, tmp_path):
    model = build_reward_model(sft_dir, RewardConfig(pooling="last")).eval()
    batch = collate_shared_prompt_pairs([EncodedPair([3, 7], [9, 1], [5, 5, 1])], PAD)
    assert SharedPromptPairRewards(model)(batch).length_heuristic_weight is None
    pairwise = SharedPromptPairRewards(model, length_heuristic_lr=0.05)
    assert pairwise(batch).length_heuristic_weight.item() == pytest.approx(0.1)
    assert pairwise.length_heuristic_logit._optim == {"lr": 0.05, "weight_decay": 0.0}
    model.save_pretrained(tmp_path / "rm")
    assert not any("length_heuristic" in k for k in load_file(tmp_path / "rm" / "model.safetensors"))


def test_shared_prompt_rows_refuse_attention_without_4d_masks(sft_dir):
    model = build_reward_model(sft_dir, RewardConfig(pooling="last"))
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(UserError, match="sdpa"):
        SharedPromptPairRewards(model)
