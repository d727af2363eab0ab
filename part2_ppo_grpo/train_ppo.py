"""Stage `ppo`: align the SFT policy to the reward model (or reward functions) with PPO.

    python part2_ppo_grpo/train_ppo.py --preset tiny [ppo.reward=rlhf.task:gold_rewards] [ppo.eval_every=4]

Reads `<run>/data/` (prompts), `<run>/sft/model/` (policy init, frozen reference) and
`<run>/reward/model/` (frozen reward model, critic init). Writes `<run>/ppo/model/` in Hugging
Face format, samples.jsonl (training samples every `ppo.samples_every` iterations),
eval_samples.jsonl (final policy vs SFT on held-out prompts), curves.png, metrics.jsonl, and
`ppo.*` / `timing_s.ppo` in summary.json. Metric keys are defined in rlhf/rl/__init__.py.

The training score comes from `ppo.reward` (rlhf/rewards.py): the reward model by default, or
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
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlhf, even under another clone's .venv

from rlhf.cli import run_stage, start_stage
from rlhf.engines import build_engine, check_engine
from rlhf.errors import UserError
from rlhf.evaluation import sequence_kl
from rlhf.lora import load_trainable_policy, ppo_critic_and_reward, reference_policy
from rlhf.losses import ppo_policy_loss, ppo_value_loss
from rlhf.models import PolicyAndValue, load_tokenizer
from rlhf.ops import (
    explained_variance,
    explained_variance_moments,
    gae_advantages,
    masked_mean,
    masked_moments,
    masked_whiten,
)
from rlhf.rewards import load_reward_source
from rlhf.rl.checkpoints import load_rl_checkpoint, open_rl_logger, save_rl_checkpoint
from rlhf.rl.held_out import append_samples, eval_due, eval_metrics, evaluate_against_sft, held_out_eval
from rlhf.rl.passes import (
    align_values,
    build_ppo_optimizer,
    mean_process_units,
    micro_batches,
    minibatch_indices,
    shifted_entropy,
    shifted_logprobs,
)
from rlhf.rl.plan import check_context, check_ppo_config, context_size, plan_rl, set_cpu_threads
from rlhf.rl.prompts import load_rl_prompts
from rlhf.rl.publish import publish_rl
from rlhf.rl.roles import check_frozen, frozen_digests
from rlhf.rl.sampling import engine_mismatch_metrics, importance_weights, sample_train_batch
from rlhf.rl.shaping import apply_missing_eos_penalty, make_kl_controller, shape_rewards
from rlhf.rl.stats import gold_metrics, loop_costs, peak_memory_mb, response_metrics
from rlhf.rollout import (
    SamplingConfig,
    eval_sampling,
    forward_in_chunks,
    rollout_logprobs,
    score_rollout,
)
from rlhf.run import stage_seed
from rlhf.sharding import prepare_trained_model
from rlhf.signals import checkpoint_due
from rlhf.training import build_scheduler, make_accelerator, optimizer_step

CURVES = [
    "ppo/objective/scores",
    "ppo/gold/score_mean",
    "ppo/objective/rlhf_reward",
    "ppo/objective/kl",
    "ppo/objective/entropy",
    "ppo/responses/length_mean",
    "ppo/responses/eos_rate",
    "ppo/policy/clipfrac",
    "ppo/policy/approxkl",
    "ppo/val/explained_variance",
    "ppo/val/loss",
    "ppo/objective/kl_coef",
    "ppo/responses/length_score_corr",
    "ppo/rollout/mismatch_kl",
]
EVAL_CURVES = [
    "ppo/eval/reward_mean",
    "ppo/eval/gold_score_mean",
    "ppo/eval/kl_to_ref",
]  # drawn when ppo.eval_every > 0


def policy_and_values(model, rollout, temperature: float, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rollout log-probs (B, T) and values (B, T) from the training module itself, in no-grad chunks,
    so the first PPO step starts from ratio 1 and V_old is what the value loss clips around."""

    def both(input_ids, attention_mask):
        logits, position_values = model(input_ids, attention_mask)
        return shifted_logprobs(logits, input_ids, temperature), align_values(position_values)

    logprobs, values = forward_in_chunks(both, rollout, batch_size)
    mask = rollout.response_mask
    return torch.where(mask, logprobs, 0.0), torch.where(mask, values.float(), 0.0)


