"""What the online RL stages (PPO, GRPO) share: prompts, batch-size rules, prompt order, checkpoints,
reward shaping, KL controllers, minibatching, response statistics, the final comparison with SFT
and the published outputs.

The math is pure (tensors in, tensors out) and tested in tests/test_rl.py; losses and advantage
estimators live in rlhf.losses and rlhf.ops. Shapes: B rollouts, T = P + R tokens (see
rlhf.rollout for the layout), per-token tensors aligned with the token they belong to.

Metrics (keys `<stage>/<group>/<name>`, stage `ppo` or `grpo`; one row per iteration)
-----------------------------------------------------------------------------------------
objective/scores            mean training score of the batch (`<stage>.reward`: the reward model, functions, or a
                            weighted sum; rlhf/rewards.py), after the missing-EOS penalty
reward/<term>               mean unweighted score of each term of `<stage>.reward` before the penalty: reward/model for
                            the reward model, reward/<function name> for a function
objective/kl                mean over rollouts of the sequence KL estimate sum_t (log pi - log pi_ref)
                            (k1, at the sampling temperature; 0 when GRPO runs without a reference)
objective/entropy           mean per-token entropy of the policy at the sampling temperature (training pass)
objective/non_score_reward  (PPO) mean over rollouts of sum_t -beta * k1_t
objective/rlhf_reward       (PPO) scores + non_score_reward: what PPO maximises
objective/kl_coef           (PPO) the beta used for this batch (changes with the adaptive controller)
objective/zero_std_groups   (GRPO) fraction of groups whose G rewards are all equal (no learning signal)
objective/advantage_std     (GRPO) std of the group advantages
policy/approxkl             0.5 mean (log pi_new - log pi_old)^2 over response tokens, mean over optimizer steps
policy/clipfrac             fraction of response tokens whose ratio was clipped
policy/ratio_mean           mean pi_new / pi_old
policy/kl_stopped           (PPO) 1 when kl_stop ended the iteration's epochs early
policy/k3_kl                (GRPO) mean k3 estimate of KL(pi_new || pi_ref) in the loss
val/loss, val/clipfrac      (PPO) clipped value loss and the fraction of clipped value predictions
val/explained_variance      (PPO) 1 - Var[R - V] / Var[R] of the rollout values against GAE returns
val/value_mean              (PPO) mean predicted value
responses/length_mean       mean response length in tokens (EOS included)
responses/eos_rate          fraction of responses that ended with EOS
responses/unfinished        responses that never produced EOS within max_new_tokens (all processes)
responses/length_score_corr Pearson correlation of length and score over the batch, all processes (length hacking
                            shows here)
gold/score_mean, gold/good_rate   (embedded task) the gold judge on the batch's responses: mean score and share
                                  rated good
train/loss, train/grad_norm, train/lr   total loss, gradient norm before clipping, learning rate
time/generate_s, time/score_s, time/train_s   wall seconds of the iteration's phases (score: all no-grad passes)
time/eval_s                 wall seconds of a held-out evaluation (its own rows; not in the loop's time_per_sample_ms)
time/tokens_per_s           generated response tokens per second of generation, all processes together
memory/peak_mb              peak memory so far: CUDA max allocated on GPU, max RSS of the process on CPU

Held-out evaluation (keys `<stage>/eval/<name>`): every `eval_every` iterations and once before
training (`held_out_eval`), and at the end (`evaluate_against_sft`, which adds the sft_* and
head-to-head keys). The same val prompts, sampling settings and seed every time, so the rows draw
reward against KL along training (Gao et al. 2022, arXiv 2210.10760).
eval/reward_mean            mean reward-model score of the policy's held-out samples (no EOS penalty)
eval/kl_to_ref              mean sequence KL sum_t (log pi - log pi_sft) over those samples (k1)
eval/length_mean, eval/eos_rate   their mean length in tokens (EOS included) and share ending in EOS
eval/gold_score_mean, eval/gold_good_rate   (embedded task) the gold judge on them
"""

from __future__ import annotations

import hashlib
import json
import math
import resource
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from rlhf import task
from rlhf.batching import encode_texts
from rlhf.checkpoint import checkpoint_fingerprint, load_training_state, save_pretrained_atomic, save_training_state
from rlhf.config import Config, GRPOConfig, PPOConfig, RAFTConfig, RLConfig, require_positive
from rlhf.data import read_jsonl, write_jsonl
from rlhf.errors import UserError
from rlhf.evaluation import sequence_kl
from rlhf.losses import GRPO_NORMALIZERS
from rlhf.models import context_length, stage_model_errors
from rlhf.ops import entropy_from_logits, gather_logprobs, kl_k1, last_true_index, upcast
from rlhf.plots import plot_training_curves
from rlhf.rewards import load_reward_source
from rlhf.rollout import SamplingConfig, generate_rollout, rollout_logprobs, sampling_seeds, score_rollout
from rlhf.run import RunDir, write_json_atomic
from rlhf.signals import defer_stops, stop_if_requested
from rlhf.tracking import MetricLogger
from rlhf.training import forward_map
from rlhf.winrates import win_rate_summary

