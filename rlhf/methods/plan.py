"""Batch-size rules of the RL stages (PPO, GRPO); their config rules are in `rlhf.methods.rules`."""

from __future__ import annotations

from dataclasses import dataclass

from rlhf.core.errors import UserError
from rlhf.models.training import micro_batch_size
from rlhf.stage.config import check_whole_groups, require_positive
from rlhf.stage.schema import GRPOConfig, RLConfig


@dataclass(frozen=True)
class RLPlan:
    iterations: int  # rollout batches over the stage
    prompts_per_iteration: int  # distinct prompts per iteration, all processes
    local_prompts: int  # distinct prompts per process per iteration
    local_batch: int  # rollouts per process per iteration (local_prompts x group_size)
    minibatch_size: int  # rollouts per process per optimizer step
    micro_batch_size: int  # rollouts per forward/backward pass (`rlhf.models.training.micro_batch_size`)
    accumulation: int  # micro-batches per optimizer step
    optimizer_steps: int  # over the stage, for the scheduler: iterations x epochs x num_minibatches


def plan_rl(stage: str, rcfg: RLConfig, world_size: int, n_prompts: int | None, group_size: int = 1) -> RLPlan:
    """Derived sizes, checked at start-up with one-line errors naming the keys to change; `n_prompts`
    None (the pipeline's check, before the data stage has run) leaves out the check that needs the data."""
    positive = [
        "batch_size",
        "micro_batch_size",
        "forward_batch_size",
        "num_minibatches",
        "epochs",
        "max_new_tokens",
        "total_episodes",
    ]
    require_positive(rcfg, positive, stage)
    if rcfg.temperature <= 0:
        raise UserError(
            f"{stage}.temperature={rcfg.temperature} must be > 0: "
            "RL needs the log-probs of a sampling distribution (greedy has none)"
        )
    if rcfg.clip <= 0 or (rcfg.clip_high is not None and rcfg.clip_high <= 0):
        raise UserError(f"{stage}.clip and {stage}.clip_high must be > 0")
    check_whole_groups(stage, rcfg.batch_size, group_size)
    prompts = rcfg.batch_size // group_size
    if prompts % world_size:
        raise UserError(
            f"{stage}.batch_size={rcfg.batch_size} gives {prompts} prompts per iteration, "
            f"not divisible by {world_size} processes; set {stage}.batch_size to a multiple of "
            f"{group_size * world_size}, or change the number of processes"
        )
    local_prompts = prompts // world_size
    local_batch = local_prompts * group_size
    if local_batch % rcfg.num_minibatches:
        raise UserError(
            f"{stage}.batch_size={rcfg.batch_size} gives {local_batch} rollouts per process, not divisible by "
            f"{stage}.num_minibatches={rcfg.num_minibatches}"
        )
    minibatch = local_batch // rcfg.num_minibatches
    share = f"a minibatch of {minibatch} rollouts per process (batch_size / processes / num_minibatches)"
    micro = micro_batch_size(stage, rcfg.micro_batch_size, minibatch, share)
    iterations = rcfg.total_episodes // rcfg.batch_size
    if iterations < 1:
        raise UserError(
            f"{stage}.total_episodes={rcfg.total_episodes} is less than one batch "
            f"({stage}.batch_size={rcfg.batch_size})"
        )
    if n_prompts is not None and n_prompts < prompts:
        raise UserError(
            f"{stage}: {n_prompts} training prompts are fewer than the {prompts} needed per iteration; "
            f"lower {stage}.batch_size"
        )
    return RLPlan(
        iterations,
        prompts,
        local_prompts,
        local_batch,
        minibatch,
        micro,
        minibatch // micro,
        iterations * rcfg.epochs * rcfg.num_minibatches,
    )


def check_group_packing(plan: RLPlan, gcfg: GRPOConfig) -> None:
    """grpo.pack_groups packs whole groups: each process's minibatch and micro-batch must hold whole ones."""
    if gcfg.pack_groups and (plan.micro_batch_size % gcfg.group_size or plan.minibatch_size % gcfg.group_size):
        raise UserError(
            f"grpo.pack_groups needs whole groups of grpo.group_size={gcfg.group_size} in each micro-batch "
            f"({plan.micro_batch_size} rollouts) and minibatch ({plan.minibatch_size} per process); change "
            "grpo.micro_batch_size or grpo.num_minibatches, or set grpo.pack_groups=false"
        )
