"""Tests for the online stages' library (rlhf.online, rlhf.methods; the PPO value model in rlhf.models.modeling).
Expected values are worked out by hand in each test; GAE, whitening, the PPO/GRPO losses and the KL estimators are
tested in test_ops.py and test_losses.py."""

import contextlib
import json
import math
import re
from types import SimpleNamespace

import pytest
import torch
from transformers import GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel

from rlhf import task
from rlhf.analysis.evaluation import sequence_kl
from rlhf.core.errors import UserError
from rlhf.core.ops import shifted_entropy, shifted_logprobs
from rlhf.core.winrates import head_to_head
from rlhf.methods.passes import (
    align_values,
    budget_micro_batch_rows,
    loss_units,
    micro_batch_rows,
    minibatch_indices,
    rollout_micro_batches,
)
from rlhf.methods.plan import plan_rl
from rlhf.methods.rules import check_grpo_config, check_ppo_config
from rlhf.methods.shaping import (
    AdaptiveKLController,
    FixedKLController,
    apply_missing_eos_penalty,
    make_kl_controller,
    shape_rewards,
)
from rlhf.models.modeling import (
    PolicyAndValue,
    check_context,
    disable_dropout,
    reward_scores,
    token_logprobs,
    value_model_from_reward,
)
from rlhf.models.roles import check_frozen, frozen_digests, weights_digest
from rlhf.online.checkpoints import load_rl_checkpoint, save_rl_checkpoint
from rlhf.online.harness import OnlineStage
from rlhf.online.held_out import (
    HeldOut,
    compare_with_sft,
    eval_due,
    eval_metrics,
    final_line,
    gold_against_sft,
    summarize_samples,
)
from rlhf.online.prompts import check_gold_prompts, iteration_prompts, load_rl_prompts, local_prompt_rows
from rlhf.online.stats import flat_reward_warning, gold_metrics, loop_costs, pearson, response_metrics
from rlhf.rollout.batch import Rollout, SamplingConfig, eval_sampling
from rlhf.stage.config import load_config, preset_path
from rlhf.stage.run import RunDir
from rlhf.stage.schema import GRPOConfig, PPOConfig, RLConfig


def close(actual, expected, tol=1e-6):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=torch.float64), torch.as_tensor(expected, dtype=torch.float64), rtol=tol, atol=tol
    )


# ---------------------------------------------------------------- rewards


def test_missing_eos_penalty_by_hand():
    scores = torch.tensor([0.5, 0.5, -2.0])
    finished = torch.tensor([True, False, False])
    close(apply_missing_eos_penalty(scores, finished, 1.0), [0.5, -0.5, -3.0])
    close(apply_missing_eos_penalty(scores, finished, 0.0), [0.5, 0.5, -2.0])


def test_shape_rewards_kl_penalty_on_every_token_and_score_at_the_last():
    # row 0: prompt, 3 response tokens, then padding; row 1: prompt of 2, response of 2 tokens
    mask = torch.tensor([[False, True, True, True, False], [False, False, True, True, False]])
    logprobs = torch.tensor([[9.0, -1.0, -2.0, -0.5, 9.0], [9.0, 9.0, -1.0, -1.0, 9.0]])
    ref_logprobs = torch.tensor([[0.0, -1.5, -1.0, -0.5, 0.0], [0.0, 0.0, -2.0, -0.5, 0.0]])
    scores = torch.tensor([2.0, -1.0])
    rewards, kl = shape_rewards(scores, logprobs, ref_logprobs, mask, kl_coef=0.1)
    # k1 = log pi - log pi_ref on response tokens: row 0 (0.5, -1.0, 0.0), row 1 (1.0, -0.5)
    close(kl, [[0, 0.5, -1.0, 0.0, 0], [0, 0, 1.0, -0.5, 0]])
    # -0.1 * k1, plus the score on the last response token
    close(rewards, [[0, -0.05, 0.1, 0.0 + 2.0, 0], [0, 0, -0.1, 0.05 - 1.0, 0]])
    close(sequence_kl(logprobs, ref_logprobs, mask), [-0.5, 0.5])


def test_fixed_kl_controller_never_moves():
    controller = FixedKLController(0.05)
    controller.update(100.0, 512)
    assert controller.value == 0.05


def test_adaptive_kl_controller_by_hand():
    controller = AdaptiveKLController(0.1, target=6.0, horizon=100)
    controller.update(9.0, n_episodes=10)  # error 9/6 - 1 = 0.5, clipped to 0.2: beta * (1 + 0.2 * 10/100)
    close(controller.value, 0.1 * 1.02)
    controller.update(5.4, n_episodes=10)  # error -0.1: beta * (1 - 0.1 * 0.1)
    close(controller.value, 0.1 * 1.02 * 0.99)
    controller.update(0.0, n_episodes=50)  # error -1 clipped to -0.2: beta * (1 - 0.2 * 0.5)
    close(controller.value, 0.1 * 1.02 * 0.99 * 0.9)


def test_make_kl_controller_follows_the_config():
    assert isinstance(make_kl_controller(PPOConfig(kl_coef=0.05)), FixedKLController)
    adaptive = make_kl_controller(PPOConfig(kl_coef=0.15, kl_target=6.0, kl_horizon=10_000))
    assert isinstance(adaptive, AdaptiveKLController) and (adaptive.value, adaptive.target, adaptive.horizon) == (
        0.15,
        6.0,
        10_000,
    )


# ---------------------------------------------------------------- batch-size rules