# ----------------------------------------------------------------------------- batch-size rules


@dataclass(frozen=True)
class RLPlan:
    iterations: int  # rollout batches over the stage
    prompts_per_iteration: int  # distinct prompts per iteration, all processes
    local_prompts: int  # distinct prompts per process per iteration
    local_batch: int  # rollouts per process per iteration (local_prompts x group_size)
    minibatch_size: int  # rollouts per process per optimizer step
    accumulation: int  # micro-batches per optimizer step
    optimizer_steps: int  # over the stage, for the scheduler: iterations x epochs x num_minibatches


def plan_rl(stage: str, rcfg: RLConfig, world_size: int, n_prompts: int, group_size: int = 1) -> RLPlan:
    """Derived sizes, checked at start-up with one-line errors naming the keys to change."""
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
    if minibatch % rcfg.micro_batch_size:
        raise UserError(
            f"{stage}: a minibatch of {minibatch} rollouts per process (batch_size / processes / num_minibatches) "
            f"is not divisible by {stage}.micro_batch_size={rcfg.micro_batch_size}"
        )
    iterations = rcfg.total_episodes // rcfg.batch_size
    if iterations < 1:
        raise UserError(
            f"{stage}.total_episodes={rcfg.total_episodes} is less than one batch "
            f"({stage}.batch_size={rcfg.batch_size})"
        )
    if n_prompts < prompts:
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
        minibatch // rcfg.micro_batch_size,
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


def check_context(stage: str, longest_prompt: int, max_new_tokens: int, context: int | None) -> None:
    """The longest prompt plus the response budget must fit the model's positions."""
    if context is not None and longest_prompt + max_new_tokens > context:
        raise UserError(
            f"{stage}: the longest prompt ({longest_prompt} tokens) + {stage}.max_new_tokens={max_new_tokens} "
            f"exceeds the model's {context} positions; lower {stage}.max_new_tokens or data.max_prompt_tokens"
        )


def context_size(model_dir) -> int | None:
    """Positions the model can attend over, from its config.json (None when it has no limit)."""
    from transformers import AutoConfig

    with stage_model_errors(model_dir):
        config = AutoConfig.from_pretrained(str(model_dir))
    return context_length(config)


def unique_prompts(rows: list[dict]) -> list[str]:
    """The distinct prompts of preference rows, in first-seen order."""
    return list(dict.fromkeys(row["prompt"] for row in rows))


def check_gold_prompts(stage: str, prompts: list[str], source: str) -> None:
    """Every prompt must parse for the embedded task's gold judge; fail at start-up, not at the end."""
    for prompt in prompts:
        try:
            task.parse_prompt(prompt)
        except ValueError:
            raise UserError(
                f"{stage}: {source} holds a prompt the gold judge cannot parse ({prompt.strip()[:80]!r}); "
                f"it was written by another version of rlhf/task/: re-run the data stage with --force"
            ) from None


@dataclass(frozen=True)
class RLPrompts:
    """An RL stage's prompts, as text and as the token ids the policy is given."""

    train_texts: list[str]  # distinct prompts of data/train.jsonl, in first-seen order
    eval_texts: list[str]  # the first `eval_prompts` distinct prompts of data/val.jsonl
    train_ids: list[list[int]]  # token ids of each, cut to their last data.max_prompt_tokens
    eval_ids: list[list[int]]

    @property
    def longest(self) -> int:
        """Tokens in the longest prompt, training or held out."""
        return max(map(len, self.train_ids + self.eval_ids))


def load_rl_prompts(stage: str, run: RunDir, cfg: Config, tokenizer, n_eval: int) -> RLPrompts:
    """The data stage's training prompts and first `n_eval` validation prompts, tokenized and cut
    from the left to data.max_prompt_tokens (the end of a prompt is where the response starts).
    On the embedded task every one must parse for the gold judge."""
    train_texts = unique_prompts(read_jsonl(run.stage("data") / "train.jsonl"))
    eval_texts = unique_prompts(read_jsonl(run.stage("data") / "val.jsonl"))[:n_eval]
    train_ids = [ids[-cfg.data.max_prompt_tokens :] for ids in encode_texts(tokenizer, train_texts)]
    eval_ids = [ids[-cfg.data.max_prompt_tokens :] for ids in encode_texts(tokenizer, eval_texts)]
    if cfg.data.path == "embedded":
        check_gold_prompts(stage, train_texts, "data/train.jsonl")
        check_gold_prompts(stage, eval_texts, "data/val.jsonl")
    return RLPrompts(train_texts, eval_texts, train_ids, eval_ids)


