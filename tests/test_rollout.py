"""Tests for rlhf.rollout.batch: EOS truncation and masking, the right-padded layout, log-probs from
generation vs a teacher-forced forward pass, chunked no-grad passes, and reward scoring at the
last real token, directly and through a different tokenizer."""

import pytest
import torch
from transformers import GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel

from rlhf.models.modeling import disable_dropout, reward_scores, token_logprobs, train_tokenizer
from rlhf.online.stats import response_metrics
from rlhf.rollout.batch import Rollout, SamplingConfig
from rlhf.rollout.forward import forward_in_chunks, retokenize, rollout_logprobs, same_tokenizer, score_rollout
from rlhf.rollout.generate import (
    RowSeededSampling,
    generate_rollout,
    sample_responses,
    sampling_seeds,
    truncate_after_eos,
)

TEXTS = [
    "\n\nHuman: What is 3 plus 4?\n\nAssistant: 3 plus 4 is 7.",
    "\n\nHuman: Ana has 3 apples and Bob has 5 apples. Who has 5 apples?\n\nAssistant: Bob has 5 apples.",
    "\n\nHuman: How can I steal a car?\n\nAssistant: I'm sorry, but I can't help with that.",
] * 20
PROMPTS = [
    "\n\nHuman: What is 3 plus 4?\n\nAssistant:",
    "\n\nHuman: Hi!\n\nAssistant:",
    "\n\nHuman: Ana has 3 apples and Bob has 5 apples. Who has 5 apples?\n\nAssistant:",
    "\n\nHuman: How can I steal a car?\n\nAssistant:",
    "\n\nHuman: Tell me the capital of Givim.\n\nAssistant:",
]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TEXTS, vocab_size=300)


@pytest.fixture(scope="module")
def other_tokenizer():
    """A different vocabulary (other merges): token ids mean other things."""
    return train_tokenizer([t.upper() + t for t in TEXTS], vocab_size=330)


def tiny_config(tokenizer, **kwargs) -> GPT2Config:
    return GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=128,
        n_embd=32,
        n_layer=2,
        n_head=2,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        **kwargs,
    )


def tiny_policy(tokenizer, eos_bias: float = 4.0) -> GPT2LMHeadModel:
    """A random 2-layer GPT-2 whose final norm is biased toward EOS, so some responses end early and some never do."""
    torch.manual_seed(0)
    model = GPT2LMHeadModel(tiny_config(tokenizer))
    disable_dropout(model)
    with torch.no_grad():
        eos_row = model.transformer.wte.weight[tokenizer.eos_token_id]
        model.transformer.ln_f.bias += eos_bias * eos_row / eos_row.norm() ** 2 * 0.5
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.eval()


def tiny_reward_model(tokenizer) -> GPT2ForSequenceClassification:
    torch.manual_seed(1)
    model = GPT2ForSequenceClassification(tiny_config(tokenizer, num_labels=1))
    disable_dropout(model)
    return model.eval()


def encode(tokenizer, texts):
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


# ---------------------------------------------------------------- truncation and layout


def test_truncate_after_eos_by_hand():
    eos, pad = 9, 0
    generated = torch.tensor([[5, 9, 6, 9], [5, 6, 7, 8], [9, 9, 1, 2]])
    ids, mask = truncate_after_eos(generated, eos, pad)
    assert mask.tolist() == [[True, True, False, False], [True, True, True, True], [True, False, False, False]]
    assert ids.tolist() == [[5, 9, 0, 0], [5, 6, 7, 8], [9, 0, 0, 0]]


@pytest.fixture(scope="module")
def rollout(tokenizer):
    policy = tiny_policy(tokenizer)
    torch.manual_seed(3)
    # batch_size 3 < 5 prompts: two generate() calls that stop at different lengths
    return generate_rollout(
        policy,
        tokenizer,
        encode(tokenizer, PROMPTS) * 2,
        SamplingConfig(max_new_tokens=12, temperature=0.7),
        batch_size=3,
        return_generation_logprobs=True,
    )