def main(argv: list[str] | None = None) -> None:
    started = start_stage("ppo", argv, requires=("reward",), check=lambda cfg: check_ppo_config(cfg.ppo))
    if started is None:
        return
    cfg, run = started
    seed = stage_seed(cfg, "ppo")  # run.method_seed when set (part4_eval/seeds.py)
    pcfg = cfg.ppo
    gold = cfg.data.path == "embedded"  # the embedded task has a gold judge
    t_start = time.perf_counter()

    # 1. Reward source, prompts and batch-size rules, checked before any model is loaded.
    reward_source = load_reward_source("ppo", pcfg.reward)
    accelerator = make_accelerator(cfg, "ppo")
    tokenizer = load_tokenizer(run.model_dir("sft"))
    prompts = load_rl_prompts("ppo", run, cfg, tokenizer, pcfg.eval_prompts)
    plan = plan_rl("ppo", pcfg, accelerator.num_processes, len(prompts.train_ids))
    context = context_size(run.model_dir("sft"))
    check_context("ppo", prompts.longest, pcfg.max_new_tokens, context)
    validation = eval_sampling(cfg)  # held-out checks decode as the test does (rlhf.rollout.eval_sampling)
    check_context("eval", prompts.longest, validation.max_new_tokens, context)
    sampling = SamplingConfig(pcfg.max_new_tokens, pcfg.temperature, pcfg.top_p, pcfg.top_k)
    clip_high = pcfg.clip if pcfg.clip_high is None else pcfg.clip_high
    device, rank = accelerator.device, accelerator.process_index
    set_cpu_threads("ppo", pcfg.cpu_threads, device)
    check_engine(cfg.rollout, "ppo")

    # 2. Four roles, dropout off in every one (load_* disable it): trainable policy and critic in one
    #    module (one optimizer, one checkpoint), frozen reference and reward model.
    #    With LoRA, the reference is the policy with its adapters disabled, and the reward model the critic's.
    lora = cfg.model.lora.for_stage("ppo")
    critic, reward_model = ppo_critic_and_reward(run.model_dir("reward"), pcfg.value_model, lora, device)
    policy = load_trainable_policy(run.model_dir("sft"), lora)
    model = PolicyAndValue(policy, critic)
    reference = reference_policy(policy, run.model_dir("sft"), device)
    frozen_roles = {"reference": reference, "reward": reward_model}
    frozen_before = frozen_digests(frozen_roles)
    model, optimizer, whole = prepare_trained_model(accelerator, model, lambda m: build_ppo_optimizer(m, pcfg))
    scheduler = build_scheduler(optimizer, pcfg, plan.optimizer_steps)
    engine = build_engine(cfg.rollout, "ppo", run.model_dir("sft"), tokenizer, accelerator, pcfg.forward_batch_size)
    kl_controller = make_kl_controller(pcfg)
    accelerator.print(
        f"[ppo] {plan.iterations} iterations x {pcfg.batch_size} episodes; policy "
        f"{sum(p.numel() for p in accelerator.unwrap_model(model).policy.parameters()) / 1e6:.2f}M parameters, "
        f"critic: {pcfg.value_model}"
    )

    # 3. Resume from the last checkpoint written for this same config, if any.
    state = load_rl_checkpoint("ppo", run, cfg, accelerator, model, optimizer, scheduler, plan.iterations)
    iteration = resumed_from = 0 if state is None else state["iteration"]
    if state is not None:
        kl_controller.value = state["kl_coef"]
    logger = open_rl_logger("ppo", run, cfg, accelerator, iteration, plan.iterations)

    eval_s = 0.0  # seconds of held-out evaluation inside the loop, left out of its per-sample cost

    def evaluate_now() -> dict[str, float]:
        """The current policy on the held-out prompts (RM score, gold score, KL to SFT), logged as ppo/eval/*."""
        nonlocal eval_s
        started = time.perf_counter()
        measured = held_out_eval(
            "ppo",
            engine,
            whole.of(model).policy,
            reference,
            reward_model,
            tokenizer,
            prompts,
            validation,
            seed,
            pcfg.forward_batch_size,
            accelerator,
            gold,
        )
        seconds = time.perf_counter() - started
        eval_s += seconds
        return {**measured, "ppo/time/eval_s": seconds}

    loop_start = time.perf_counter()
    if iteration == 0 and eval_due(0, pcfg.eval_every, plan.iterations):
        logger.log(0, evaluate_now())  # the SFT policy: the origin of the reward-vs-KL curve
    metrics: dict[str, float] = {}

    # 4. Iterations: sample, score, shape rewards, estimate advantages, optimise.
    while iteration < plan.iterations:
        # 4a. Rollouts from the current policy's weights.
        t0 = time.perf_counter()
        model.eval()
        local_rows, rollout = sample_train_batch(
            engine,
            whole.of(model).policy,
            prompts,
            plan.prompts_per_iteration,
            iteration,
            seed,
            accelerator,
            sampling,
        )
        mask = rollout.response_mask  # (B, T)
        t1 = time.perf_counter()

        # 4b. No-grad passes in large chunks: policy log-probs and values, reference log-probs, scores
        #     (reward model only when the reward spec uses it; functions score the decoded text).
        batch_prompts, responses = [prompts.train_texts[i] for i in local_rows], rollout.texts(tokenizer)
        with accelerator.autocast():
            logprobs, values = policy_and_values(
                model, rollout, pcfg.temperature, pcfg.forward_batch_size
            )  # (B, T) each
            ref_logprobs = rollout_logprobs(reference, rollout, pcfg.temperature, pcfg.forward_batch_size)  # (B, T)
            rm_scores = (
                score_rollout(reward_model, rollout, pcfg.forward_batch_size) if reward_source.uses_model else None
            )  # (B,)
        raw_scores, reward_terms = reward_source.score(batch_prompts, responses, rm_scores)  # (B,), {term: (B,)}
        scores = apply_missing_eos_penalty(raw_scores.to(device), rollout.finished, pcfg.missing_eos_penalty)  # (B,)

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
        model.train()
        generator = torch.Generator().manual_seed(seed * 1_000_003 + iteration * 101 + rank)
        stats: dict[str, list[torch.Tensor]] = {}
        kl_stopped = False
        for _ in range(pcfg.epochs):
            for minibatch in minibatch_indices(plan.local_batch, pcfg.num_minibatches, generator):
                units = mean_process_units(accelerator, mask[minibatch], "token")
                micro = micro_batches(
                    minibatch.to(device), rollout.lengths, mask, plan.micro_batch_size, "token", units
                )
                step_stats: dict[str, torch.Tensor] = {}
                for k, (rows, t, weight) in enumerate(micro):
                    input_ids, micro_mask = rollout.input_ids[rows, :t], mask[rows, :t]  # (b, t) each
                    with accelerator.no_sync(model) if k < len(micro) - 1 else nullcontext():
                        logits, position_values = model(input_ids, rollout.attention_mask[rows, :t])
                        new_logprobs = shifted_logprobs(logits, input_ids, pcfg.temperature)  # (b, t)
                        new_values = align_values(position_values)  # (b, t)
                        pg_loss, pg_stats = ppo_policy_loss(
                            new_logprobs,
                            logprobs[rows, :t],
                            advantages[rows, :t],
                            micro_mask,
                            pcfg.clip,
                            clip_high,
                            importance_weights(rollout, logprobs[rows, :t], rows, t, cfg.rollout.tis_cap),
                        )
                        vf_loss, vf_stats = ppo_value_loss(
                            new_values, values[rows, :t], returns[rows, :t], micro_mask, pcfg.value_clip
                        )
                        with torch.set_grad_enabled(pcfg.entropy_coef > 0):
                            entropy = masked_mean(shifted_entropy(logits, pcfg.temperature), micro_mask)
                        loss = pg_loss + pcfg.vf_coef * vf_loss - pcfg.entropy_coef * entropy
                        if not torch.isfinite(loss):
                            raise UserError(
                                f"ppo: non-finite loss at iteration {iteration + 1}; lower ppo.lr "
                                f"(last good checkpoint: {run.checkpoint_dir('ppo')})"
                            )
                        accelerator.backward(loss * weight)
                    micro_stats = {
                        "train/loss": loss,
                        "policy/approxkl": pg_stats["approxkl"],
                        "policy/clipfrac": pg_stats["clipfrac"],
                        "policy/ratio_mean": pg_stats["ratio_mean"],
                        "val/loss": vf_loss,
                        "val/clipfrac": vf_stats["clipfrac"],
                        "val/value_mean": vf_stats["value_mean"],
                        "objective/entropy": entropy,
                    }
                    for key, value in micro_stats.items():
                        step_stats[key] = step_stats.get(key, 0.0) + weight * value.detach().float()
                grad_norm = optimizer_step(accelerator, model, optimizer, scheduler, pcfg.max_grad_norm)
                if grad_norm is not None:
                    step_stats["train/grad_norm"] = grad_norm
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
        iteration += 1
        logger.advance()

        # 4f. Metrics (means over processes; variances and correlations over all rollouts), samples, checkpoint.
        non_score = -kl_coef * seq_kl  # (B,)
        ev_moments = accelerator.reduce(explained_variance_moments(values, returns, mask), reduction="sum")  # (2, 3)
        local = {
            "objective/scores": scores.mean(),
            "objective/kl": seq_kl.mean(),
            "objective/non_score_reward": non_score.mean(),
            "objective/rlhf_reward": (scores + non_score).mean(),
            "val/explained_variance": explained_variance(values, returns, mask, moments=ev_moments),
            **response_metrics(*accelerator.gather((rollout.response_lengths, rollout.finished, scores)), t1 - t0),
            **{key: torch.stack(values).mean() for key, values in stats.items()},
            **{f"reward/{name}": term.mean() for name, term in reward_terms.items()},
            **engine_mismatch_metrics(rollout, logprobs),  # the engine's log-probs vs the trainer's
        }
        if gold:  # the gold judge on the training samples: over-optimisation shows here first
            local.update(gold_metrics(batch_prompts, responses))
        metrics = {
            f"ppo/{key}": accelerator.reduce(value.float().to(device), reduction="mean").item()
            for key, value in local.items()
        }
        metrics.update(
            {
                "ppo/objective/kl_coef": kl_coef,
                "ppo/policy/kl_stopped": float(kl_stopped),
                "ppo/train/lr": scheduler.get_last_lr()[0],
                "ppo/time/generate_s": t1 - t0,
                "ppo/time/score_s": t2 - t1,
                "ppo/time/train_s": t3 - t2,
                "ppo/memory/peak_mb": peak_memory_mb(device)[0],
                "ppo/train/episodes": iteration * pcfg.batch_size,
            }
        )
        logger.log(iteration, metrics, postfix=("ppo/objective/scores", "ppo/objective/kl"))
        if eval_due(
            iteration, pcfg.eval_every, plan.iterations
        ):  # before the checkpoint, so a resumed run has this row
            logger.log(iteration, evaluate_now())
        if (
            accelerator.is_main_process
            and pcfg.samples_every
            and (iteration % pcfg.samples_every == 0 or iteration == 1)
        ):
            n = pcfg.num_samples
            append_samples(
                run.stage("ppo") / "samples.jsonl",
                iteration,
                batch_prompts[:n],
                responses[:n],
                scores[:n].tolist(),
                rollout.finished[:n].tolist(),
                gold,
            )
        if checkpoint_due(accelerator, pcfg.save_every, iteration, plan.iterations):
            save_rl_checkpoint(
                "ppo", run, cfg, accelerator, model, optimizer, scheduler, iteration, kl_coef=kl_controller.value
            )
    unwrapped = whole.of(model)
    costs = loop_costs(
        time.perf_counter() - loop_start - eval_s,
        (iteration - resumed_from) * pcfg.batch_size,
        device,
        [unwrapped, reference, reward_model],
        [optimizer],
    )
    check_frozen("ppo", frozen_roles, frozen_before)

    # 5. Final policy vs SFT on held-out prompts: the test's decoding and the same seed for both.
    results, eval_samples = evaluate_against_sft(
        engine,
        unwrapped.policy,
        reference,
        reward_model,
        tokenizer,
        prompts,
        validation,
        seed,
        pcfg.forward_batch_size,
        accelerator,
        gold,
    )
    trained = resumed_from < iteration
    results.update(
        {
            "iterations": iteration,
            "episodes": iteration * pcfg.batch_size,
            "resumed_from_iteration": resumed_from,
            "final_kl_coef": kl_controller.value,
            "train_score_mean": metrics["ppo/objective/scores"] if trained else None,
            "train_kl": metrics["ppo/objective/kl"] if trained else None,
            **costs,
            "frozen_roles_unchanged": True,
            "value_model": pcfg.value_model,
            "reward_source": reward_source.spec,
        }
    )
    logger.log(iteration, eval_metrics("ppo", results))

    # 6. Publish: the HF policy, evaluation samples, curves, summary; then mark complete.
    publish_rl(
        "ppo",
        run,
        cfg,
        accelerator,
        logger,
        unwrapped.policy,
        tokenizer,
        results,
        eval_samples,
        CURVES + (EVAL_CURVES if pcfg.eval_every else []),
        t_start,
        {"iterations": iteration},
    )


if __name__ == "__main__":
    run_stage(main)