def set_cpu_threads(stage: str, threads: int, device: torch.device) -> None:
    """Intra-op threads on CPU. Small ops (generation steps, a few-million-parameter model) are
    latency-bound: when other jobs share the cores, threads spin waiting for each other and one
    thread is several times faster than one per core."""
    if threads < 0:
        raise UserError(f"{stage}.cpu_threads={threads} must be >= 0 (0: torch's default)")
    if threads and device.type == "cpu":
        torch.set_num_threads(threads)


def frozen(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """A role that is never trained: no gradients, eval mode, on the device, and no KV cache built
    by plain forward passes (generate() still uses one)."""
    model.requires_grad_(False).eval().to(device)
    model.config.use_cache = False
    return model


def iteration_prompts(n_prompts: int, per_iteration: int, iteration: int, seed: int) -> list[int]:
    """Prompt indices for one iteration: consecutive slices of a per-epoch permutation that
    depends on (seed, epoch) alone, so a resumed run sees the prompts an uninterrupted one would."""
    per_epoch = n_prompts // per_iteration
    epoch, position = divmod(iteration, per_epoch)
    order = torch.randperm(n_prompts, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))
    return order[position * per_iteration : (position + 1) * per_iteration].tolist()


def local_prompt_rows(
    n_prompts: int, per_iteration: int, iteration: int, seed: int, rank: int, world_size: int, group_size: int = 1
) -> list[int]:
    """This process's prompt indices for one iteration: its contiguous slice of `iteration_prompts`
    (per_iteration // world_size prompts), each repeated group_size times, so consecutive rows form a group."""
    rows = iteration_prompts(n_prompts, per_iteration, iteration, seed)
    local = per_iteration // world_size
    return [i for i in rows[rank * local : (rank + 1) * local] for _ in range(group_size)]


# ----------------------------------------------------------------------------- checkpoints and logging


def load_rl_checkpoint(
    stage: str, run: RunDir, cfg: Config, accelerator, model: torch.nn.Module, optimizer, scheduler, iterations: int
) -> dict | None:
    """Restore the stage's last checkpoint (`save_rl_checkpoint`) into the unwrapped model, the
    optimizer, the scheduler and the RNG; -> its state ({"iteration": ..., ...}), or None when
    there is none. One written for another config is an error, not a silent restart."""
    # The fingerprint is read before any weights are: a checkpoint of another config may hold another architecture.
    if checkpoint_fingerprint(run.checkpoint_dir(stage)) not in (None, run.fingerprint(stage, cfg)):
        raise UserError(
            f"{run.checkpoint_dir(stage)} belongs to a different config; delete it or pass --force to start over"
        )
    state = load_training_state(run.checkpoint_dir(stage), accelerator.unwrap_model(model), optimizer, scheduler)
    if state is not None:
        accelerator.print(f"[{stage}] resumed from iteration {state['iteration']}/{iterations}")
    if accelerator.is_main_process:
        drop_samples_after(run.stage(stage) / "samples.jsonl", state["iteration"] if state else 0)
    defer_stops()  # the loop starts here: a signal now waits for the next checkpoint
    return state


def drop_samples_after(path: Path, iteration: int) -> None:
    """Keep only the samples.jsonl rows of iterations up to `iteration` (the checkpoint resumed
    from): an earlier attempt's later rows are sampled again, and would otherwise appear twice."""
    if not path.is_file():
        return
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # the last line, cut short by a crash mid-append
        if row["iteration"] <= iteration:
            rows.append(row)
    write_jsonl(path, rows)


def save_rl_checkpoint(
    stage: str,
    run: RunDir,
    cfg: Config,
    accelerator,
    model: torch.nn.Module,
    optimizer,
    scheduler,
    iteration: int,
    **extra,
) -> None:
    """Write the resumable checkpoint after `iteration` (plus the stage's `extra` state) from the
    main process, tagged with the config fingerprint; every process waits until it is written."""
    if accelerator.is_main_process:
        save_training_state(
            run.checkpoint_dir(stage),
            accelerator.unwrap_model(model),
            optimizer,
            scheduler,
            {"iteration": iteration, "fingerprint": run.fingerprint(stage, cfg), **extra},
        )
    accelerator.wait_for_everyone()
    stop_if_requested(run.checkpoint_dir(stage))


def open_rl_logger(stage: str, run: RunDir, cfg: Config, accelerator, iteration: int, iterations: int) -> MetricLogger:
    """The stage's metric logger (active on the main process), continuing after `iteration` (rows
    an earlier attempt logged after it are dropped), with a progress bar over all `iterations`."""
    logger = MetricLogger(stage, run.stage(stage), run.tensorboard_dir(stage), cfg, enabled=accelerator.is_main_process)
    logger.resume(iteration)
    logger.progress(iterations, initial=iteration, desc=stage)
    return logger


