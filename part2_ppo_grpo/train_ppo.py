"""Stage `ppo`: align the SFT policy to the reward model (or reward functions) with PPO.

    python part2_ppo_grpo/train_ppo.py --preset tiny [ppo.reward=rlhf.task:gold_rewards] [ppo.eval_every=4]

Reads `<run>/data/` (prompts), `<run>/sft/model/` (policy init, frozen reference) and
`<run>/reward/model/` (frozen reward model, critic init). Writes `<run>/ppo/model/` in Hugging
Face format, samples.jsonl (training samples every `ppo.samples_every` iterations),
eval_samples.jsonl (final policy vs SFT on held-out prompts), curves.png, metrics.jsonl, and
`ppo.*` / `timing_s.ppo` in summary.json. Metric keys are defined in rlhf/online/__init__.py.

The training score comes from `ppo.reward` (rlhf/rollout/reward_spec.py): the reward model by default, or
Python reward functions such as the embedded task's gold judge, or a weighted sum. The reward
model is loaded either way: it initialises the critic and scores every held-out evaluation.
`ppo.eval_every` > 0 evaluates the policy on the held-out prompts along training as well.

Follows Huang et al. 2024, "The N+ Implementation Details of RLHF with PPO" (arXiv 2403.17031):
- four roles: trainable policy and critic, frozen reference (SFT) and reward model; dropout off in all;
- the critic is a separate network initialised from the reward model (`ppo.value_model=shared`
  puts a value head on the policy backbone instead);
- prompts left-padded, pad distinct from EOS; responses truncated after their first EOS, and a
  response without EOS loses `ppo.missing_eos_penalty` from its score;
- log-probs recomputed with logits / sampling temperature, for policy and reference alike;
- per-token reward -beta (log pi - log pi_ref), plus the score at the last token; beta fixed, or
  adaptive (Ziegler et al. 2019) with `ppo.kl_target`; reward whitening optional (off);
- GAE with gamma = 1, lambda = 0.95; advantages whitened over the batch;
- clipped surrogate + vf_coef x clipped value loss (- entropy_coef x entropy), `ppo.epochs` passes of
  `ppo.num_minibatches` minibatches per rollout batch; optional early stop on approxkl > `ppo.kl_stop`.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlhf, even under another clone's .venv

from rlhf.methods.rules import STAGE_RULES
from rlhf.stage.cli import answer_early, run_stage, start_stage

if __name__ == "__main__":
    answer_early("ppo", STAGE_RULES["ppo"])  # --help and config errors at once, before torch loads below

import torch

from rlhf.analysis.evaluation import sequence_kl
from rlhf.core.losses import ppo_policy_loss, ppo_value_loss
from rlhf.core.ops import (
    explained_variance,
    explained_variance_moments,
    gae_advantages,
    masked_mean,
    masked_moments,
    masked_whiten,
    shifted_entropy,
    shifted_logprobs,
)
from rlhf.core.stages import STAGES
from rlhf.loop.step import train_step
from rlhf.methods.passes import align_values, build_ppo_optimizer, minibatch_indices, rollout_micro_batches
from rlhf.methods.plan import plan_rl
from rlhf.methods.shaping import make_kl_controller, shape_rewards
from rlhf.models.lora import load_trainable_policy, ppo_critic_and_reward, reference_policy
from rlhf.models.modeling import PolicyAndValue
from rlhf.online.harness import OnlineStage
from rlhf.online.sampling import engine_mismatch_metrics, importance_weights
from rlhf.rollout.batch import SamplingConfig
from rlhf.rollout.forward import forward_in_chunks, rollout_logprobs

CURVES = list(STAGES["ppo"].curves)
EVAL_CURVES = list(STAGES["ppo"].eval_curves)  # drawn when ppo.eval_every > 0


def policy_and_values(model, rollout, temperature: float, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rollout log-probs (B, T) and values (B, T) from the training module itself, in no-grad chunks,
    so the first PPO step starts from ratio 1 and V_old is what the value loss clips around."""

    def both(input_ids, attention_mask):
        logits, position_values = model(input_ids, attention_mask)
        return shifted_logprobs(logits, input_ids, temperature), align_values(position_values)

    logprobs, values = forward_in_chunks(both, rollout, batch_size)
    mask = rollout.response_mask
    return torch.where(mask, logprobs, 0.0), torch.where(mask, values.float(), 0.0)