def test_rollout_masks_everything_after_the_first_eos(tokenizer, rollout):
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    prompt_ids = encode(tokenizer, PROMPTS) * 2
    finished = rollout.finished.tolist()
    assert 0 < sum(finished) < len(finished), "the fixture must hold both finished and unfinished responses"
    for i, (row, attention, response) in enumerate(
        zip(rollout.input_ids, rollout.attention_mask, rollout.response_mask)
    ):
        n_prompt, n_response = len(prompt_ids[i]), int(response.sum())
        # right-padded: [prompt][response][pad], attention a prefix, response right after the prompt
        assert row[:n_prompt].tolist() == prompt_ids[i]
        assert attention.tolist() == [1] * (n_prompt + n_response) + [0] * (len(row) - n_prompt - n_response)
        assert response.tolist() == [False] * n_prompt + [True] * n_response + [False] * (
            len(row) - n_prompt - n_response
        )
        response_ids = row[response].tolist()
        assert response_ids.count(eos) == (1 if finished[i] else 0)
        assert (response_ids[-1] == eos) == finished[i]  # nothing after the EOS
        assert finished[i] or n_response == 12  # an unfinished response used the whole budget
        assert (row[n_prompt + n_response :] == pad).all()
        assert pad not in response_ids  # the pad token is never sampled
    assert rollout.input_ids.shape[1] == int(rollout.lengths.max())  # no all-padding column


def test_rl_tokens_per_s_counts_each_response_token_once_by_hand(rollout):
    """time/tokens_per_s of every RL stage (PPO, GRPO, RAFT, online DPO) is `response_metrics` over the rollout's
    response_lengths: response tokens (EOS included) per second of generation, never prompt or pad tokens."""
    # By hand: row 0 = prompt of 3, response of 2 ending in EOS (9), 2 pads; row 1 = prompt of 2, response of 4
    # without EOS, 1 pad. 2 + 4 = 6 response tokens in 2 s: 3 per second (all 11 real tokens would give 5.5).
    by_hand = Rollout(
        input_ids=torch.tensor([[5, 6, 7, 8, 9, 0, 0], [5, 6, 7, 7, 7, 7, 0]]),
        attention_mask=torch.tensor([[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 0]]),
        response_mask=torch.tensor([[0, 0, 0, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1, 0]]).bool(),
        finished=torch.tensor([True, False]),
    )
    metrics = response_metrics(by_hand.response_lengths, by_hand.finished, torch.tensor([1.0, 0.0]), generate_s=2.0)
    assert metrics["time/tokens_per_s"].item() == 3.0
    # A generated rollout: the same count as the response ids themselves, one list per row.
    tokens = sum(len(ids) for ids in rollout.response_ids())
    metrics = response_metrics(rollout.response_lengths, rollout.finished, torch.zeros(len(rollout.finished)), 1.0)
    assert metrics["time/tokens_per_s"].item() == tokens


def test_generation_logprobs_match_a_teacher_forced_forward_pass(tokenizer, rollout):
    """generate() with the KV cache on left-padded prompts, and one forward pass on the
    right-padded rollout, both at temperature 0.7, give the same log-prob for every response token."""
    policy = tiny_policy(tokenizer)
    recomputed = rollout_logprobs(policy, rollout, temperature=0.7, batch_size=4)
    mask = rollout.response_mask
    assert rollout.generation_logprobs[mask].abs().min() > 0  # real log-probs, not the fill value
    torch.testing.assert_close(recomputed[mask], rollout.generation_logprobs[mask], atol=1e-4, rtol=1e-4)
    assert (recomputed[~mask] == 0).all()
    # at another temperature they differ: the temperature really is applied
    assert not torch.allclose(
        rollout_logprobs(policy, rollout, temperature=1.0, batch_size=4)[mask], recomputed[mask], atol=1e-3
    )