def test_plan_rl_derived_sizes():
    cfg = RLConfig(batch_size=64, num_minibatches=2, micro_batch_size=8, total_episodes=1000, epochs=4)
    plan = plan_rl("ppo", cfg, world_size=2, n_prompts=500)
    # 1000 // 64 = 15 iterations; 32 rollouts per process, minibatches of 16 = 2 micro-batches of 8
    assert (plan.iterations, plan.prompts_per_iteration, plan.local_prompts, plan.local_batch) == (15, 64, 32, 32)
    assert (plan.minibatch_size, plan.accumulation, plan.optimizer_steps) == (16, 2, 15 * 4 * 2)
    grpo = plan_rl("grpo", RLConfig(batch_size=64, micro_batch_size=16, total_episodes=640), 1, 500, group_size=8)
    assert (grpo.prompts_per_iteration, grpo.local_batch, grpo.accumulation) == (8, 64, 4)


@pytest.mark.parametrize(
    "changes, world, group, message",
    [
        ({"batch_size": 60}, 1, 8, "grpo.batch_size=60 must be divisible by grpo.group_size=8"),
        ({"batch_size": 48}, 4, 8, "6 prompts per iteration, not divisible by 4 processes"),
        ({"batch_size": 64, "num_minibatches": 3}, 1, 1, "not divisible by grpo.num_minibatches=3"),
        ({"batch_size": 64, "micro_batch_size": 24}, 1, 1, "not divisible by grpo.micro_batch_size=24"),
        ({"batch_size": 64, "total_episodes": 32}, 1, 1, "less than one batch"),
        ({"batch_size": 64, "temperature": 0.0}, 1, 1, "grpo.temperature=0.0 must be > 0"),
        ({"epochs": 0}, 1, 1, "grpo.epochs=0 must be at least 1"),
        ({"batch_size": 1024, "total_episodes": 4096}, 1, 1, "fewer than the 1024 needed"),
    ],
)
def test_batch_size_rules_are_one_line_errors(changes, world, group, message):
    cfg = RLConfig(**{"batch_size": 64, "micro_batch_size": 8, "total_episodes": 1000, **changes})
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")) as error:
        plan_rl("grpo", cfg, world, n_prompts=500, group_size=group)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "check, cfg, message",
    [
        (check_grpo_config, GRPOConfig(group_size=1), "grpo.group_size=1 must be at least 2"),
        (
            check_grpo_config,
            GRPOConfig(loss_normalization="dr_grpo"),
            "grpo.loss_normalization must be one of sequence, token",
        ),
        (check_grpo_config, GRPOConfig(kl_coef=-0.1), "grpo.kl_coef=-0.1 must be >= 0"),
        (
            check_grpo_config,
            GRPOConfig(group_size=1, scale_rewards=False, baseline="leave_one_out", batch_size=8),
            "grpo.group_size=1 must be at least 2",
        ),
        (check_grpo_config, GRPOConfig(baseline="rloo"), "grpo.baseline must be one of group_mean, leave_one_out"),
        (check_grpo_config, GRPOConfig(ratio_level="seq"), "grpo.ratio_level must be one of sequence, token"),
        (check_ppo_config, PPOConfig(value_model="critic"), "ppo.value_model must be 'separate' or 'shared'"),
        (check_ppo_config, PPOConfig(kl_target=0.0), "ppo.kl_target=0.0 must be > 0"),
        (check_ppo_config, PPOConfig(lam=1.5), "must lie in"),
    ],
)
def test_stage_config_errors(check, cfg, message):
    with pytest.raises(UserError, match=message):
        check(cfg)


def test_group_size_one_is_allowed_without_std_scaling():
    check_grpo_config(GRPOConfig(group_size=1, scale_rewards=False))


def test_context_and_gold_prompt_checks():
    check_context("ppo", 100, 92, 192)
    with pytest.raises(UserError, match="exceeds the model's 192 positions"):
        check_context("ppo", 101, 92, 192)
    check_gold_prompts("ppo", ["\n\nHuman: What is 3 plus 4?\n\nAssistant:"], "data/val.jsonl")
    with pytest.raises(UserError, match="re-run the data stage"):
        check_gold_prompts("ppo", ["\n\nHuman: Name the capital of Nowhereland.\n\nAssistant:"], "data/val.jsonl")


def test_iteration_prompts_walk_a_seeded_permutation():
    first_epoch = [iteration_prompts(10, 3, i, seed=7) for i in range(3)]  # 10 // 3 = 3 iterations per epoch
    flat = [i for rows in first_epoch for i in rows]
    assert len(set(flat)) == 9 and all(0 <= i < 10 for i in flat)  # no prompt twice in an epoch
    assert first_epoch == [iteration_prompts(10, 3, i, seed=7) for i in range(3)]  # a function of (seed, iteration)
    assert iteration_prompts(10, 3, 3, seed=7) != first_epoch[0]  # the next epoch is reshuffled
    assert iteration_prompts(10, 3, 0, seed=8) != first_epoch[0]


def test_local_prompt_rows_shard_the_iteration_and_repeat_each_prompt_per_group():
    a, b, c, d = iteration_prompts(10, 4, 1, seed=3)
    assert local_prompt_rows(10, 4, 1, 3, rank=0, world_size=2) == [a, b]
    assert local_prompt_rows(10, 4, 1, 3, rank=1, world_size=2, group_size=3) == [
        c,
        c,
        c,
        d,
        d,
        d,
    ]  # a group is consecutive
    assert local_prompt_rows(10, 4, 1, 3, rank=0, world_size=1) == [a, b, c, d]