def ppo_loss_fn(pcfg, tis_cap: float | None):
    """PPO's loss on a selection of rollouts (`Rollout.select`, carrying their old log-probs, values, returns and
    advantages): the clipped surrogate, plus `vf_coef` x the clipped value loss, minus `entropy_coef` x the entropy.
    (model, chunk) -> (loss, statistics), the model a PolicyAndValue."""
    clip_high = pcfg.clip if pcfg.clip_high is None else pcfg.clip_high

    def loss_fn(model, chunk):
        mask = chunk.response_mask  # (b, t)
        logits, position_values = model(chunk.input_ids, chunk.attention_mask)
        new_logprobs = shifted_logprobs(logits, chunk.input_ids, pcfg.temperature)  # (b, t)
        new_values = align_values(position_values)  # (b, t)
        pg_loss, pg_stats = ppo_policy_loss(
            new_logprobs,
            chunk.old_logprobs,
            chunk.advantages,
            mask,
            pcfg.clip,
            clip_high,
            importance_weights(chunk, chunk.old_logprobs, tis_cap),
        )
        vf_loss, vf_stats = ppo_value_loss(new_values, chunk.values, chunk.returns, mask, pcfg.value_clip)
        with torch.set_grad_enabled(pcfg.entropy_coef > 0):
            entropy = masked_mean(shifted_entropy(logits, pcfg.temperature), mask)
        loss = pg_loss + pcfg.vf_coef * vf_loss - pcfg.entropy_coef * entropy
        return loss, {
            "policy/approxkl": pg_stats["approxkl"],
            "policy/clipfrac": pg_stats["clipfrac"],
            "policy/ratio_mean": pg_stats["ratio_mean"],
            "val/loss": vf_loss,
            "val/clipfrac": vf_stats["clipfrac"],
            "val/value_mean": vf_stats["value_mean"],
            "objective/entropy": entropy,
        }

    return loss_fn


