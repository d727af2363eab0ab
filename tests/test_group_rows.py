"""Tests for rlhf.rollout.packing and the group-aware passes: a GRPO group packed as one row over one copy
of its prompt computes what its G separate rows compute (log-probs, entropy, rewards, gradients), the
layout by hand, the micro-batches that keep groups whole, and generation that prefills a repeated
prompt once."""

import pytest
import torch
from test_rollout import PROMPTS, TEXTS, encode, tiny_config, tiny_policy, tiny_reward_model

from rlhf.core.ops import shifted_entropy, shifted_logprobs
from rlhf.methods.passes import budget_micro_batch_rows, micro_batch_rows, minibatch_indices
from rlhf.models.modeling import MeanPoolRewardModel, disable_dropout, position_ids_from_mask, train_tokenizer
from rlhf.rollout.batch import SamplingConfig, pack_rollout
from rlhf.rollout.forward import rollout_logprobs, score_rollout
from rlhf.rollout.generate import generate_rollout, sampling_seeds, shared_prompt_cache
from rlhf.rollout.layout import RowLayout
from rlhf.rollout.packing import pack_groups, packed_entropy, packed_logits, packed_token_logprobs

G = 4


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TEXTS, vocab_size=300)


@pytest.fixture(scope="module")
def policy(tokenizer):
    return tiny_policy(tokenizer)


@pytest.fixture(scope="module")
def groups(tokenizer, policy):
    """G samples of each of the five prompts (consecutive rows), some finished, some cut at the budget."""
    prompt_ids = [p for p in encode(tokenizer, PROMPTS) for _ in range(G)]
    rollout = generate_rollout(
        policy,
        tokenizer,
        prompt_ids,
        SamplingConfig(max_new_tokens=10, temperature=1.0),
        row_seeds=sampling_seeds(0, 0, range(len(prompt_ids))),
    )
    assert 0 < int(rollout.finished.sum()) < len(prompt_ids)
    assert len(set(rollout.response_lengths.tolist())) > 2, "responses of several lengths"
    return rollout


def test_pack_groups_by_hand():
    eos = 9
    rollout = pack_rollout(
        [[5, 6], [5, 6], [4], [4]], [[7, eos], [8, 3, eos], [2], [eos]], [True, True, False, True], 0
    )
    packed = pack_groups(rollout, 2)
    assert packed.input_ids.tolist() == [[5, 6, 7, eos, 8, 3, eos], [4, 2, eos, 0, 0, 0, 0]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 2, 3, 4], [0, 1, 1, 0, 0, 0, 0]]
    assert packed.row_group.tolist() == [0, 0, 1, 1]
    assert packed.token_column.tolist() == [[0, 1, 2, 3, 0], [0, 1, 4, 5, 6], [0, 1, 0, 0, 0], [0, 2, 0, 0, 0]]
    assert packed.last_column.tolist() == [3, 6, 1, 2]
    # the token 8 (response 2's first) is predicted from the prompt's last column, not from response 1's EOS
    assert packed.predecessor[1].tolist()[:3] == [0, 0, 1]
    assert packed.predecessor[1, 2].item() == 1 and packed.predecessor[0, 2].item() == 1
    mask = packed.attention_mask[0, 0]  # (W, W) of the first group
    assert mask[4].tolist() == [True, True, False, False, True, False, False]  # 8 sees the prompt and itself
    assert mask[3].tolist() == [True, True, True, True, False, False, False]  # response 1's EOS: causal
    assert packed.sequence_mask[1].tolist() == [True, True, False, False, True, True, True]
    pad = packed.attention_mask[1, 0, 5]
    assert pad.tolist() == [False] * 5 + [True, False]  # a pad column attends only itself


def test_rows_of_a_group_must_share_their_prompt():
    rollout = pack_rollout([[5, 6], [5, 7]], [[1], [2]], [False, False], 0)
    with pytest.raises(ValueError, match="share their prompt"):
        pack_groups(rollout, 2)
    with pytest.raises(ValueError, match="whole groups"):
        pack_groups(pack_rollout([[5], [5], [5]], [[1], [2], [3]], [False] * 3, 0), 2)


def test_packed_logprobs_and_entropy_equal_the_separate_rows(groups, policy):
    packed = pack_groups(groups, G)
    assert packed.input_ids.numel() < 0.6 * groups.input_ids.numel()  # the point: fewer positions
    with torch.no_grad():
        logits = packed_logits(policy, packed)
        separate = policy(
            input_ids=groups.input_ids,
            attention_mask=groups.attention_mask,
            position_ids=position_ids_from_mask(groups.attention_mask),
        ).logits
    mask = groups.attention_mask.bool()
    mask[:, 0] = False  # column 0 has no predecessor
    for temperature in (1.0, 0.7):
        got = packed_token_logprobs(logits, packed, groups.input_ids, temperature)
        want = shifted_logprobs(separate, groups.input_ids, temperature)
        torch.testing.assert_close(got[mask], want[mask], atol=1e-5, rtol=0)
        assert (got[~mask] == 0).all()
        entropy = packed_entropy(logits, packed, temperature)
        torch.testing.assert_close(entropy[mask], shifted_entropy(separate, temperature)[mask], atol=1e-5, rtol=0)
    # the chunked no-grad pass (whole groups per chunk, several chunks)
    for batch_size in (G, 3 * G, 100):
        torch.testing.assert_close(
            rollout_logprobs(policy, groups, 0.7, batch_size, layout=RowLayout(G)),
            rollout_logprobs(policy, groups, 0.7, batch_size),
            atol=1e-5,
            rtol=0,
        )