def test_load_rl_prompts_dedupes_cuts_from_the_left_and_checks_gold_prompts(tmp_path):
    cfg = load_config(preset_path("tiny"), ["data.max_prompt_tokens=3"])
    run = RunDir(tmp_path)
    (tmp_path / "data").mkdir()
    p1, p2, p3 = (
        "\n\nHuman: What is 3 plus 4?\n\nAssistant:",
        "\n\nHuman: What is 2 plus 2?\n\nAssistant:",
        "\n\nHuman: What is 5 plus 1?\n\nAssistant:",
    )
    (tmp_path / "data" / "train.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in (p1, p2, p1)))
    (tmp_path / "data" / "val.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in (p3, p2)))

    def tokenizer(texts, add_special_tokens):  # one id per character
        return {"input_ids": [[ord(ch) for ch in text] for text in texts]}

    prompts = load_rl_prompts("ppo", run, cfg, tokenizer, n_eval=1)
    assert prompts.train_texts == [p1, p2] and prompts.eval_texts == [p3]
    assert prompts.train_ids == [[ord(ch) for ch in "nt:"]] * 2 and prompts.eval_ids == [[ord(ch) for ch in "nt:"]]
    assert prompts.longest == 3
    (tmp_path / "data" / "val.jsonl").write_text(json.dumps({"prompt": "\n\nHuman: Hi.\n\nAssistant:"}) + "\n")
    with pytest.raises(UserError, match=re.escape("ppo: data/val.jsonl holds a prompt the gold judge cannot parse")):
        load_rl_prompts("ppo", run, cfg, tokenizer, n_eval=1)


# ---------------------------------------------------------------- checkpoints


def fake_accelerator(printed: list[str]):
    return SimpleNamespace(
        is_main_process=True,
        unwrap_model=lambda model: model,
        wait_for_everyone=lambda: None,
        print=printed.append,
        clip_grad_norm_=torch.nn.utils.clip_grad_norm_,
    )


def test_rl_checkpoint_round_trip_and_a_different_config_is_an_error(tmp_path):
    cfg, run, printed = load_config(preset_path("tiny")), RunDir(tmp_path), []
    accelerator = fake_accelerator(printed)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert load_rl_checkpoint("ppo", run, cfg, accelerator, model, optimizer, None, 8) is None  # a fresh start
    save_rl_checkpoint("ppo", run, cfg, accelerator, model, optimizer, None, 3, kl_coef=0.07)
    saved = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    state = load_rl_checkpoint("ppo", run, cfg, accelerator, model, optimizer, None, 8)
    assert (state["iteration"], state["kl_coef"]) == (3, 0.07) and torch.equal(model.weight, saved)
    assert printed == ["[ppo] resumed from iteration 3/8"]
    other = load_config(preset_path("tiny"), ["ppo.lr=0.5"])
    with pytest.raises(UserError, match="belongs to a different config; delete it or pass --force"):
        load_rl_checkpoint("ppo", run, other, accelerator, model, optimizer, None, 8)


# ---------------------------------------------------------------- minibatching


def test_minibatch_indices_partition_the_batch():
    parts = minibatch_indices(12, 3, torch.Generator().manual_seed(0))
    assert [len(p) for p in parts] == [4, 4, 4]
    assert sorted(torch.cat(parts).tolist()) == list(range(12))


class OneProcess:
    """The part of an Accelerator that `rollout_micro_batches` uses: one process, whose reductions are identities."""

    num_processes = 1

    def reduce(self, tensor, reduction):
        return tensor


class TwoProcesses:
    """As `OneProcess`, for one of two processes whose "mean" reduction averages its own tensor with `other`'s."""

    def __init__(self, other: float):
        self.other = other

    def reduce(self, tensor, reduction):
        return (tensor + self.other) / 2


def right_padded(spans: list[tuple[int, int]], width: int) -> Rollout:
    """A rollout whose row k is a prompt of spans[k][0] tokens and a response of spans[k][1], right-padded."""
    response_mask = torch.zeros(len(spans), width, dtype=torch.bool)
    for row, (prompt, response) in enumerate(spans):
        response_mask[row, prompt : prompt + response] = True
    lengths = torch.tensor([prompt + response for prompt, response in spans])
    attention_mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    return Rollout(
        torch.zeros(len(spans), width, dtype=torch.long),
        attention_mask,
        response_mask,
        torch.ones(len(spans), dtype=torch.bool),
    )


def test_loss_units_by_hand():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    close(loss_units(mask, "token"), [3.0, 1.0, 4.0, 2.0])
    close(loss_units(mask, "sequence"), [1.0, 1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="normalization"):
        loss_units(mask, "dr_grpo")


def test_rollout_micro_batches_weigh_their_loss_units_and_sum_to_the_minibatch_mean():
    # rows' response tokens 3, 1, 4, 2 (prompts of one token), micro-batches of 2 rows sorted by length:
    # rows [1, 3] (1 + 2 = 3 tokens) and [0, 2] (3 + 4 = 7 tokens) of 10
    rollout = right_padded([(1, 3), (1, 1), (1, 4), (1, 2)], 6)
    micro = rollout_micro_batches(OneProcess(), torch.arange(4), rollout, 2, "token")
    assert [m.batch.rows.tolist() for m in micro] == [[1, 3], [0, 2]]
    assert [m.batch.input_ids.shape[1] for m in micro] == [3, 5]  # each trimmed to its longest row
    close([m.loss_weight for m in micro], [0.3, 0.7])
    close([m.metric_weight for m in micro], [0.3, 0.7])
    # token-weighted micro-batch means add up to the mean over the whole minibatch
    values = torch.arange(24.0).reshape(4, 6)
    micro_means = [values[m.batch.rows, : m.batch.input_ids.shape[1]][m.batch.response_mask].mean() for m in micro]
    close(sum(m.loss_weight * mean for m, mean in zip(micro, micro_means)), values[rollout.response_mask].mean())
    # "sequence": each micro-batch's loss weighs its rows, its token-mean metrics still its tokens
    micro = rollout_micro_batches(OneProcess(), torch.arange(4), rollout, 3, "sequence")
    close([m.loss_weight for m in micro], [0.75, 0.25])  # 3 rows, then 1
    close([m.metric_weight for m in micro], [0.6, 0.4])  # rows 1, 3, 0: 6 tokens; row 2: 4
    tied = rollout_micro_batches(OneProcess(), torch.tensor([3, 1, 0]), right_padded([(1, 2)] * 4, 3), 3, "token")
    assert tied[0].batch.rows.tolist() == [3, 1, 0]  # equal lengths keep their order


def test_rollout_micro_batches_across_processes_give_the_global_token_mean():
    """Two processes hold rows [0, 1] (4 tokens) and [2, 3] (6 tokens): 5 units per process on average. Their
    weights sum to 4/5 and 6/5, so DDP's average over processes of the weighted micro-batch means is the mean over
    all 10 tokens, as one process with the whole minibatch."""
    rollout = right_padded([(1, 3), (1, 1), (1, 4), (1, 2)], 6)
    first = rollout_micro_batches(TwoProcesses(6.0), torch.tensor([0, 1]), rollout, 1, "token")
    second = rollout_micro_batches(TwoProcesses(4.0), torch.tensor([2, 3]), rollout, 1, "token")
    assert [m.batch.rows.item() for m in first + second] == [1, 0, 3, 2]  # narrowest first on each
    close([m.loss_weight for m in first], [1 / 5, 3 / 5])
    close([m.loss_weight for m in second], [2 / 5, 4 / 5])
    values = torch.arange(24.0).reshape(4, 6)
    row_means = {k: values[k][rollout.response_mask[k]].mean() for k in range(4)}  # 2, 7, 14.5, 19.5
    ddp = sum(m.loss_weight * row_means[m.batch.rows.item()] for m in first + second) / 2
    close(ddp, values[rollout.response_mask].mean())  # (1+2+3 + 7 + 13+14+15+16 + 19+20) / 10 = 11
    close(ddp, 11.0)
    # "sequence": every process holds as many rows, so a row weighs 1/2 on each
    close(
        [m.loss_weight for m in rollout_micro_batches(TwoProcesses(2.0), torch.tensor([0, 1]), rollout, 1, "sequence")],
        [0.5, 0.5],
    )


def test_a_token_budget_cuts_rollouts_widest_first_and_weighs_them_as_one_pass():
    """ppo.micro_batch_tokens: the minibatch's rows, widest first, each micro-batch filled while rows x its widest
    row stays within the budget; whatever the cut, each weighs its share of the minibatch's loss units, so the
    weighted means are the minibatch's mean."""
    rollout = right_padded([(1, 3), (1, 1), (1, 4), (1, 2)], 6)  # lengths 4, 2, 5, 3; response tokens 3, 1, 4, 2
    chunks = budget_micro_batch_rows(OneProcess(), torch.arange(4), rollout.lengths, rollout.response_lengths, 8)
    # widest first: row 2 (5; with row 0, 2 x 5 = 10 > 8), then rows 0, 3 (2 x 4 = 8), then row 1
    assert [rows.tolist() for rows in chunks] == [[2], [0, 3], [1]]
    micro = rollout_micro_batches(OneProcess(), torch.arange(4), rollout, 4, "token", micro_batch_tokens=8)
    assert [m.batch.rows.tolist() for m in micro] == [[2], [0, 3], [1]]
    close([m.loss_weight for m in micro], [0.4, 0.5, 0.1])  # 4, 3 + 2, 1 of 10 response tokens
    values = torch.arange(24.0).reshape(4, 6)
    micro_means = [values[m.batch.rows, : m.batch.input_ids.shape[1]][m.batch.response_mask].mean() for m in micro]
    close(sum(m.loss_weight * mean for m, mean in zip(micro, micro_means)), values[rollout.response_mask].mean())
    close(
        [
            m.loss_weight
            for m in rollout_micro_batches(OneProcess(), torch.arange(4), rollout, 4, "sequence", micro_batch_tokens=8)
        ],
        [0.25, 0.5, 0.25],
    )
    # a budget narrower than any row: one row each
    assert len(rollout_micro_batches(OneProcess(), torch.arange(4), rollout, 4, "token", micro_batch_tokens=1)) == 4


def test_micro_batch_rows_sort_by_length():
    lengths = torch.tensor([5, 2, 7, 3, 9])
    response_lengths = torch.tensor([2, 1, 4, 1, 8])
    chunks = micro_batch_rows(torch.tensor([2, 0, 3, 1]), lengths, response_lengths, 2)
    assert [rows.tolist() for rows in chunks] == [[1, 3], [0, 2]]  # by length: rows 1 (2), 3 (3), 0 (5), 2 (7)


# ---------------------------------------------------------------- training passes


def tiny_gpt2(**kwargs):
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=50, n_positions=32, n_embd=16, n_layer=1, n_head=2, pad_token_id=1, **kwargs)
    return config


def test_shifted_logprobs_match_token_logprobs_and_entropy_by_hand():
    model = GPT2LMHeadModel(tiny_gpt2()).eval()
    ids = torch.randint(2, 50, (2, 6))
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
    close(shifted_logprobs(logits, ids, 0.7), token_logprobs(model, ids, mask, 0.7).detach(), tol=1e-5)
    # two equal logits and one -inf-ish: entropy ln 2 at any temperature; column 0 is 0
    logits = torch.tensor([[[0.0, 0.0, -1e9], [5.0, 5.0, -1e9]]])
    close(shifted_entropy(logits, 0.5), [[0.0, math.log(2)]])


def test_align_values_reads_the_state_before_each_token():
    close(align_values(torch.tensor([[1.0, 2.0, 3.0, 4.0]])), [[0.0, 1.0, 2.0, 3.0]])


def test_value_model_from_reward_starts_at_the_reward_on_the_last_token():
    reward_model = GPT2ForSequenceClassification(tiny_gpt2(num_labels=1)).eval().requires_grad_(False)
    critic = value_model_from_reward(
        GPT2ForSequenceClassification(tiny_gpt2(num_labels=1)).eval()
    )  # same seed: same weights
    ids = torch.randint(2, 50, (3, 7))
    mask = torch.ones_like(ids)
    values = critic(ids, mask)  # (3, 7)
    close(values[:, -1], reward_scores(reward_model, ids, mask).detach(), tol=1e-5)
    # the critic is a copy: training it leaves the reward model alone
    before = weights_digest(reward_model)
    values.sum().backward()
    with torch.no_grad():
        for p in critic.parameters():
            p -= 0.1 * p.grad
    assert weights_digest(reward_model) == before


@pytest.mark.parametrize("separate", [True, False])
def test_policy_and_value_shapes_and_trainable_parts(separate):
    policy = GPT2LMHeadModel(tiny_gpt2())
    disable_dropout(policy)
    critic = value_model_from_reward(GPT2ForSequenceClassification(tiny_gpt2(num_labels=1))) if separate else None
    model = PolicyAndValue(policy, critic)
    ids = torch.randint(2, 50, (2, 5))
    logits, values = model(ids, torch.ones_like(ids))
    assert logits.shape == (2, 5, 50) and values.shape == (2, 5) and values.dtype == torch.float32
    values.sum().backward()
    policy_grads = [p.grad for p in policy.transformer.parameters() if p.grad is not None]
    # a separate critic keeps the value loss out of the policy; a shared head trains the backbone too
    assert bool(policy_grads) == (not separate)


# ---------------------------------------------------------------- statistics and the final comparison


def test_pearson_and_head_to_head_by_hand():
    close(pearson(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([2.0, 4.0, 6.0])), 1.0)
    close(pearson(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 0.0, 1.0])), 0.0)
    assert pearson(torch.tensor([1.0, 1.0]), torch.tensor([0.0, 1.0])) == 0.0  # constant: defined as 0
    summary = head_to_head([1.0, 0.0, 1.0, -0.3], [0.0, 0.0, 1.0, 0.7])  # win, tie, tie, loss
    assert (summary["wins"], summary["losses"], summary["ties"]) == (1, 1, 2)
    close(summary["win_rate"], (1 + 0.5 * 2) / 4)