# ----------------------------------------------------------------------------- rewards


def apply_missing_eos_penalty(scores: Tensor, finished: Tensor, penalty: float) -> Tensor:
    """score - penalty for responses that never produced EOS (Huang et al. 2024, the EOS trick).

    scores: (B,) float; finished: (B,) bool -> (B,).
    """
    return torch.where(finished, upcast(scores), upcast(scores) - penalty)


def shape_rewards(
    scores: Tensor, logprobs: Tensor, ref_logprobs: Tensor, response_mask: Tensor, kl_coef: float
) -> tuple[Tensor, Tensor]:
    """Per-token PPO rewards (Ziegler et al. 2019; Huang et al. 2024):

        r_t = -beta * (log pi(y_t) - log pi_ref(y_t))  at every response token,
        plus the sequence score at the last response token (the EOS of a finished response).

    scores: (B,); logprobs, ref_logprobs: (B, T); response_mask: (B, T) bool
    -> (rewards (B, T), kl (B, T)), both 0 outside the response; kl is the k1 estimate.
    """
    kl = torch.where(response_mask, kl_k1(logprobs, ref_logprobs), 0.0)  # (B, T)
    rewards = -kl_coef * kl  # (B, T)
    last = last_true_index(response_mask)  # (B,)
    rewards[torch.arange(rewards.shape[0], device=rewards.device), last] += upcast(scores).to(rewards.dtype)
    return rewards, kl


class FixedKLController:
    """A constant beta (Huang et al. 2024: 0.05)."""

    def __init__(self, kl_coef: float):
        self.value = kl_coef

    def update(self, current_kl: float, n_episodes: int) -> None:
        """A fixed beta ignores the measured KL (Huang et al. 2024 keep beta = 0.05 throughout)."""


class AdaptiveKLController:
    """Ziegler et al. 2019 (arXiv 1909.08593, section 2.2), the controller of lm-human-preferences:

        e = clip(KL / target - 1, -0.2, 0.2),    beta <- beta * (1 + e * n / horizon)

    KL: the batch's mean sequence KL in nats; n: episodes in the batch.
    """

    def __init__(self, kl_coef: float, target: float, horizon: int):
        self.value, self.target, self.horizon = kl_coef, target, horizon

    def update(self, current_kl: float, n_episodes: int) -> None:
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_episodes / self.horizon


def make_kl_controller(pcfg: PPOConfig) -> FixedKLController | AdaptiveKLController:
    if pcfg.kl_target is None:
        return FixedKLController(pcfg.kl_coef)
    return AdaptiveKLController(pcfg.kl_coef, pcfg.kl_target, pcfg.kl_horizon)


# ----------------------------------------------------------------------------- training passes


def shifted_logprobs(logits: Tensor, input_ids: Tensor, temperature: float) -> Tensor:
    """Log-prob of each token under the distribution that produced it, at the sampling temperature.

    logits: (B, T, V) from a forward pass over input_ids (B, T) -> (B, T), aligned with the tokens:
    column t uses the logits at t - 1; column 0 is 0. The same as `rlhf.models.token_logprobs`.
    """
    return torch.nn.functional.pad(gather_logprobs(logits[:, :-1] / temperature, input_ids[:, 1:]), (1, 0))


def shifted_entropy(logits: Tensor, temperature: float) -> Tensor:
    """Entropy of the next-token distribution that produced each token, at the temperature;
    (B, T, V) -> (B, T), column 0 is 0."""
    return torch.nn.functional.pad(entropy_from_logits(logits[:, :-1] / temperature), (1, 0))


def align_values(position_values: Tensor) -> Tensor:
    """Value of the state in which each token was chosen: column t gets the value head's output at
    position t - 1 (Huang et al. 2024 read values at context_length - 1 : -1). (B, T) -> (B, T)."""
    return torch.nn.functional.pad(position_values[:, :-1], (1, 0))


def minibatch_indices(n: int, num_minibatches: int, generator: torch.Generator) -> list[Tensor]:
    """A fresh random split of n rollouts into num_minibatches equal parts (one epoch)."""
    order = torch.randperm(n, generator=generator)
    size = n // num_minibatches
    return [order[k * size : (k + 1) * size] for k in range(num_minibatches)]


def loss_units(response_mask: Tensor, normalization: str) -> Tensor:
    """(n,) what each row weighs in a loss normalised by `normalization`: its response tokens
    ("token") or 1 ("sequence"). response_mask: (n, T) bool."""
    if normalization == "token":
        return response_mask.sum(-1).float()
    if normalization == "sequence":
        return torch.ones(response_mask.shape[0], device=response_mask.device)
    raise ValueError(f"normalization must be 'token' or 'sequence', got {normalization!r}")