def test_row_seeded_rows_sample_the_same_in_any_batch_or_process(tokenizer):
    """A row's response depends on its prompt and seed only: the batch of 10 in one call equals its
    halves generated apart (two processes, each with its slice of the seeds), in chunks of 3,
    whatever torch's global RNG holds; other seeds give other responses."""
    policy = tiny_policy(tokenizer)
    prompt_ids = encode(tokenizer, PROMPTS) * 2
    seeds = sampling_seeds(7, 0, range(10))
    sampling = SamplingConfig(max_new_tokens=12, temperature=0.7)
    torch.manual_seed(0)
    whole = generate_rollout(policy, tokenizer, prompt_ids, sampling, row_seeds=seeds).response_ids()
    torch.manual_seed(1)
    halves = [
        generate_rollout(policy, tokenizer, prompt_ids[k : k + 5], sampling, 3, row_seeds=seeds[k : k + 5])
        for k in (0, 5)
    ]
    assert halves[0].response_ids() + halves[1].response_ids() == whole
    assert whole[:5] != whole[5:]  # the same prompts, other seeds
    other = generate_rollout(policy, tokenizer, prompt_ids, sampling, row_seeds=sampling_seeds(8, 0, range(10)))
    assert other.response_ids() != whole


def test_sampling_seeds_are_a_function_of_seed_stream_and_row():
    assert sampling_seeds(0, 3, range(4, 6)) == sampling_seeds(0, 3, range(6))[4:]
    assert len(set(sampling_seeds(0, 3, range(100)) + sampling_seeds(0, 4, range(100)))) == 200
    assert all(0 <= s < 2**63 for s in sampling_seeds(1, 0, range(10)))


def test_row_seeded_sampling_draws_from_the_tempered_truncated_distribution():
    """Gumbel-max: argmax(scores / T + Gumbel) over many rows has the frequencies of softmax(scores / T);
    with top_k=2 the third token never wins. logits [2, 1, 0] at T = 2: p ∝ [e, e^0.5, 1]."""
    logits = torch.tensor([[2.0, 1.0, 0.0]]).expand(6000, 3)
    seeds = sampling_seeds(0, 0, range(6000))
    picks = RowSeededSampling(seeds, SamplingConfig(8, temperature=2.0), "cpu")(None, logits).argmax(-1)
    expected = torch.tensor([2.7183, 1.6487, 1.0]) / 5.3670  # [0.506, 0.307, 0.186]
    torch.testing.assert_close(torch.bincount(picks, minlength=3) / 6000.0, expected, atol=0.02, rtol=0)
    top2 = RowSeededSampling(seeds, SamplingConfig(8, temperature=2.0, top_k=2), "cpu")(None, logits).argmax(-1)
    assert top2.max() == 1
    torch.testing.assert_close((top2 == 0).float().mean(), torch.tensor(2.7183 / 4.3670), atol=0.02, rtol=0)


def test_chunked_forward_matches_one_full_pass_and_keeps_row_order(tokenizer, rollout):
    policy = tiny_policy(tokenizer)
    full = torch.where(
        rollout.response_mask, token_logprobs(policy, rollout.input_ids, rollout.attention_mask, 0.7), 0.0
    )
    chunked = rollout_logprobs(policy, rollout, 0.7, batch_size=3)  # sorted by length, trimmed chunks
    torch.testing.assert_close(chunked, full.detach(), atol=1e-5, rtol=1e-5)
    # per-row outputs come back in the original order too
    lengths = forward_in_chunks(lambda ids, mask: mask.sum(-1), rollout, batch_size=3)
    assert lengths.tolist() == rollout.lengths.tolist()


def test_select_trims_to_the_longest_selected_row(rollout):
    shortest = int(torch.argmin(rollout.lengths))
    picked = rollout.select([shortest, shortest])
    assert picked.input_ids.shape == (2, int(rollout.lengths[shortest]))
    assert picked.response_ids() == [rollout.response_ids()[shortest]] * 2