def test_compare_with_sft_uses_the_gold_judge_head_to_head():
    prompts = ["\n\nHuman: What is 3 plus 4?\n\nAssistant:", "\n\nHuman: What is 2 plus 2?\n\nAssistant:"]
    policy = {
        "responses": [" 3 plus 4 is 7.", " 2 plus 2 is 4."],
        "rewards": [1.0, 0.5],
        "lengths": [8, 8],
        "finished": [True, True],
        "kl": [2.0, 4.0],
    }
    sft = {
        "responses": [" 3 plus 4 is 9.", " 2 plus 2 is 4."],
        "rewards": [0.0, 0.5],
        "lengths": [8, 6],
        "finished": [True, False],
        "kl": [0.0, 0.0],
    }
    results = compare_with_sft(prompts, policy, sft, gold=True)
    assert (
        task.gold_score(prompts[0], policy["responses"][0]) == 1.0
        and task.gold_score(prompts[0], sft["responses"][0]) == 0.0
    )
    assert (results["gold_wins"], results["gold_losses"], results["gold_ties"]) == (1, 0, 1)
    close(results["gold_win_rate_vs_sft"], 0.75)
    close(results["gold_score_mean"], 1.0)
    close(results["sft_gold_score_mean"], 0.5)
    close(results["kl_to_ref"], 3.0)
    close(results["reward_delta"], 0.5)
    close(results["sft_eos_rate"], 0.5)
    assert "gold_score_mean" not in compare_with_sft(prompts, policy, sft, gold=False)