def accumulation_weights(
    response_mask: Tensor, micro_batch_size: int, normalization: str, units_per_process: float | None = None
) -> list[float]:
    """Weights for the losses of consecutive micro-batches of one minibatch so that their weighted
    sum equals the loss of the whole minibatch at once.

    "token": a loss averaged over a micro-batch's response tokens weighs its share of the minibatch's
    tokens; "sequence": a loss averaged over rows weighs its share of the rows.
    response_mask: (n, T) bool for the minibatch -> one weight per micro-batch, summing to 1.

    Across W processes DDP averages the gradients, so each process's weights must sum to its share
    of the minibatch's units over all processes, times W: pass `units_per_process`, the
    `loss_units` of the whole minibatch summed over processes and divided by W (default: this
    process's own, for one process). Process r's weights then sum to units_r / units_per_process.
    """
    units = loss_units(response_mask, normalization)
    sizes = [float(units[start : start + micro_batch_size].sum()) for start in range(0, len(units), micro_batch_size)]
    total = sum(sizes) if units_per_process is None else units_per_process
    return [size / total if total else 1.0 / len(sizes) for size in sizes]


def mean_process_units(accelerator, response_mask: Tensor, normalization: str) -> float:
    """The `loss_units` of a minibatch whose rows `response_mask` (n, T) holds on this process,
    summed over processes and divided by their number (`accumulation_weights`)."""
    return accelerator.reduce(loss_units(response_mask, normalization).sum(), reduction="mean").item()


def micro_batches(
    minibatch: Tensor,
    lengths: Tensor,
    response_mask: Tensor,
    micro_batch_size: int,
    normalization: str,
    units_per_process: float | None = None,
) -> list[tuple[Tensor, int, float]]:
    """Split one minibatch of rollout rows into micro-batches for gradient accumulation.

    minibatch: (n,) row indices; lengths: (B,) tokens per row; response_mask: (B, T) bool.
    Rows are sorted by length (stably), so similar lengths share a micro-batch. -> one
    (rows, t, weight) per micro-batch: its row indices, the columns it needs (past its longest
    row, all is padding) and its `accumulation_weights` weight (`units_per_process` as there).
    """
    minibatch = minibatch[torch.argsort(lengths[minibatch], stable=True)]
    weights = accumulation_weights(response_mask[minibatch], micro_batch_size, normalization, units_per_process)
    chunks = [minibatch[k * micro_batch_size : (k + 1) * micro_batch_size] for k in range(len(weights))]
    return [(rows, int(lengths[rows].max()), weight) for rows, weight in zip(chunks, weights)]


def build_ppo_optimizer(model: torch.nn.Module, pcfg: PPOConfig) -> torch.optim.Optimizer:
    """AdamW over a PolicyAndValue module: weight decay on matrices only; the critic's own
    parameters (the separate value model, or the shared value head) at `value_lr` when set."""
    critic_ids = {
        id(p) for part in (model.value_model, model.value_head) if part is not None for p in part.parameters()
    }
    groups = []
    for is_critic in (False, True):
        params = [p for p in model.parameters() if p.requires_grad and (id(p) in critic_ids) == is_critic]
        lr = pcfg.value_lr if is_critic and pcfg.value_lr is not None else pcfg.lr
        groups += [
            {"params": [p for p in params if p.ndim >= 2], "weight_decay": pcfg.weight_decay, "lr": lr},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0, "lr": lr},
        ]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=pcfg.lr, eps=pcfg.adam_eps)


# ----------------------------------------------------------------------------- statistics


def pearson(x: Tensor, y: Tensor) -> float:
    """Pearson correlation of two (B,) tensors; 0 when either is constant."""
    x, y = upcast(x.double()), upcast(y.double())
    x, y = x - x.mean(), y - y.mean()
    denominator = (x.square().sum() * y.square().sum()).sqrt()
    return float((x * y).sum() / denominator) if denominator > 0 else 0.0


def response_metrics(
    response_lengths: Tensor, finished: Tensor, scores: Tensor, generate_s: float
) -> dict[str, Tensor]:
    """The responses/* metrics of a batch and time/tokens_per_s (glossary above).

    response_lengths: (B,) tokens, EOS included; finished: (B,) bool; scores: (B,); generate_s:
    wall seconds the batch took to generate.
    """
    lengths = response_lengths.float()
    return {
        "responses/length_mean": lengths.mean(),
        "responses/eos_rate": finished.float().mean(),
        "responses/unfinished": (~finished).float().sum(),
        "responses/length_score_corr": torch.tensor(pearson(lengths, scores)),
        "time/tokens_per_s": lengths.sum() / max(generate_s, 1e-9),
    }


