"""Batch-size rules and start-up checks of the RL stages (PPO, GRPO; RAFT shares the config checks)."""

from __future__ import annotations

from dataclasses import dataclass

from rlhf.core.errors import UserError
from rlhf.core.losses import GRPO_NORMALIZERS
from rlhf.models.training import micro_batch_size
from rlhf.rollout.rewards import load_reward_source
from rlhf.stage.config import GRPOConfig, PPOConfig, RAFTConfig, RLConfig, require_positive


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


def check_whole_groups(stage: str, batch_size: int, group_size: int) -> None:
    """A rollout batch holds whole groups of `group_size` responses per prompt."""
    if batch_size % group_size:
        raise UserError(
            f"{stage}.batch_size={batch_size} must be divisible by {stage}.group_size={group_size} "
            f"(whole groups per batch); set {stage}.batch_size to a multiple of {group_size}"
        )


def check_rl_config(stage: str, rcfg: RLConfig | RAFTConfig) -> None:
    """Rules every online stage (PPO, GRPO, RAFT) shares: eval_every >= 0, and a reward spec that parses and imports."""
    if rcfg.eval_every < 0:
        raise UserError(f"{stage}.eval_every={rcfg.eval_every} must be >= 0 (0: only the final evaluation)")
    load_reward_source(stage, rcfg.reward)


def check_ppo_config(pcfg: PPOConfig) -> None:
    check_rl_config("ppo", pcfg)
    if pcfg.value_model not in ("separate", "shared"):
        raise UserError(f"ppo.value_model must be 'separate' or 'shared', got '{pcfg.value_model}'")
    if pcfg.kl_coef < 0:
        raise UserError(f"ppo.kl_coef={pcfg.kl_coef} must be >= 0")
    if pcfg.kl_target is not None and (pcfg.kl_target <= 0 or pcfg.kl_horizon < 1):
        raise UserError(
            f"ppo.kl_target={pcfg.kl_target} must be > 0 and ppo.kl_horizon={pcfg.kl_horizon} >= 1 "
            "(or kl_target=null for a fixed beta)"
        )
    if not 0 <= pcfg.gamma <= 1 or not 0 <= pcfg.lam <= 1:
        raise UserError(f"ppo.gamma={pcfg.gamma} and ppo.lam={pcfg.lam} must lie in [0, 1]")


def check_grpo_config(gcfg: GRPOConfig) -> None:
    check_rl_config("grpo", gcfg)
    if gcfg.group_size < 1 or (gcfg.scale_rewards and gcfg.group_size < 2):
        raise UserError(f"grpo.group_size={gcfg.group_size} must be at least 2 (a group needs a spread of rewards)")
    check_whole_groups("grpo", gcfg.batch_size, gcfg.group_size)
    if gcfg.loss_normalization not in GRPO_NORMALIZERS:
        raise UserError(
            f"grpo.loss_normalization must be one of {', '.join(sorted(GRPO_NORMALIZERS))}, "
            f"got '{gcfg.loss_normalization}'"
        )
    if gcfg.kl_coef < 0:
        raise UserError(f"grpo.kl_coef={gcfg.kl_coef} must be >= 0 (0: no KL term and no reference model)")


def check_group_packing(plan: RLPlan, gcfg: GRPOConfig) -> None:
    """grpo.pack_groups packs whole groups: each process's minibatch and micro-batch must hold whole ones."""
    if gcfg.pack_groups and (plan.micro_batch_size % gcfg.group_size or plan.minibatch_size % gcfg.group_size):
        raise UserError(
            f"grpo.pack_groups needs whole groups of grpo.group_size={gcfg.group_size} in each micro-batch "
            f"({plan.micro_batch_size} rollouts) and minibatch ({plan.minibatch_size} per process); change "
            "grpo.micro_batch_size or grpo.num_minibatches, or set grpo.pack_groups=false"
        )
