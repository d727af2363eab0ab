"""RAFT, reward-ranked fine-tuning (Dong et al. 2023, arXiv 2304.06767): which samples a round keeps,
and the stage's derived sizes, checked at start-up (its config rules: rlhf.methods.rules). Pure: scores or a config in;
indices, sizes or a one-line UserError out. Tested by hand in tests/test_raft.py.

A round's samples are laid out prompt-major: rows p*N .. p*N + N - 1 of the round's batch are the N
samples of its prompt p, so `scores.view(P, N)` holds prompt p's scores in row p.

Metrics (keys `raft/<group>/<name>`, one row per round; the groups RAFT shares with PPO and GRPO,
responses/*, gold/*, reward/*, time/*, memory/* and eval/*, are defined in rlhf/online/__init__.py)
-------------------------------------------------------------------------------------------------
objective/scores            mean score of all the round's samples (`raft.reward`, after the missing-EOS penalty)
objective/tied_prompts      share of prompts whose N scores are all equal (mostly N identical responses):
                            ranking has nothing to choose from
selected/score_mean         mean score of the kept samples (never below objective/scores: a prompt's best
                            k are at least its mean)
selected/length_mean, selected/eos_rate   length (tokens, EOS included) and EOS rate of the kept samples
selected/gold_score_mean, selected/gold_good_rate   (embedded task) the gold judge on the kept samples
train/loss (= train/nll)    SFT loss on the kept samples: mean NLL per response token, mean over the round's steps
train/grad_norm, train/lr   gradient norm before clipping (mean over the round's steps), learning rate after it
train/episodes              responses sampled so far
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from rlhf.core.errors import UserError
from rlhf.models.training import StepPlan, plan_steps
from rlhf.stage.schema import RAFTConfig

# ----------------------------------------------------------------------------- selection


def select_top_k(scores: Tensor, k: int) -> Tensor:
    """Each prompt's k best samples, best first (Dong et al. 2023, Algorithm 1, step 2: k = 1 keeps
    the argmax). scores: (P, N) -> sample indices (P, k). Ties go to the earlier sample (a stable
    sort), so with k = 1 this is `torch.argmax`'s choice (`rlhf.analysis.evaluation.best_of_n_choice`)."""
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :k]


def kept_rows(scores: Tensor, k: int) -> Tensor:
    """The rows of a round's prompt-major batch that `select_top_k` keeps, prompt by prompt and best
    first within a prompt: scores (P, N) -> row indices (P * k,) into the (P * N,) batch."""
    n_prompts, n_samples = scores.shape
    first_rows = n_samples * torch.arange(n_prompts, device=scores.device)  # (P,) row of each prompt's sample 0
    return (first_rows[:, None] + select_top_k(scores, k)).flatten()  # (P * k,)


def tied_prompts(scores: Tensor) -> Tensor:
    """(P, N) -> (P,) bool, True where all N scores of a prompt are equal: ranking them carries no
    signal, and the prompt keeps its first k samples."""
    return scores.amax(dim=-1) == scores.amin(dim=-1)


# ----------------------------------------------------------------------------- sizes


@dataclass(frozen=True)
class RAFTPlan:
    finetune: StepPlan  # one round's fine-tuning on its kept responses: steps per epoch and in all, per-process batch
    # epochs each round's fine-tuning starts (the last may be cut short by fractional epochs or max_steps);
    # round r's epoch e is numbered r * epochs_per_round + e, so every (round, epoch) gets its own data order
    epochs_per_round: int
    optimizer_steps: int  # over the stage, for the scheduler: rounds x finetune.total_steps


def plan_raft(rcfg: RAFTConfig, world_size: int, n_prompts: int | None) -> RAFTPlan:
    """Derived sizes, with one-line errors naming the keys to change (`n_prompts` None: the checks that
    need no data, as `rlhf.methods.plan.plan_rl`). Each process samples and ranks its prompts_per_round /
    world_size prompts; every process then fine-tunes on the kept responses of all, an optimizer step
    taking batch_size of them, each process its slice (`rlhf.models.training.plan_steps` rules)."""
    if rcfg.prompts_per_round % world_size:
        raise UserError(
            f"raft.prompts_per_round={rcfg.prompts_per_round} is not divisible by {world_size} processes; "
            f"make it a multiple of {world_size}"
        )
    if n_prompts is not None and n_prompts < rcfg.prompts_per_round:
        raise UserError(
            f"raft: {n_prompts} training prompts are fewer than raft.prompts_per_round={rcfg.prompts_per_round}; "
            "lower raft.prompts_per_round"
        )
    finetune = plan_steps("raft", rcfg, rcfg.prompts_per_round * rcfg.top_k, world_size)
    return RAFTPlan(
        finetune,
        epochs_per_round=math.ceil(finetune.total_steps / finetune.steps_per_epoch),
        optimizer_steps=rcfg.rounds * finetune.total_steps,
    )