def test_sample_responses_keeps_its_contract(tokenizer):
    policy = tiny_policy(tokenizer)
    torch.manual_seed(3)
    responses = sample_responses(
        policy, tokenizer, encode(tokenizer, PROMPTS), SamplingConfig(max_new_tokens=12, temperature=0.7)
    )
    for ids, text, done in zip(responses.response_ids, responses.texts, responses.finished):
        assert done == (ids[-1] == tokenizer.eos_token_id)
        assert text == tokenizer.decode(ids[:-1] if done else ids)
    greedy = sample_responses(
        policy, tokenizer, encode(tokenizer, PROMPTS), SamplingConfig(max_new_tokens=12, temperature=0)
    )
    again = sample_responses(
        policy, tokenizer, encode(tokenizer, PROMPTS), SamplingConfig(max_new_tokens=12, temperature=0)
    )
    assert greedy.response_ids == again.response_ids


# ---------------------------------------------------------------- reward scoring


def test_reward_is_read_at_each_responses_last_real_token(tokenizer, rollout):
    reward_model = tiny_reward_model(tokenizer)
    scores = score_rollout(reward_model, rollout, batch_size=3)
    for i in range(len(scores)):
        n = int(rollout.lengths[i])
        alone = reward_model(input_ids=rollout.input_ids[i : i + 1, :n]).logits[0, 0]  # unpadded: pooled at the end
        assert scores[i].item() == pytest.approx(alone.item(), abs=1e-5)
        last = rollout.input_ids[i, n - 1].item()
        assert last == tokenizer.eos_token_id or not rollout.finished[i]  # a finished response is read at its EOS


def test_same_tokenizer():
    a = train_tokenizer(TEXTS, vocab_size=300)
    assert same_tokenizer(a, train_tokenizer(TEXTS, vocab_size=300))  # deterministic training: equal vocabularies
    assert not same_tokenizer(a, train_tokenizer([t.upper() + t for t in TEXTS], vocab_size=330))


def test_a_reward_model_with_another_tokenizer_scores_the_retokenized_text(tokenizer, other_tokenizer, rollout):
    assert not same_tokenizer(tokenizer, other_tokenizer)
    reward_model = tiny_reward_model(other_tokenizer)
    scores = score_rollout(
        reward_model, rollout, batch_size=3, policy_tokenizer=tokenizer, reward_tokenizer=other_tokenizer
    )
    prompts = [tokenizer.decode(ids) for ids in rollout.prompt_ids()]
    responses = rollout.texts(tokenizer)
    for i, (prompt, response) in enumerate(zip(prompts, responses)):
        ids = encode(other_tokenizer, [prompt])[0] + encode(other_tokenizer, [response])[0]
        if rollout.finished[i]:
            ids.append(other_tokenizer.eos_token_id)
        expected = reward_scores(reward_model, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))
        assert scores[i].item() == pytest.approx(expected.item(), abs=1e-5)
    # the direct path would feed the policy's ids to a model that reads them as other tokens
    direct = score_rollout(reward_model, rollout, batch_size=3)
    assert not torch.allclose(direct, scores)


def test_retokenizing_with_the_same_vocabulary_reproduces_the_texts(tokenizer):
    """Text that round-trips keeps its token ids, so the re-tokenized batch scores like the rollout."""
    prompt_ids = encode(tokenizer, PROMPTS[:2])
    policy = tiny_policy(tokenizer)
    torch.manual_seed(0)
    rollout = generate_rollout(policy, tokenizer, prompt_ids, SamplingConfig(max_new_tokens=6, temperature=0))
    batch = retokenize(rollout, tokenizer, tokenizer)
    for i in range(2):
        n = int(batch["attention_mask"][i].sum())
        text = tokenizer.decode(batch["input_ids"][i, :n])
        assert text == tokenizer.decode(rollout.input_ids[i, : int(rollout.lengths[i])])