def gold_metrics(prompts: list[str], responses: list[str]) -> dict[str, Tensor]:
    """The gold/* metrics of a batch on the embedded task: mean gold score and the share rated good
    (`task.is_good_score`)."""
    gold = torch.tensor(gold_scores(prompts, responses))
    return {"gold/score_mean": gold.mean(), "gold/good_rate": (gold >= task.GOOD_SCORE - 1e-9).float().mean()}


def head_to_head(policy_scores: list[float], baseline_scores: list[float]) -> dict:
    """Per-prompt comparison by score: win when higher, tie when equal. win_rate = (wins + ties/2) / n
    with a 95% Wilson interval (rlhf.winrates.win_rate_summary)."""
    outcomes = ["A" if a > b else "B" if a < b else "tie" for a, b in zip(policy_scores, baseline_scores)]
    return win_rate_summary(outcomes)


def peak_memory_mb(device: torch.device) -> tuple[float, str]:
    """(peak MB, what it measures): CUDA max allocated on GPU, else the process's max RSS (Linux kB)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20, "cuda_max_memory_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "cpu_max_rss"


def state_memory_mb(modules: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer]) -> float:
    """MB held by the weights of every loaded role plus optimizer state: the part of memory that
    a critic adds or removes, independent of the interpreter's baseline (what max RSS mixes in)."""
    seen, total = set(), 0
    tensors = [p for m in modules for p in m.parameters()]
    tensors += [
        v for opt in optimizers for state in opt.state.values() for v in state.values() if isinstance(v, Tensor)
    ]
    for tensor in tensors:
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            total += tensor.numel() * tensor.element_size()
    return total / 2**20


def loop_costs(
    loop_s: float,
    episodes: int,
    device: torch.device,
    modules: list[torch.nn.Module],
    optimizers: list[torch.optim.Optimizer],
) -> dict:
    """What the training loop cost, for the summary: wall ms per episode it trained (None when it
    trained none, e.g. resumed at its end), peak memory and what measured it, and `state_memory_mb`."""
    peak_mb, peak_source = peak_memory_mb(device)
    return {
        "time_per_sample_ms": 1000 * loop_s / episodes if episodes else None,
        "peak_memory_mb": peak_mb,
        "peak_memory_source": peak_source,
        "state_memory_mb": state_memory_mb(modules, optimizers),
    }


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 of every frozen parameter and buffer, to prove a frozen role was not changed. Trainable ones are left
    out: a LoRA model seen with its adapters disabled (rlhf.lora) is a frozen role whose adapters train."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict(keep_vars=True).items()):
        if tensor.requires_grad:
            continue
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def frozen_digests(roles: dict[str, torch.nn.Module | None]) -> dict[str, str]:
    """`weights_digest` of each frozen role by name; a role that is None (not loaded) is left out."""
    return {name: weights_digest(model) for name, model in roles.items() if model is not None}


def check_frozen(stage: str, roles: dict[str, torch.nn.Module | None], before: dict[str, str]) -> None:
    """Fail when a frozen role's weights no longer match the `frozen_digests` taken before training."""
    after = frozen_digests(roles)
    if after != before:
        raise RuntimeError(f"{stage}: a frozen role changed during training: {before} -> {after}")


EVAL_STREAM = -1  # the `sampling_seeds` stream of held-out evaluations (training iterations use 0, 1, ...)


@torch.no_grad()
def sample_for_eval(
    policy,
    tokenizer,
    prompt_ids: list[list[int]],
    sampling: SamplingConfig,
    seed: int,
    batch_size: int,
    reward_model,
    accelerator,
    reference=None,
    stream: int = EVAL_STREAM,
) -> dict[str, list]:
    """Sample one response per prompt and score it with the reward model; with `reference`, also the
    sequence KL of each response to it. The prompts are sharded over processes and gathered; prompt i
    samples from its own seed (`sampling_seeds(seed, stream, ...)`), so two policies see the same
    random numbers and the results do not depend on the number of processes.
    -> per-prompt lists: responses, response_ids (EOS included), rewards, lengths, finished, kl."""
    policy.eval()

    def one_batch(batch: list[tuple[int, list[int]]]) -> list[dict]:
        rollout = generate_rollout(
            policy, tokenizer, [ids for _, ids in batch], sampling, batch_size, row_seeds=[s for s, _ in batch]
        )
        rewards = score_rollout(reward_model, rollout, batch_size)  # (b,)
        kl = torch.zeros_like(rewards)
        if reference is not None:
            kl = sequence_kl(
                rollout_logprobs(policy, rollout, sampling.temperature, batch_size),
                rollout_logprobs(reference, rollout, sampling.temperature, batch_size),
                rollout.response_mask,
            )
        return [
            {"response": text, "response_ids": ids, "reward": r, "length": n, "finished": f, "kl": k}
            for text, ids, r, n, f, k in zip(
                rollout.texts(tokenizer),
                rollout.response_ids(),
                rewards.tolist(),
                rollout.response_lengths.tolist(),
                rollout.finished.tolist(),
                kl.tolist(),
            )
        ]

    seeds = sampling_seeds(seed, stream, range(len(prompt_ids)))
    items = forward_map(one_batch, list(zip(seeds, prompt_ids)), batch_size, accelerator)
    return {
        "responses": [i["response"] for i in items],
        "response_ids": [i["response_ids"] for i in items],
        "rewards": [i["reward"] for i in items],
        "lengths": [i["length"] for i in items],
        "finished": [i["finished"] for i in items],
        "kl": [i["kl"] for i in items],
    }