def main(argv: list[str] | None = None) -> None:
    started = start_stage("ppo", argv, requires=("reward",), check=STAGE_RULES["ppo"])
    if started is None:
        return
    cfg, run = started
    pcfg = cfg.ppo
    batch_size = pcfg.forward_batch_size  # rows per no-grad pass

    # 1. Reward source, prompts, context (rlhf.online.harness) and batch-size rules, checked before any model is
    #    loaded.
    stage = OnlineStage("ppo", cfg, run, batch_size)
    accelerator, device, seed = stage.accelerator, stage.device, stage.seed
    plan = plan_rl("ppo", pcfg, accelerator.num_processes, len(stage.prompts.train_ids))
    sampling = SamplingConfig(pcfg.max_new_tokens, pcfg.temperature, pcfg.top_p, pcfg.top_k)
    loss_fn = ppo_loss_fn(pcfg, cfg.rollout.tis_cap)

    # 2. Four roles, dropout off in every one (load_* disable it): trainable policy and critic in one
    #    module (one optimizer, one checkpoint), frozen reference and reward model.
    #    With LoRA, the reference is the policy with its adapters disabled, and the reward model the critic's.
    lora = cfg.model.lora.for_stage("ppo")
    critic, reward_model = ppo_critic_and_reward(run.model_dir("reward"), pcfg.value_model, lora, device)
    policy = load_trainable_policy(run.model_dir("sft"), lora)
    model = PolicyAndValue(policy, critic)
    reference = reference_policy(policy, run.model_dir("sft"), device)
    model, optimizer, scheduler = stage.prepare(
        model,
        lambda m: build_ppo_optimizer(m, pcfg),
        plan.optimizer_steps,
        reward_model,
        {"reference": reference, "reward": reward_model},
        reference,
        policy_of=lambda trained: trained.policy,
    )
    kl_controller = make_kl_controller(pcfg)
    accelerator.print(
        f"[ppo] {plan.iterations} iterations x {pcfg.batch_size} episodes; policy "
        f"{sum(p.numel() for p in accelerator.unwrap_model(model).policy.parameters()) / 1e6:.2f}M parameters, "
        f"critic: {pcfg.value_model}"
    )

    # 3. Resume from the last checkpoint written for this same config, if any.
    #    Before training: the SFT policy's held-out check.
    state = stage.resume(plan.iterations)
    if state is not None:
        kl_controller.value = state["kl_coef"]
    metrics: dict[str, float] = {}

    # 4. Iterations: sample, score, shape rewards, estimate advantages, optimise.
    while stage.iteration < plan.iterations:
        # 4a. Rollouts from the current policy's weights.
        t0 = time.perf_counter()
        model.eval()
        local_rows, rollout = stage.sample(plan.prompts_per_iteration, sampling)
        mask = rollout.response_mask  # (B, T)
        t1 = time.perf_counter()

        # 4b. No-grad passes in large chunks: policy log-probs and values, reference log-probs; the score.
        with accelerator.autocast():
            logprobs, values = policy_and_values(model, rollout, pcfg.temperature, batch_size)  # (B, T) each
            ref_logprobs = rollout_logprobs(reference, rollout, pcfg.temperature, batch_size)  # (B, T)
        scored = stage.score(rollout, local_rows, batch_size)
        scores = scored.scores  # (B,)

        # 4c. Per-token rewards (KL penalty + score at the last token), GAE, whitened advantages; whitening
        #     takes its mean and variance over every process's rollouts (moments summed over processes).
        kl_coef = kl_controller.value
        rewards, _kl = shape_rewards(scores, logprobs, ref_logprobs, mask, kl_coef)  # (B, T) each
        if pcfg.whiten_rewards:
            moments = accelerator.reduce(masked_moments(rewards, mask), reduction="sum")  # (3,)
            rewards = masked_whiten(rewards, mask, shift_mean=False, moments=moments)
        advantages, returns = gae_advantages(rewards, values, mask, pcfg.gamma, pcfg.lam)  # (B, T) each
        moments = accelerator.reduce(masked_moments(advantages, mask), reduction="sum")  # (3,)
        advantages = masked_whiten(advantages, mask, moments=moments)
        t2 = time.perf_counter()

        # 4d. PPO epochs over minibatches; micro-batches weighted by their share of the minibatch's tokens
        #     over all processes.
        rollout = replace(
            rollout,
            old_logprobs=logprobs,
            ref_logprobs=ref_logprobs,
            values=values,
            returns=returns,
            advantages=advantages,
            scores=scores,
        )
        generator = torch.Generator().manual_seed(seed * 1_000_003 + stage.iteration * 101 + accelerator.process_index)
        stats: dict[str, list[torch.Tensor]] = {}
        kl_stopped = False
        for _ in range(pcfg.epochs):
            for minibatch in minibatch_indices(plan.local_batch, pcfg.num_minibatches, generator):
                micro = rollout_micro_batches(
                    accelerator,
                    minibatch.to(device),
                    rollout,
                    plan.micro_batch_size,
                    "token",
                    micro_batch_tokens=pcfg.micro_batch_tokens,
                )
                step_stats = train_step(
                    "ppo",
                    run,
                    f"iteration {stage.iteration + 1}",
                    accelerator,
                    model,
                    optimizer,
                    scheduler,
                    micro,
                    loss_fn,
                    pcfg.max_grad_norm,
                )
                for key, value in step_stats.items():
                    stats.setdefault(key, []).append(value)
                approxkl = accelerator.reduce(step_stats["policy/approxkl"], reduction="mean").item()
                if pcfg.kl_stop is not None and approxkl > pcfg.kl_stop:
                    kl_stopped = True
                    break
            if kl_stopped:
                break
        t3 = time.perf_counter()

        # 4e. The adaptive controller moves beta toward the target KL (a fixed one ignores this).
        seq_kl = sequence_kl(logprobs, ref_logprobs, mask)  # (B,)
        mean_kl = accelerator.reduce(seq_kl.mean(), reduction="mean").item()
        kl_controller.update(mean_kl, pcfg.batch_size)
        iteration = stage.advance()

        # 4f. Metrics (means over processes; variances and correlations over all rollouts), samples, checkpoint.
        non_score = -kl_coef * seq_kl  # (B,)
        ev_moments = accelerator.reduce(explained_variance_moments(values, returns, mask), reduction="sum")  # (2, 3)
        local = {
            "objective/scores": scores.mean(),
            "objective/kl": seq_kl.mean(),
            "objective/non_score_reward": non_score.mean(),
            "objective/rlhf_reward": (scores + non_score).mean(),
            "val/explained_variance": explained_variance(values, returns, mask, moments=ev_moments),
            **stage.sample_metrics(rollout, scores, t1 - t0, scored.prompts, scored.responses),
            **{key: torch.stack(values).mean() for key, values in stats.items()},
            **{f"reward/{name}": term.mean() for name, term in scored.terms.items()},
            **engine_mismatch_metrics(rollout, logprobs),  # the engine's log-probs vs the trainer's
        }
        seconds = {"generate": t1 - t0, "score": t2 - t1, "train": t3 - t2}
        controller = {"objective/kl_coef": kl_coef, "policy/kl_stopped": float(kl_stopped)}
        metrics = stage.metrics(local, seconds, iteration * pcfg.batch_size, controller)
        stage.end_iteration(
            metrics,
            ("ppo/objective/scores", "ppo/objective/kl"),
            (scored.prompts, scored.responses, scores.tolist(), rollout.finished.tolist()),
            kl_coef=kl_controller.value,
        )

    # 5-6. Final policy vs SFT on held-out prompts (the test's decoding, the same seed for both); publish the HF
    #      policy, evaluation samples, curves and summary, then mark complete.
    summary = {
        "iterations": stage.iteration,
        "episodes": stage.iteration * pcfg.batch_size,
        "resumed_from_iteration": stage.resumed_from,
        "final_kl_coef": kl_controller.value,
        "train_score_mean": metrics["ppo/objective/scores"] if stage.trained else None,
        "train_kl": metrics["ppo/objective/kl"] if stage.trained else None,
        "value_model": pcfg.value_model,
        "reward_source": stage.reward_source.spec,
    }
    stage.finish(pcfg.batch_size, summary, CURVES + (EVAL_CURVES if pcfg.eval_every else []))


if __name__ == "__main__":
    run_stage(main)
