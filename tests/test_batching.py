"""Where prompt, response and padding sit: masks worked out by hand."""

import pytest
import torch

from rlhf.core.batching import (
    EncodedPair,
    chosen_longer,
    collate_pairs,
    collate_sequences,
    collate_shared_prompt_pairs,
    left_pad,
    shared_prompt_pair_length,
)
from rlhf.rollout.generate import truncate_after_eos

PAD = 0


def test_collate_sequences_masks_only_response_tokens():
    batch = collate_sequences([[5, 6], [7]], [[8, 9, 1], [10, 1]], PAD)
    assert batch["input_ids"].tolist() == [[5, 6, 8, 9, 1], [7, 10, 1, PAD, PAD]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert batch["response_mask"].tolist() == [[False, False, True, True, True], [False, True, True, False, False]]


def test_truncation_drops_oldest_prompt_tokens_and_last_response_tokens():
    batch = collate_sequences([[2, 3, 4, 5]], [[8, 9, 10, 1]], PAD, max_prompt_tokens=2, max_response_tokens=3)
    assert batch["input_ids"].tolist() == [[4, 5, 8, 9, 10]]
    # The two surviving prompt tokens are never inside the response mask.
    assert batch["response_mask"].tolist() == [[False, False, True, True, True]]


def test_collate_pairs_puts_chosen_rows_first():
    pairs = [EncodedPair([5], [6, 1], [7, 7, 1]), EncodedPair([4, 4], [3, 1], [2, 1])]
    batch = collate_pairs(pairs, PAD)
    assert batch["input_ids"].tolist() == [[5, 6, 1, PAD], [4, 4, 3, 1], [5, 7, 7, 1], [4, 4, 2, 1]]


def test_shared_prompt_pairs_keep_the_two_responses_apart():
    pairs = [EncodedPair([5, 6], [7, 1], [8, 1]), EncodedPair([9], [1], [1])]
    batch = collate_shared_prompt_pairs(pairs, PAD)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 1, 8, 1], [9, 1, 1, PAD, PAD, PAD]]
    # Each response continues the prompt's positions, as it would in its own row.
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 2, 3], [0, 1, 1, 0, 0, 0]]
    assert batch["attention_mask"].shape == (2, 1, 6, 6)
    assert batch["attention_mask"][0, 0].int().tolist() == [
        [1, 0, 0, 0, 0, 0],  # prompt
        [1, 1, 0, 0, 0, 0],  # prompt
        [1, 1, 1, 0, 0, 0],  # chosen: prompt + itself
        [1, 1, 1, 1, 0, 0],  # chosen
        [1, 1, 0, 0, 1, 0],  # rejected: prompt + itself, never the chosen tokens
        [1, 1, 0, 0, 1, 1],  # rejected
    ]
    assert batch["attention_mask"][1, 0].int().tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],
        [0, 0, 0, 1, 0, 0],  # pads see only themselves: no all-masked softmax row
        [0, 0, 0, 0, 1, 0],
        [0, 0, 0, 0, 0, 1],
    ]
    assert batch["chosen_last"].tolist() == [3, 1] and batch["rejected_last"].tolist() == [5, 2]
    assert batch["chosen_mask"].int().tolist() == [[1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0]]
    assert batch["rejected_mask"].int().tolist() == [[1, 1, 0, 0, 1, 1], [1, 0, 1, 0, 0, 0]]
    assert [shared_prompt_pair_length(p) for p in pairs] == [6, 3]


def test_shared_prompt_pairs_truncate_like_separate_rows():
    batch = collate_shared_prompt_pairs(
        [EncodedPair([2, 3, 4], [5, 6, 1], [7, 1])], PAD, max_prompt_tokens=2, max_response_tokens=2
    )
    assert batch["input_ids"].tolist() == [[3, 4, 5, 6, 7, 1]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 2, 3]]


def test_shared_prompt_pairs_place_response_values_at_their_tokens():
    pairs = [EncodedPair([2, 3, 4], [5, 6, 1], [7, 1]), EncodedPair([9], [1], [8, 1])]
    values = [([0.1, 0.2, 0.3], [0.4, 0.5]), ([0.6], [0.7, 0.8])]
    batch = collate_shared_prompt_pairs(pairs, PAD, max_prompt_tokens=2, max_response_tokens=2, response_values=values)
    # row 0: prompt [3, 4], chosen [5, 6] (its last value 0.3 truncated with its token), rejected [7, 1]
    torch.testing.assert_close(
        batch["response_values"], torch.tensor([[0, 0, 0.1, 0.2, 0.4, 0.5], [0, 0.6, 0.7, 0.8, 0, 0]])
    )
    assert batch["response_values_mask"].int().tolist() == [[0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 0, 0]]
    with pytest.raises(ValueError, match="one value per response token"):
        collate_shared_prompt_pairs(pairs, PAD, response_values=[([0.1], [0.4, 0.5]), ([0.6], [0.7, 0.8])])


def test_left_pad_aligns_prompt_ends():
    batch = left_pad([[5, 6, 7], [8]], PAD)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [PAD, PAD, 8]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]


def test_truncate_after_eos_keeps_the_first_eos_only():
    eos = 1
    generated = torch.tensor([[4, 1, 5, 1], [4, 5, 6, 7], [1, 9, 9, 9]])
    ids, mask = truncate_after_eos(generated, eos, PAD)
    assert ids.tolist() == [[4, 1, PAD, PAD], [4, 5, 6, 7], [1, PAD, PAD, PAD]]
    assert mask.tolist() == [[True, True, False, False], [True] * 4, [True, False, False, False]]


def test_chosen_longer_counts_response_tokens_not_the_prompt():
    pairs = [
        EncodedPair([1, 2, 3], [4, 5, 6], [7]),  # chosen longer
        EncodedPair([1], [4], [7, 8]),  # shorter
        EncodedPair([1, 2], [4, 5], [7, 8]),  # as long
    ]
    assert chosen_longer(collate_shared_prompt_pairs(pairs, PAD)).tolist() == [1.0, 0.0, 0.5]