def test_the_training_pass_has_the_same_gradient_packed(groups, tokenizer):
    rows = torch.arange(2 * G, 5 * G)  # three whole groups
    grads = {}
    for group_size in (1, G):
        model = tiny_policy(tokenizer).train()
        logprobs, entropy = RowLayout(group_size).training_pass(model, groups.select(rows), 0.7)
        mask = groups.select(rows).response_mask
        (logprobs * mask).sum().backward()
        grads[group_size] = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        assert entropy.requires_grad is False and logprobs.shape == mask.shape
    assert grads[1].keys() == grads[G].keys()
    for name, grad in grads[1].items():
        torch.testing.assert_close(grads[G][name], grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_packed_reward_scores_equal_the_separate_rows(groups, tokenizer, pooling):
    if pooling == "last":
        reward_model = tiny_reward_model(tokenizer)
    else:
        from transformers import GPT2Model

        torch.manual_seed(2)
        reward_model = MeanPoolRewardModel(GPT2Model(tiny_config(tokenizer)), 16, 0.0).eval()
        disable_dropout(reward_model)
    packed_scores = score_rollout(reward_model, groups, 2 * G, layout=RowLayout(G))
    torch.testing.assert_close(packed_scores, score_rollout(reward_model, groups, 2 * G), atol=1e-5, rtol=0)


class OneProcess:
    num_processes = 1  # what `token_budget_rows` asks of the accelerator


def test_micro_batches_keep_groups_whole_and_sorted_by_packed_width():
    # 3 groups of 2: packed widths (prompt + both responses) 2+1+1=4, 1+5+5=11, 3+1+2=6
    lengths = torch.tensor([3, 3, 6, 6, 4, 5])
    response_mask = torch.zeros(6, 8, dtype=torch.bool)
    for row, (prompt, response) in enumerate([(2, 1), (2, 1), (1, 5), (1, 5), (3, 1), (3, 2)]):
        response_mask[row, prompt : prompt + response] = True
    chunks = micro_batch_rows(torch.arange(6), lengths, response_mask.sum(-1), 2, layout=RowLayout(2))
    assert [rows.tolist() for rows in chunks] == [[0, 1], [4, 5], [2, 3]]
    # a token budget of 12 (forward rows x the widest packed width): group [2, 3] (11) alone, then [4, 5] (6) with
    # [0, 1] (4): 2 x 6 = 12; each group whole and in order
    budget = budget_micro_batch_rows(OneProcess(), torch.arange(6), lengths, response_mask.sum(-1), 12, RowLayout(2))
    assert [rows.tolist() for rows in budget] == [[2, 3], [4, 5, 0, 1]]
    parts = minibatch_indices(12, 2, torch.Generator().manual_seed(0), layout=RowLayout(3))
    for part in parts:
        assert len(part) == 6 and (part.view(-1, 3) == part.view(-1, 3)[:, :1] + torch.arange(3)).all()
        assert (part.view(-1, 3)[:, 0] % 3 == 0).all()
    assert sorted(torch.cat(parts).tolist()) == list(range(12))


def test_generation_prefills_a_repeated_prompt_once_and_samples_the_same(groups, tokenizer, policy):
    prompt_ids = [p for p in encode(tokenizer, PROMPTS) for _ in range(G)]
    seeds = sampling_seeds(0, 0, range(len(prompt_ids)))
    # one row per generate() call: no prompt repeats inside a call, so nothing is shared
    alone = generate_rollout(
        policy, tokenizer, prompt_ids, SamplingConfig(max_new_tokens=10, temperature=1.0), 1, row_seeds=seeds
    )
    assert alone.response_ids() == groups.response_ids()
    padded = torch.nn.utils.rnn.pad_sequence(
        [torch.tensor(p[::-1]) for p in prompt_ids], batch_first=True, padding_value=tokenizer.pad_token_id
    ).flip(1)  # left-padded
    attention = (padded != tokenizer.pad_token_id).long()
    kwargs = shared_prompt_cache(policy, prompt_ids, padded, attention)
    (cache,) = kwargs.values()
    assert cache.get_seq_length() == padded.shape[1] - 1
    assert cache.layers[0].keys.shape[0] == len(prompt_ids)  # computed for 5 prompts, one copy per row
    torch.testing.assert_close(cache.layers[0].keys[0], cache.layers[0].keys[G - 1])
    assert shared_prompt_cache(policy, prompt_ids[::G], padded[::G], attention[::G]) == {}