def test_gold_against_sft_by_hand():
    """The held-out comparison every policy stage publishes (DPO's too), by hand: scores 1, 0.5, 0 and -1 against
    0, 0.5, 1 and -1 are a win, a tie, a loss and a tie."""
    results = gold_against_sft([1.0, 0.5, 0.0, -1.0], [0.0, 0.5, 1.0, -1.0])
    assert (results["gold_wins"], results["gold_losses"], results["gold_ties"]) == (1, 1, 2)
    close(results["gold_win_rate_vs_sft"], (1 + 2 / 2) / 4)
    close(results["gold_score_mean"], 0.125)
    close(results["sft_gold_score_mean"], 0.125)
    close(results["gold_delta"], 0.0)
    good = [task.is_good_score(score) for score in (1.0, 0.5, 0.0, -1.0)]
    close(results["gold_good_rate"], sum(good) / 4)
    low, high = results["gold_win_rate_ci95"]
    assert low < 0.5 < high and results["gold_sign_test_p"] == 1.0  # one win, one loss: no evidence either way


def test_online_stage_calls_out_of_order_stop_at_once():
    """OnlineStage's set-up runs in one order (`__init__`, `prepare`, `resume`, then the loop): a call before its
    turn, or a second `prepare`, is a one-line error naming the call it needs."""
    stage = OnlineStage.__new__(OnlineStage)  # the phases alone: no run folder, no model
    stage.stage, stage.phase = "grpo", "created"
    with pytest.raises(RuntimeError, match=r"grpo: OnlineStage.resume\(\) runs after prepare\(\), once"):
        stage._enter("resume()", "prepared", "running")
    with pytest.raises(RuntimeError, match=r"OnlineStage.sample\(\) runs after resume\(\) \(the stage is created\)"):
        stage._enter("sample()", "running")
    stage._enter("prepare()", "created", "prepared")
    with pytest.raises(RuntimeError, match="the stage is prepared"):
        stage._enter("prepare()", "created", "prepared")
    stage._enter("resume()", "prepared", "running")
    stage._enter("sample()", "running")  # every iteration
    stage._enter("sample()", "running")
    assert stage.phase == "running"


