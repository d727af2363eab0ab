"""One call for an online stage's training samples, and what the sampling engine's log-probs say about them."""

from __future__ import annotations

import torch

from rlhf.core.ops import logprob_mismatch, truncated_importance_weights
from rlhf.online.prompts import RLPrompts, local_prompt_rows
from rlhf.rollout.batch import Rollout, SamplingConfig
from rlhf.rollout.generate import local_sampling_seeds


@torch.no_grad()
def sample_train_batch(
    engine,
    policy,
    prompts: RLPrompts,
    per_iteration: int,
    stream: int,
    seed: int,
    accelerator,
    sampling: SamplingConfig,
    group_size: int = 1,
) -> tuple[list[int], Rollout]:
    """This process's share of one iteration's samples: `per_iteration` training prompts drawn for `stream` (the
    iteration or round; `local_prompt_rows`), each repeated `group_size` times with a prompt's rows consecutive
    and on one process, sampled from `policy`'s current weights (unwrapped) through `engine`. Row i of the global
    batch samples from its own seed, so W processes draw what one would. -> (prompt index of each row, rollout)."""
    rank = accelerator.process_index
    local_rows = local_prompt_rows(
        len(prompts.train_ids), per_iteration, stream, seed, rank, accelerator.num_processes, group_size
    )
    engine.load(policy)
    rollout = engine.sample(
        [prompts.train_ids[i] for i in local_rows],
        sampling,
        local_sampling_seeds(seed, stream, rank, len(local_rows)),
    )
    return local_rows, rollout


def engine_mismatch_metrics(rollout: Rollout, trainer_logprobs: torch.Tensor) -> dict[str, torch.Tensor]:
    """`rollout/logprob_abs_diff`, `rollout/logprob_abs_diff_max` and `rollout/mismatch_kl` of the engine's
    log-probs against the trainer's (B, T) for the same rollout (`rlhf.core.ops.logprob_mismatch`); none for an engine
    that reports no log-probs of its own (hf samples from the trainer's model: the mismatch is 0 by construction)."""
    if rollout.generation_logprobs is None:
        return {}
    mismatch = logprob_mismatch(trainer_logprobs, rollout.generation_logprobs, rollout.response_mask)
    return {
        "rollout/logprob_abs_diff": mismatch["abs_diff"],
        "rollout/logprob_abs_diff_max": mismatch["abs_diff_max"],
        "rollout/mismatch_kl": mismatch["kl"],
    }


def importance_weights(chunk: Rollout, trainer_logprobs: torch.Tensor, cap: float | None) -> torch.Tensor | None:
    """Truncated importance weights (b, t) of a selection of rollouts (`Rollout.select`) for the policy-gradient
    term, when `rollout.tis_cap` is set and the engine reported its log-probs; otherwise None (no weighting).
    trainer_logprobs: (b, t)."""
    if cap is None or chunk.generation_logprobs is None:
        return None
    return truncated_importance_weights(trainer_logprobs, chunk.generation_logprobs, cap)
