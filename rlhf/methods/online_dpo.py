"""Online DPO (part3_dpo/train_online_dpo.py): the iteration plan and how a prompt's samples
become a preference pair. Pure functions, tested by hand in tests/test_online_dpo.py.

Metric keys (logged as online_dpo/<key>; responses/*, gold/*, reward/*, time/*, memory/* and eval/* are
defined in rlhf/online/__init__.py):
objective/scores              mean judge score of every sampled response (judge=reward; EOS penalty included)
pairs/kept_rate               share of the iteration's prompts that gave a pair (the others: equal scores,
                              identical samples, or an annotator tie / failure)
pairs/score_margin            mean chosen - rejected judge score over the kept pairs (judge=reward)
pairs/chosen_length_mean, pairs/rejected_length_mean   response tokens of the pair's two sides
train/loss, train/rewards/*, train/logps/*   the DPO loss's own statistics (rlhf.core.losses), on the kept pairs
train/grad_norm, train/lr                    as every stage
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlhf.core.errors import UserError
from rlhf.stage.schema import OnlineDPOConfig


@dataclass(frozen=True)
class OnlineDPOPlan:
    iterations: int  # sample -> judge -> DPO step cycles
    prompts_per_iteration: int  # all processes
    local_prompts: int  # this process's prompts per iteration
    optimizer_steps: int  # over the stage, for the scheduler: iterations x epochs


def plan_online_dpo(ocfg: OnlineDPOConfig, world_size: int, n_prompts: int | None) -> OnlineDPOPlan:
    """Derived sizes with one-line errors: batch_size responses = batch_size / K prompts per iteration,
    split evenly over the processes (`n_prompts` None: the checks that need no data, as `plan_rl`)."""
    K = ocfg.samples_per_prompt
    if ocfg.batch_size % K:
        raise UserError(
            f"online_dpo.batch_size={ocfg.batch_size} must be a multiple of online_dpo.samples_per_prompt={K} "
            "(whole prompts per iteration)"
        )
    prompts = ocfg.batch_size // K
    if prompts % world_size:
        raise UserError(
            f"online_dpo.batch_size={ocfg.batch_size} gives {prompts} prompts per iteration, not divisible by "
            f"{world_size} processes; set online_dpo.batch_size to a multiple of {K * world_size}"
        )
    iterations = ocfg.total_episodes // ocfg.batch_size
    if iterations < 1:
        raise UserError(
            f"online_dpo.total_episodes={ocfg.total_episodes} is less than one batch "
            f"(online_dpo.batch_size={ocfg.batch_size})"
        )
    if n_prompts is not None and n_prompts < prompts:
        raise UserError(
            f"online_dpo: {n_prompts} training prompts are fewer than the {prompts} needed per iteration; "
            "lower online_dpo.batch_size"
        )
    return OnlineDPOPlan(iterations, prompts, prompts // world_size, iterations * ocfg.epochs)


def best_worst_pairs(scores: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Each prompt's pair from its K scored samples: the highest-scoring as chosen, the lowest as rejected
    (with K = 2, simply the better and the worse; with K > 2 the extremes, as Xiong et al. 2024's iterative
    DPO and Dong et al. 2024's "RLHF workflow" pair best-of-K with worst-of-K). Ties go to the earlier sample.

    scores: (P, K) -> chosen, rejected: (P,) sample indices in 0..K-1; has_pair: (P,) bool, False where all
    K scores are equal (no preference to learn from).
    """
    chosen = scores.argmax(dim=-1)  # (P,) first maximum
    rejected = scores.argmin(dim=-1)  # (P,) first minimum
    has_pair = scores.amax(dim=-1) > scores.amin(dim=-1)  # (P,)
    return chosen, rejected, has_pair


def split_micro_batches(n: int, micro_batch_size: int) -> list[range]:
    """0..n-1 in ceil(n / micro_batch_size) consecutive chunks of near-equal size (sizes differ by at most
    one), so that averaging the chunks' mean losses weighs every pair almost equally."""
    if n == 0:
        return []
    chunks = -(-n // micro_batch_size)
    base, extra = divmod(n, chunks)
    bounds, start = [], 0
    for c in range(chunks):
        size = base + (c < extra)
        bounds.append(range(start, start + size))
        start += size
    return bounds


def pair_indices_to_rows(chosen: Tensor, rejected: Tensor, has_pair: Tensor, K: int) -> tuple[list[int], list[int]]:
    """Rows of the prompt-major rollout batch (prompt p's samples in rows p*K .. p*K + K-1) of each kept pair's
    chosen and rejected sample: (P,) x 3 -> two lists of len(kept)."""
    prompts = torch.nonzero(has_pair).flatten()  # (kept,)
    return (prompts * K + chosen[prompts]).tolist(), (prompts * K + rejected[prompts]).tolist()