@pytest.mark.parametrize("separate", [True, False])
def test_ppo_optimizer_gives_the_critic_its_own_learning_rate(separate):
    from rlhf.methods.passes import build_ppo_optimizer

    policy = GPT2LMHeadModel(tiny_gpt2())
    critic = value_model_from_reward(GPT2ForSequenceClassification(tiny_gpt2(num_labels=1))) if separate else None
    model = PolicyAndValue(policy, critic)
    optimizer = build_ppo_optimizer(model, PPOConfig(lr=1e-5, value_lr=1e-3, weight_decay=0.1))
    lr_of = {id(p): group["lr"] for group in optimizer.param_groups for p in group["params"]}
    decay_of = {id(p): group["weight_decay"] for group in optimizer.param_groups for p in group["params"]}
    critic_params = list((critic if separate else model.value_head).parameters())
    assert len(lr_of) == len(list(model.parameters()))  # every parameter exactly once
    assert all(lr_of[id(p)] == 1e-3 for p in critic_params)
    assert all(lr_of[id(p)] == 1e-5 for p in policy.parameters())
    assert all(decay_of[id(p)] == (0.1 if p.ndim >= 2 else 0.0) for p in model.parameters())
    same = build_ppo_optimizer(model, PPOConfig(lr=1e-5))  # value_lr None: one learning rate
    assert {group["lr"] for group in same.param_groups} == {1e-5}


def test_response_and_gold_metrics_by_hand():
    metrics = response_metrics(
        torch.tensor([2, 4]), torch.tensor([True, False]), torch.tensor([1.0, 3.0]), generate_s=2.0
    )
    assert list(metrics) == [
        "responses/length_mean",
        "responses/eos_rate",
        "responses/unfinished",
        "responses/length_score_corr",
        "time/tokens_per_s",
    ]
    close(
        [metrics[key] for key in metrics], [3.0, 0.5, 1.0, 1.0, 6 / 2]
    )  # 6 tokens in 2 s; length and score rise together
    prompt = "\n\nHuman: What is 3 plus 4?\n\nAssistant:"
    gold = gold_metrics([prompt, prompt, prompt], [" 3 plus 4 is 7.", " 3 plus 4 is 9.", " 3 plus 4 is 7."])
    close([gold["gold/score_mean"], gold["gold/good_rate"]], [2 / 3, 2 / 3])  # scores 1, 0, 1


def test_loop_costs_by_hand():
    model = torch.nn.Linear(4, 4, bias=False)  # 16 float32 weights: 64 bytes
    costs = loop_costs(2.0, 4, torch.device("cpu"), [model], [])
    close(costs["time_per_sample_ms"], 500.0)
    close(costs["state_memory_mb"], 64 / 2**20)
    assert costs["peak_memory_source"] == "cpu_max_rss" and costs["peak_memory_mb"] > 0
    assert (
        loop_costs(2.0, 0, torch.device("cpu"), [model], [])["time_per_sample_ms"] is None
    )  # resumed at the end: none trained


def test_frozen_digests_skip_roles_not_loaded_and_a_changed_role_fails():
    reward = torch.nn.Linear(2, 1).requires_grad_(False)  # frozen, as `frozen()` leaves every role
    roles = {"reward": reward, "reference": None}
    before = frozen_digests(roles)
    assert before == {"reward": weights_digest(reward)}
    check_frozen("grpo", roles, before)
    with torch.no_grad():
        reward.bias.add_(1.0)
    with pytest.raises(RuntimeError, match="grpo: a frozen role changed during training"):
        check_frozen("grpo", roles, before)