def append_samples(
    path,
    iteration: int,
    prompts: list[str],
    responses: list[str],
    scores: list[float],
    finished: list[bool],
    gold: bool,
) -> None:
    """Append training samples (prompt, response, score; gold score on the embedded task) to a JSONL file."""
    with open(path, "a", encoding="utf-8") as handle:
        for prompt, response, score, done in zip(prompts, responses, scores, finished):
            row = {"iteration": iteration, "prompt": prompt, "response": response, "score": score, "finished": done}
            if gold:
                row["gold_score"] = task.gold_score(prompt, response)
            handle.write(json.dumps(row) + "\n")


def eval_rows(prompts: list[str], policy: dict, sft: dict) -> list[dict]:
    """Per-prompt rows of the final comparison (after `compare_with_sft`, which adds gold scores)."""
    rows = []
    for i, prompt in enumerate(prompts):
        row = {
            "prompt": prompt,
            "response": policy["responses"][i],
            "reward": policy["rewards"][i],
            "kl": policy["kl"][i],
            "sft_response": sft["responses"][i],
            "sft_reward": sft["rewards"][i],
        }
        if "gold" in policy:
            row.update(gold_score=policy["gold"][i], sft_gold_score=sft["gold"][i])
        rows.append(row)
    return rows


def gold_scores(prompts: list[str], responses: list[str]) -> list[float]:
    return [task.gold_score(p, r) for p, r in zip(prompts, responses)]


def summarize_samples(prompts: list[str], samples: dict, gold: bool) -> dict:
    """Means over one policy's held-out samples (`sample_for_eval`): reward_mean, kl_to_ref,
    length_mean, eos_rate; with gold=True (embedded task) also gold_score_mean and gold_good_rate,
    and the per-prompt gold scores are stored in samples["gold"]."""

    def mean(values):
        return sum(values) / len(values) if values else math.nan

    summary = {
        "reward_mean": mean(samples["rewards"]),
        "kl_to_ref": mean(samples["kl"]),
        "length_mean": mean(samples["lengths"]),
        "eos_rate": mean([float(f) for f in samples["finished"]]),
    }
    if gold:
        samples["gold"] = gold_scores(prompts, samples["responses"])
        summary.update(
            gold_score_mean=mean(samples["gold"]),
            gold_good_rate=mean([float(task.is_good_score(s)) for s in samples["gold"]]),
        )
    return summary


def compare_with_sft(prompts: list[str], policy: dict, sft: dict, gold: bool) -> dict:
    """Summary of the final policy against the SFT policy on the same held-out prompts.

    policy, sft: per-prompt lists {"responses", "rewards", "lengths", "finished", "kl"}, sampled
    with the same settings and seed. With gold=True (embedded task) the gold judge scores both and
    decides the head-to-head; the reward model's head-to-head is reported too.
    """
    ours, theirs = summarize_samples(prompts, policy, gold), summarize_samples(prompts, sft, gold)
    results = {
        "eval_prompts": len(prompts),
        "reward_mean": ours["reward_mean"],
        "sft_reward_mean": theirs["reward_mean"],
        "length_mean": ours["length_mean"],
        "sft_length_mean": theirs["length_mean"],
        "eos_rate": ours["eos_rate"],
        "sft_eos_rate": theirs["eos_rate"],
        "kl_to_ref": ours["kl_to_ref"],
    }
    results["reward_delta"] = results["reward_mean"] - results["sft_reward_mean"]
    reward_h2h = head_to_head(policy["rewards"], sft["rewards"])
    results["reward_win_rate_vs_sft"] = reward_h2h["win_rate"]
    if gold:
        gold_h2h = head_to_head(policy["gold"], sft["gold"])
        results.update(
            {
                "gold_score_mean": ours["gold_score_mean"],
                "sft_gold_score_mean": theirs["gold_score_mean"],
                "gold_good_rate": ours["gold_good_rate"],
                "sft_gold_good_rate": theirs["gold_good_rate"],
                "gold_win_rate_vs_sft": gold_h2h["win_rate"],
                "gold_wins": gold_h2h["wins"],
                "gold_losses": gold_h2h["losses"],
                "gold_ties": gold_h2h["ties"],
                "gold_win_rate_ci95": [gold_h2h["ci95_low"], gold_h2h["ci95_high"]],
            }
        )
        results["gold_delta"] = results["gold_score_mean"] - results["sft_gold_score_mean"]
    return results


