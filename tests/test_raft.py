"""RAFT's pure parts (rlhf/methods/raft.py): which samples a round keeps, worked out by hand, and the config
rules and derived sizes, whose errors are one line naming the keys to change."""

import pytest
import torch

from rlhf.analysis.evaluation import best_of_n_choice
from rlhf.core.errors import UserError
from rlhf.methods.raft import kept_rows, plan_raft, select_top_k, tied_prompts
from rlhf.methods.rules import check_raft_config
from rlhf.stage.config import load_config, preset_path
from rlhf.stage.schema import RAFTConfig

# Two prompts, N = 4 samples each. Prompt 0 ties at 0.7 (samples 1 and 3); prompt 1 has no tie.
SCORES = torch.tensor([[0.1, 0.7, 0.3, 0.7], [2.0, -1.0, 0.5, 1.0]])


@pytest.mark.parametrize(
    "k, expected",
    [
        (1, [[1], [0]]),  # the tie goes to the earlier sample
        (2, [[1, 3], [0, 3]]),  # both tied samples, the earlier first
        (3, [[1, 3, 2], [0, 3, 2]]),
    ],
)
def test_select_top_k_by_hand(k, expected):
    assert select_top_k(SCORES, k).tolist() == expected


def test_select_best_is_argmax_including_its_ties():
    scores = torch.randint(0, 3, (64, 8)).float()  # many ties
    assert torch.equal(select_top_k(scores, 1)[:, 0], best_of_n_choice(scores, 8))


def test_kept_rows_index_the_prompt_major_batch():
    # prompt 0's samples are rows 0-3, prompt 1's rows 4-7: top 2 are samples (1, 3) and (0, 3)
    assert kept_rows(SCORES, 2).tolist() == [1, 3, 4, 7]
    flat = SCORES.flatten()
    assert flat[kept_rows(SCORES, 1)].tolist() == pytest.approx([0.7, 2.0])  # each prompt's best score


def test_tied_prompts_by_hand():
    assert tied_prompts(torch.tensor([[0.5, 0.5, 0.5], [0.5, 0.6, 0.5]])).tolist() == [True, False]


def test_plan_raft_derived_sizes():
    rcfg = RAFTConfig(rounds=4, prompts_per_round=128, top_k=2, batch_size=64, micro_batch_size=16, epochs=1.5)
    plan = plan_raft(rcfg, world_size=2, n_prompts=500)
    # 128 x 2 = 256 kept per round; 256 // 64 = 4 steps per epoch; ceil(1.5 x 4) = 6 steps per round, over 2 epochs;
    # 64 / 2 processes = 32 per process = 2 micro-batches of 16; 4 rounds x 6 = 24 optimizer steps
    finetune = plan.finetune
    assert (finetune.steps_per_epoch, finetune.total_steps, finetune.per_process, finetune.accumulation) == (
        4,
        6,
        32,
        2,
    )
    assert (plan.epochs_per_round, plan.optimizer_steps) == (2, 24)
    assert plan_raft(RAFTConfig(prompts_per_round=128, batch_size=64, max_steps=1), 1, 500).optimizer_steps == 10


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"top_k": 4, "samples_per_prompt": 4}, "raft.top_k=4 must be less than raft.samples_per_prompt=4"),
        ({"temperature": 0.0}, "raft.temperature=0.0 must be > 0"),
        ({"rounds": 0}, "raft.rounds=0 must be at least 1"),
        ({"samples_per_prompt": 0}, "raft.samples_per_prompt=0 must be at least 1"),
        ({"eval_every": -1}, "raft.eval_every=-1 must be >= 0"),
        ({"reward": "model + gold"}, "raft.reward: unknown reward source 'gold'"),
    ],
)
def test_config_errors_are_one_line(changes, message):
    with pytest.raises(UserError) as info:
        check_raft_config(RAFTConfig(**changes))
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "changes, world, message",
    [
        ({"prompts_per_round": 100}, 3, "raft.prompts_per_round=100 is not divisible by 3 processes"),
        ({"prompts_per_round": 600}, 1, "raft: 500 training prompts are fewer than raft.prompts_per_round=600"),
        ({"prompts_per_round": 32, "batch_size": 64}, 1, "fewer than one batch (raft.batch_size=64)"),
        (
            {"batch_size": 64, "micro_batch_size": 24},
            1,
            "raft: a batch of 64 per process (raft.batch_size=64 / 1) is not divisible by raft.micro_batch_size=24",
        ),
        ({"epochs": 0.0}, 1, "raft: no optimizer steps to take; raise raft.epochs"),
    ],
)
def test_size_errors_are_one_line(changes, world, message):
    with pytest.raises(UserError) as info:
        plan_raft(RAFTConfig(**changes), world, n_prompts=500)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("preset", ["tiny", "gpt2-hh"])
def test_the_presets_raft_sections_pass_their_own_rules(preset):
    rcfg = load_config(preset_path(preset)).raft
    check_raft_config(rcfg)
    plan_raft(rcfg, world_size=1, n_prompts=2000)
