"""Property tests (hypothesis): the dialogue and prompt parsers on any input, and the losses on any
finite input. Examples are few (the suite runs on one shared CPU core) and the database is off, so a
run leaves nothing behind; a failure prints the smallest input it found."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rlhf.core import losses as L
from rlhf.core.errors import UserError
from rlhf.core.ops import group_advantages
from rlhf.data import (
    ASSISTANT,
    DROP_REASONS,
    HUMAN,
    ParsedPair,
    check_invalid_share,
    parse_pair,
    read_rows,
    split_dialogue,
)
from rlhf.rollout.rewards import RewardSource
from rlhf.task import COUNTRIES, INSTRUCTIONS, NAMES, PEOPLE, hh, parse_prompt

SOME = settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

# ----------------------------------------------------------------------------- text that looks like the real thing

# Pieces of HH dialogues and task prompts, so random text often hits the parsers' deeper branches.
WORDS = [
    HUMAN, ASSISTANT, "Human:", "Assistant:", "\n\n", "\n", " ", "?", ".", "What is", "the capital of", "capital",
    "plus", "minus", "times", "3", "9", "0", "is", "has", "Who has", "How many", "apples", "my name is",
    "What is my name", "I think", "favourite colour", "job", "steal my neighbor's car", "kill a stuck process",
    *list(COUNTRIES)[:3], *list(PEOPLE)[:3], *NAMES[:3], *[phrases[0] for phrases in INSTRUCTIONS.values()],
]  # fmt: skip
pieces = st.lists(st.one_of(st.sampled_from(WORDS), st.text(max_size=6)), max_size=14).map("".join)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8) | pieces,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
rows = st.one_of(
    json_values,
    st.fixed_dictionaries({"chosen": pieces, "rejected": pieces}),
    st.fixed_dictionaries({"chosen": json_values, "rejected": pieces}),
    pieces.flatmap(
        lambda p: st.fixed_dictionaries({"chosen": pieces.map(p.__add__), "rejected": pieces.map(p.__add__)})
    ),
)


@SOME
@given(pieces)
def test_split_dialogue_cuts_at_the_last_assistant_turn_or_raises_value_error(dialogue):
    if ASSISTANT not in dialogue:
        with pytest.raises(ValueError):
            split_dialogue(dialogue)
        return
    prompt, response = split_dialogue(dialogue)
    assert prompt + response == dialogue and prompt.endswith(ASSISTANT) and ASSISTANT not in response


@SOME
@given(rows)
def test_parse_pair_never_raises_and_names_a_known_reason(row):
    parsed = parse_pair(row)
    if isinstance(parsed, ParsedPair):
        assert row["chosen"] == parsed.prompt + parsed.chosen and row["rejected"] == parsed.prompt + parsed.rejected
        assert parsed.chosen != parsed.rejected and parsed.chosen.strip() and parsed.rejected.strip()
    else:
        assert parsed in DROP_REASONS


@SOME
@given(st.lists(st.one_of(st.binary(max_size=40), rows.map(lambda r: json.dumps(r).encode())), max_size=6))
@example([b"\x00\r\x00"])  # a carriage return inside a line once split it into two rows
def test_reading_any_jsonl_bytes_gives_rows_or_a_one_line_error(lines):
    """A line that is not JSON is a row of None (counted as malformed); bytes that are not UTF-8 stop the
    read with a UserError; nothing else escapes."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "pairs.jsonl"
        path.write_bytes(b"\n".join(line.replace(b"\n", b" ") for line in lines))
        try:
            read = list(read_rows(path))
        except UserError as error:
            assert "\n" not in str(error) and "; " in str(error)
            return
    assert len(read) <= len(lines)
    assert all(parse_pair(row) in DROP_REASONS or isinstance(parse_pair(row), ParsedPair) for row in read)