def test_eval_metrics_and_final_line_by_hand():
    results = {
        "reward_mean": 0.25,
        "sft_reward_mean": -0.5,
        "kl_to_ref": 1.234,
        "eval_prompts": 8,
        "frozen_roles_unchanged": True,
        "time_per_sample_ms": None,
        "gold_win_rate_ci95": [0.4, 0.6],
        "value_model": "separate",
    }
    assert eval_metrics("ppo", results) == {
        "ppo/eval/reward_mean": 0.25,
        "ppo/eval/sft_reward_mean": -0.5,
        "ppo/eval/kl_to_ref": 1.234,
        "ppo/eval/eval_prompts": 8,
    }
    assert final_line("ppo", results) == "[ppo] RM score +0.250 (SFT -0.500), KL to ref 1.23 nats"
    results.update(gold_score_mean=0.5, sft_gold_score_mean=0.375, gold_win_rate_vs_sft=0.75)
    assert final_line("grpo", results) == (
        "[grpo] RM score +0.250 (SFT -0.500), KL to ref 1.23 nats; gold 0.500 (SFT 0.375), gold win rate vs SFT 0.750"
    )
    # a sampled KL below 0 printed bare ("KL to ref -0.01 nats") read as a bug; the console now says what it is
    assert final_line("ppo", {**results, "kl_to_ref": -0.012}).startswith(
        "[ppo] RM score +0.250 (SFT -0.500), KL to ref -0.01 nats (a sampled estimate: below 0 means no measurable "
        "move from SFT); gold"
    )


def test_no_held_out_prompts_skip_every_evaluation(tmp_path):
    """`<stage>.eval_prompts=0` skips the held-out evaluations: no model is touched (None here), no
    results but the count, and the last line says so."""
    from rlhf.online.prompts import RLPrompts

    prompts = RLPrompts(["\n\nHuman: What is 3 plus 4?\n\nAssistant:"], [], [[5, 6, 7]], [])
    no_models = HeldOut(None, None, None, prompts, None, 0, 8, None, True)  # no engine either
    assert no_models.against_sft(None, None) == ({"eval_prompts": 0}, [])
    assert no_models.metrics("raft", None, None) == {}
    assert final_line("raft", {"eval_prompts": 0, "rounds": 4}) == "[raft] no held-out evaluation (raft.eval_prompts=0)"
    with pytest.raises(UserError, match=r"^ppo.eval_prompts=-1 must be >= 0 \(0: no held-out evaluation\)$"):
        load_rl_prompts("ppo", RunDir(tmp_path), load_config(preset_path("tiny")), None, -1)


# ---------------------------------------------------------------- held-out evaluation along training


def test_eval_due_at_zero_and_every_k_but_not_at_the_end():
    assert [i for i in range(9) if eval_due(i, 3, iterations=8)] == [0, 3, 6]  # 8: the final evaluation
    assert [i for i in range(9) if eval_due(i, 4, iterations=8)] == [0, 4]
    assert not any(eval_due(i, 0, iterations=8) for i in range(9))  # off


def test_summarize_samples_by_hand():
    prompts = ["\n\nHuman: What is 3 plus 4?\n\nAssistant:", "\n\nHuman: What is 2 plus 2?\n\nAssistant:"]
    samples = {
        "responses": [" 3 plus 4 is 7.", " 2 plus 2 is 5."],
        "rewards": [1.0, -0.5],
        "lengths": [8, 6],
        "finished": [True, False],
        "kl": [0.5, 1.5],
    }
    assert summarize_samples(prompts, dict(samples), gold=False) == {
        "reward_mean": 0.25,
        "kl_to_ref": 1.0,
        "length_mean": 7.0,
        "eos_rate": 0.5,
    }
    summary = summarize_samples(prompts, samples, gold=True)
    gold = [task.gold_score(p, r) for p, r in zip(prompts, samples["responses"])]
    assert samples["gold"] == gold and gold[0] == 1.0 and gold[1] < 1.0  # right; wrong
    close(summary["gold_score_mean"], (gold[0] + gold[1]) / 2)
    close(summary["gold_good_rate"], 0.5)


def test_held_out_eval_measures_kl_to_sft_and_leaves_the_training_rng_alone():
    from rlhf.models.modeling import train_tokenizer
    from rlhf.online.prompts import RLPrompts
    from rlhf.rollout.batch import SamplingConfig
    from rlhf.rollout.engines import HFEngine

    texts = [
        "\n\nHuman: What is 3 plus 4?\n\nAssistant: 3 plus 4 is 7.",
        "\n\nHuman: What is 2 plus 2?\n\nAssistant: 2 plus 2 is 4.",
    ]
    tokenizer = train_tokenizer(texts * 10, vocab_size=300)

    def config(**kwargs):
        return GPT2Config(
            vocab_size=len(tokenizer),
            n_positions=64,
            n_embd=16,
            n_layer=1,
            n_head=2,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=tokenizer.eos_token_id,
            **kwargs,
        )

    torch.manual_seed(0)
    sft, reward = GPT2LMHeadModel(config()).eval(), GPT2ForSequenceClassification(config(num_labels=1)).eval()
    policy = GPT2LMHeadModel(config()).eval()
    policy.load_state_dict(sft.state_dict())
    eval_texts = ["\n\nHuman: What is 3 plus 4?\n\nAssistant:", "\n\nHuman: What is 2 plus 2?\n\nAssistant:"]
    ids = tokenizer(eval_texts, add_special_tokens=False)["input_ids"]
    prompts = RLPrompts(eval_texts, eval_texts, ids, ids)
    accelerator = SimpleNamespace(
        device=torch.device("cpu"), process_index=0, num_processes=1, autocast=contextlib.nullcontext
    )
    sampling = SamplingConfig(max_new_tokens=6, temperature=0.7)

    engine = HFEngine(tokenizer, 8)

    def evaluate(model):
        return HeldOut(engine, reward, tokenizer, prompts, sampling, 3, 8, accelerator, gold=True).metrics(
            "grpo", model, sft
        )

    rng = torch.get_rng_state()
    at_start = evaluate(policy)
    assert torch.equal(torch.get_rng_state(), rng)  # training samples what it would have without the evaluation
    assert set(at_start) == {
        f"grpo/eval/{k}"
        for k in ("reward_mean", "kl_to_ref", "length_mean", "eos_rate", "gold_score_mean", "gold_good_rate")
    }
    assert at_start["grpo/eval/kl_to_ref"] == 0.0  # the policy is still the SFT policy
    with torch.no_grad():
        policy.lm_head.weight.mul_(2.0)  # (tied to the embeddings) a sharper, different policy
    moved = evaluate(policy)
    assert moved["grpo/eval/kl_to_ref"] != 0.0 and moved == evaluate(policy)  # same seed each time