def evaluate_against_sft(
    policy,
    sft_policy,
    reward_model,
    tokenizer,
    prompts: RLPrompts,
    sampling: SamplingConfig,
    seed: int,
    batch_size: int,
    accelerator,
    gold: bool,
) -> tuple[dict, list[dict]]:
    """The final policy against the SFT policy on the held-out prompts, with the same sampling
    settings and seed for both; the policy's KL is measured to the SFT policy.
    -> (the `compare_with_sft` summary, per-prompt `eval_rows` for eval_samples.jsonl)."""
    policy_eval = sample_for_eval(
        policy, tokenizer, prompts.eval_ids, sampling, seed, batch_size, reward_model, accelerator, reference=sft_policy
    )
    sft_eval = sample_for_eval(
        sft_policy, tokenizer, prompts.eval_ids, sampling, seed, batch_size, reward_model, accelerator
    )
    results = compare_with_sft(prompts.eval_texts, policy_eval, sft_eval, gold=gold)
    return results, eval_rows(prompts.eval_texts, policy_eval, sft_eval)


def eval_due(iteration: int, eval_every: int, iterations: int) -> bool:
    """Whether the policy after `iteration` iterations gets a held-out evaluation: at 0 (before
    training) and every `eval_every`, but not after the last, which the final evaluation covers
    with the same prompts, settings and seed (and logs under the same keys)."""
    return eval_every > 0 and iteration % eval_every == 0 and iteration < iterations


def held_out_eval(
    stage: str,
    policy,
    sft_policy,
    reward_model,
    tokenizer,
    prompts: RLPrompts,
    sampling: SamplingConfig,
    seed: int,
    batch_size: int,
    accelerator,
    gold: bool,
) -> dict[str, float]:
    """The policy now, on the held-out prompts: `summarize_samples` as `<stage>/eval/*` metrics, with
    the KL measured to the SFT policy. Sampled with the final evaluation's per-prompt seeds, which
    draw nothing from torch's RNG: training's random stream is the same with or without eval_every."""
    samples = sample_for_eval(
        policy, tokenizer, prompts.eval_ids, sampling, seed, batch_size, reward_model, accelerator, reference=sft_policy
    )
    return eval_metrics(stage, summarize_samples(prompts.eval_texts, samples, gold))


def eval_metrics(stage: str, results: dict) -> dict[str, float]:
    """The numbers of a results dict as `<stage>/eval/<key>` metrics (flags, None, lists and strings left out)."""
    return {
        f"{stage}/eval/{key}": value
        for key, value in results.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    }


def final_line(stage: str, results: dict) -> str:
    """The stage's last console line: reward-model score and KL of the final policy against SFT,
    and on the embedded task the gold scores and gold win rate."""
    line = (
        f"[{stage}] RM score {results['reward_mean']:+.3f} (SFT {results['sft_reward_mean']:+.3f}), "
        f"KL to ref {results['kl_to_ref']:.2f} nats"
    )
    if "gold_score_mean" in results:
        line += (
            f"; gold {results['gold_score_mean']:.3f} (SFT {results['sft_gold_score_mean']:.3f}), "
            f"gold win rate vs SFT {results['gold_win_rate_vs_sft']:.3f}"
        )
    return line


# ----------------------------------------------------------------------------- publishing


def publish_rl(
    stage: str,
    run: RunDir,
    cfg: Config,
    accelerator,
    logger: MetricLogger,
    policy: torch.nn.Module,
    tokenizer,
    results: dict,
    eval_samples: list[dict],
    curves: list[str],
    t_start: float,
    complete_info: dict[str, int],
) -> None:
    """The end of an RL stage. The main process writes `<stage>/model/` (the unwrapped policy in
    Hugging Face format), eval_samples.jsonl, curves.png (the `curves` keys), results.json and the
    stage's entries in summary.json (timing since `t_start`), then marks the stage complete with
    `complete_info` (how far its loop ran, e.g. {"iterations": 16}), which removes its checkpoint.
    Every process then closes the logger, waits, and prints `final_line`."""
    if accelerator.is_main_process:
        save_pretrained_atomic(policy, tokenizer, run.model_dir(stage))
        write_jsonl(run.stage(stage) / "eval_samples.jsonl", eval_samples)
        plot_training_curves(logger.history, curves, run.stage(stage) / "curves.png", stage.upper())
        write_json_atomic(run.stage(stage) / "results.json", results)
        run.update_summary({stage: results, "timing_s": {stage: round(time.perf_counter() - t_start, 2)}})
        run.mark_complete(stage, cfg, complete_info)
    logger.close()
    accelerator.wait_for_everyone()
    accelerator.print(final_line(stage, results))