@SOME
@given(st.lists(st.sampled_from(DROP_REASONS), max_size=30), st.integers(0, 40), st.floats(0, 1))
def test_invalid_share_stops_exactly_above_the_setting(reasons, extra_rows, max_fraction):
    n_rows = len(reasons) + extra_rows
    n_invalid = sum(reason in ("malformed", "no_assistant_turn") for reason in reasons)
    if n_rows and n_invalid > max_fraction * n_rows:
        with pytest.raises(UserError, match=r"data\.max_invalid_fraction"):
            check_invalid_share("x.jsonl", "train", reasons, n_rows, max_fraction)
    else:
        check_invalid_share("x.jsonl", "train", reasons, n_rows, max_fraction)


@SOME
@given(st.one_of(st.text(max_size=40), pieces, st.lists(pieces, min_size=1, max_size=5).map(lambda turns: hh(*turns))))
def test_parse_prompt_raises_only_value_error_on_garbage(prompt):
    try:
        spec = parse_prompt(prompt)
    except ValueError:
        return
    assert prompt.startswith(HUMAN) and prompt.endswith(ASSISTANT)
    assert spec.family and spec.kind and spec.answer_template is not None


# ----------------------------------------------------------------------------- losses on finite inputs


def tensors(shape, low: float, high: float):
    """A float32 tensor of `shape` with finite entries in [low, high]."""
    n = math.prod(shape)
    return st.lists(st.floats(low, high, width=32), min_size=n, max_size=n).map(
        lambda xs: torch.tensor(xs, dtype=torch.float32).reshape(shape)
    )


def masks(shape):
    n = math.prod(shape)
    return st.lists(st.booleans(), min_size=n, max_size=n).map(lambda xs: torch.tensor(xs).reshape(shape))


shapes = st.tuples(st.integers(1, 4), st.integers(1, 6))
LOGPROB = (-30.0, 0.0)  # log-probs of sampled tokens
REWARD = (-1e3, 1e3)


def finite(loss: torch.Tensor, stats: dict) -> bool:
    return bool(torch.isfinite(loss)) and all(bool(torch.isfinite(v).all()) for v in stats.values())


@SOME
@given(shapes.flatmap(lambda s: st.tuples(tensors(s, *LOGPROB), masks(s))))
def test_sft_loss_is_finite_and_ignores_what_the_mask_hides(case):
    logprobs, mask = case
    loss, stats = L.sft_loss(logprobs, mask)
    assert finite(loss, stats) and loss >= 0
    hidden = torch.where(mask, logprobs, torch.nan)  # NaN in every masked-out position changes nothing
    assert torch.equal(L.sft_loss(hidden, mask)[0], loss)


@SOME
@given(
    st.integers(1, 8).flatmap(lambda b: st.tuples(tensors((b,), *REWARD), tensors((b,), *REWARD))),
    st.floats(0, 10),
    st.floats(0, 0.49),
)
def test_bradley_terry_loss_is_finite_and_a_nan_reward_is_never_hidden(rewards, margin, label_smoothing):
    chosen, rejected = rewards
    loss, stats = L.bradley_terry_loss(chosen, rejected, margin, label_smoothing)
    assert finite(loss, stats) and loss >= 0 and 0 <= stats["accuracy"] <= 1
    # A NaN reward makes the loss NaN: the training step then stops with a one-line error (rlhf.loop.step.train_step)
    # instead of silently training on a number that means nothing.
    chosen[0] = torch.nan
    assert torch.isnan(L.bradley_terry_loss(chosen, rejected, margin, label_smoothing)[0])


@SOME
@given(
    st.sampled_from(sorted(L.DPO_LOSSES)),
    st.integers(1, 6).flatmap(lambda b: st.tuples(*[tensors((b,), -500.0, 0.0)] * 4)),
    st.floats(0.01, 10),
    st.floats(0, 0.49),
)
def test_dpo_family_is_finite_for_finite_logps(loss_type, logps, beta, label_smoothing):
    smoothing = label_smoothing if loss_type == "cdpo" else 0.0
    loss, stats = L.DPO_LOSSES[loss_type](*logps, beta, smoothing)
    assert finite(loss, stats) and loss >= 0
    logps[0][0] = torch.nan
    assert torch.isnan(L.DPO_LOSSES[loss_type](*logps, beta, smoothing)[0])
    if loss_type != "cdpo" and label_smoothing > 0:  # a setting the loss would ignore is refused, in one line
        with pytest.raises(ValueError, match="label_smoothing"):
            L.DPO_LOSSES[loss_type](*logps, beta, label_smoothing)