def test_eval_kl_from_the_samplers_logits_is_the_forward_pass_kl_in_float32_only(monkeypatch):
    """sample_for_eval(sampler_logprobs=True): generate's own logits stand in for the policy's forward pass in float32
    (the KL within 1e-5 of the forward pass's, same samples); under autocast the policy is scored by a forward pass."""
    from rlhf.models.modeling import train_tokenizer
    from rlhf.rollout.batch import SamplingConfig
    from rlhf.rollout.engines import HFEngine
    from rlhf.rollout.evaluation import sample_for_eval

    texts = ["\n\nHuman: What is 3 plus 4?\n\nAssistant: 3 plus 4 is 7.", "\n\nHuman: Hi?\n\nAssistant: Hello."]
    tokenizer = train_tokenizer(texts * 10, vocab_size=300)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=64,
        n_embd=16,
        n_layer=1,
        n_head=2,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    reference, policy = GPT2LMHeadModel(config).eval(), GPT2LMHeadModel(config).eval()
    reward = GPT2ForSequenceClassification(GPT2Config(**{**config.to_dict(), "num_labels": 1})).eval()
    prompt_ids = tokenizer(["\n\nHuman: What is 3 plus 4?\n\nAssistant:", "\n\nHuman: Hi?"], add_special_tokens=False)[
        "input_ids"
    ]

    def kls(mixed_precision: str, sampler_logprobs: bool) -> dict:
        accelerator = SimpleNamespace(
            device=torch.device("cpu"),
            process_index=0,
            num_processes=1,
            autocast=contextlib.nullcontext,
            mixed_precision=mixed_precision,
        )
        sampling = SamplingConfig(max_new_tokens=12, temperature=0.7)
        return sample_for_eval(
            HFEngine(tokenizer, 8),
            policy,
            tokenizer,
            prompt_ids,
            sampling,
            3,
            8,
            reward,
            accelerator,
            reference=reference,
            sampler_logprobs=sampler_logprobs,
        )

    import rlhf.rollout.evaluation as held_out

    scored = []  # the models a forward pass scored
    forward_pass = held_out.rollout_logprobs
    monkeypatch.setattr(
        held_out, "rollout_logprobs", lambda model, *args: scored.append(model) or forward_pass(model, *args)
    )
    forward = kls("no", False)
    assert scored == [policy, reference]
    sampler = kls("no", True)
    assert scored[2:] == [reference]  # the policy's pass saved
    assert sampler["responses"] == forward["responses"] and min(forward["lengths"]) > 3
    assert all(abs(kl) > 1e-3 for kl in forward["kl"])  # two different policies
    assert sampler["kl"] == pytest.approx(forward["kl"], abs=1e-5)
    assert kls("bf16", True)["kl"] == forward["kl"] and scored[3:] == [policy, reference]  # autocast: forward passes


def test_grpo_warns_once_when_its_reward_is_flat_within_groups():
    """A custom reward constant in almost every group (zero_std_groups 0.875 to 1.0) trained on without a word."""
    shares = [1.0, 0.875, 1.0, 0.875, 1.0, 1.0, 1.0]  # mean 0.95 over the first 5 iterations
    warnings = [flat_reward_warning(shares[:i], "my_rewards:polite", 8) for i in range(1, 8)]
    assert warnings[4] == (
        "[grpo] warning: in the first 5 iterations, 95% of groups gave all 8 samples the same reward "
        "(grpo/objective/zero_std_groups), and such a group teaches nothing; make grpo.reward='my_rewards:polite' "
        "tell more of the responses apart, or raise grpo.group_size or grpo.temperature"
    )
    assert [w is not None for w in warnings] == [False, False, False, False, True, False, False]  # once
    assert flat_reward_warning([0.5] * 5, "model", 8) is None  # at the threshold: a reward that varies enough
    assert flat_reward_warning([0.0, 0.0, 0.1, 0.0, 0.05], "model", 4) is None


def test_every_held_out_check_decodes_as_the_test_does():
    """A setting chosen on validation is chosen at the decoding it is tested at: eval's temperature, top-p and
    response budget, not the stage's own (the RL stages train on 24-token samples in the tiny preset)."""
    cfg = load_config(preset_path("tiny"), ["eval.max_new_tokens=40", "eval.temperature=0.9", "eval.top_p=0.95"])
    assert eval_sampling(cfg) == SamplingConfig(40, temperature=0.9, top_p=0.95)
    tiny = load_config(preset_path("tiny"), [])
    assert tiny.grpo.max_new_tokens == 24 and eval_sampling(tiny).max_new_tokens == tiny.eval.max_new_tokens == 64