@SOME
@given(
    shapes.flatmap(
        lambda s: st.tuples(tensors(s, *LOGPROB), tensors(s, *LOGPROB), tensors(s, -100.0, 100.0), masks(s))
    ),
    st.floats(0.01, 0.5),
    st.floats(0.01, 0.5),
)
def test_ppo_losses_are_finite_and_ignore_what_the_mask_hides(case, clip_low, clip_high):
    new, old, advantages, mask = case
    loss, stats = L.ppo_policy_loss(new, old, advantages, mask, clip_low, clip_high)
    assert finite(loss, stats) and 0 <= stats["clipfrac"] <= 1
    hidden = torch.where(mask, advantages, torch.nan)
    assert torch.equal(L.ppo_policy_loss(new, old, hidden, mask, clip_low, clip_high)[0], loss)
    value_loss, value_stats = L.ppo_value_loss(advantages, old, new, mask, clip_low)
    assert finite(value_loss, value_stats) and value_loss >= 0


@SOME
@given(
    st.integers(1, 3).flatmap(
        lambda groups: st.tuples(
            st.just(groups),
            st.integers(2, 4).flatmap(
                lambda g: st.tuples(st.just(g), tensors((groups * g,), *REWARD), st.integers(1, 5))
            ),
        )
    ),
    st.sampled_from(sorted(L.GRPO_NORMALIZERS)),
    st.floats(0, 0.5),
    st.booleans(),
)
def test_grpo_advantages_and_loss_are_finite_and_a_nan_reward_stays_in_its_group(case, normalization, beta, scale):
    n_groups, (group_size, rewards, width) = case
    advantages, zero_std = group_advantages(rewards, group_size, scale=scale)  # (N,), (n_groups,)
    assert torch.isfinite(advantages).all()
    assert (advantages.view(n_groups, group_size)[zero_std] == 0).all()  # equal rewards: exactly no signal
    n = n_groups * group_size
    new, old, ref = (torch.linspace(-3, -0.1, n * width).view(n, width) * k for k in (1.0, 1.1, 0.9))
    mask = torch.ones(n, width, dtype=torch.bool)
    loss, stats = L.grpo_loss(new, old, ref if beta else None, advantages, mask, 0.2, 0.2, beta, normalization)
    assert finite(loss, stats)
    rewards[0] = torch.nan
    poisoned, _ = group_advantages(rewards, group_size, scale=scale)
    assert torch.isnan(poisoned[:group_size]).all() and torch.equal(poisoned[group_size:], advantages[group_size:])
    assert torch.isnan(L.grpo_loss(new, old, ref if beta else None, poisoned, mask, 0.2, 0.2, beta, normalization)[0])


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_reward_model_score_stops_the_rl_stage_naming_the_model(bad):
    """Caught where the score enters the training signal, before the loss turns NaN with a misleading hint."""
    source = RewardSource("model", "grpo.reward")
    scores = torch.tensor([0.5, bad, -0.2, bad])
    with pytest.raises(UserError) as error:
        source.score(["p"] * 4, ["r"] * 4, scores)
    message = str(error.value)
    assert "\n" not in message and "grpo.reward: the reward model gave 2 of 4 responses a non-finite score" in message
    assert "re-train it (part1_reward/train_reward.py --force" in message.rpartition("; ")[2]
    total, _ = source.score(["p"] * 2, ["r"] * 2, torch.tensor([0.5, -0.2]))  # finite scores pass
    assert torch.equal(total, torch.tensor([0.5, -0.2]))
