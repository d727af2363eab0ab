"""Stage `ppo`: align the SFT policy to the reward model with PPO.

    python part2_ppo_grpo/train_ppo.py --preset tiny

Reads `<run>/data/` (prompts), `<run>/sft/model/` (policy init, frozen reference) and
`<run>/reward/model/` (frozen reward model, critic init). Writes `<run>/ppo/model/` in Hugging
Face format, samples.jsonl (training samples every `ppo.samples_every` iterations),
eval_samples.jsonl (final policy vs SFT on held-out prompts), curves.png, metrics.jsonl, and
`ppo.*` / `timing_s.ppo` in summary.json. Metric keys are defined in rlhf/rl.py.

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

import time
from contextlib import nullcontext

import torch

from rlhf.batching import encode_texts
from rlhf.checkpoint import load_training_state, save_pretrained_atomic, save_training_state
from rlhf.cli import run_stage, start_stage
from rlhf.data import read_jsonl, write_jsonl
from rlhf.errors import UserError
from rlhf.losses import ppo_policy_loss, ppo_value_loss
from rlhf.models import PolicyAndValue, load_policy, load_reward_model, load_tokenizer, value_model_from_reward
from rlhf.ops import explained_variance, gae_advantages, masked_mean, masked_whiten
from rlhf.plots import plot_training_curves
from rlhf.rl import (
    accumulation_weights, align_values, append_samples, apply_missing_eos_penalty, build_ppo_optimizer, check_context, check_gold_prompts, check_ppo_config, compare_with_sft,
    context_size, eval_rows, frozen, gold_scores, iteration_prompts, make_kl_controller, minibatch_indices, pearson, peak_memory_mb,
    plan_rl, sample_for_eval, sequence_kl, set_cpu_threads, shape_rewards, shifted_entropy, shifted_logprobs, state_memory_mb,
    unique_prompts, weights_digest,
)
from rlhf.rollout import SamplingConfig, forward_in_chunks, generate_rollout, rollout_logprobs, score_rollout
from rlhf.run import write_json_atomic
from rlhf.tracking import MetricLogger
from rlhf.training import build_scheduler, make_accelerator

CURVES = ["ppo/objective/scores", "ppo/gold/score_mean", "ppo/objective/rlhf_reward", "ppo/objective/kl", "ppo/objective/entropy",
          "ppo/responses/length_mean", "ppo/responses/eos_rate", "ppo/policy/clipfrac", "ppo/policy/approxkl",
          "ppo/val/explained_variance", "ppo/val/loss", "ppo/objective/kl_coef", "ppo/responses/length_score_corr"]


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
    pcfg = cfg.ppo
    t_start = time.perf_counter()

    # 1. Prompts and batch-size rules, checked before any model is loaded.
    accelerator = make_accelerator(cfg)
    tokenizer = load_tokenizer(run.model_dir("sft"))
    train_prompts = unique_prompts(read_jsonl(run.stage("data") / "train.jsonl"))
    eval_prompts = unique_prompts(read_jsonl(run.stage("data") / "val.jsonl"))[: pcfg.eval_prompts]
    train_ids = [ids[-cfg.data.max_prompt_tokens:] for ids in encode_texts(tokenizer, train_prompts)]
    eval_ids = [ids[-cfg.data.max_prompt_tokens:] for ids in encode_texts(tokenizer, eval_prompts)]
    if cfg.data.path == "embedded":
        check_gold_prompts("ppo", train_prompts, "data/train.jsonl")
        check_gold_prompts("ppo", eval_prompts, "data/val.jsonl")
    plan = plan_rl("ppo", pcfg, accelerator.num_processes, len(train_ids))
    check_context("ppo", max(map(len, train_ids + eval_ids)), pcfg.max_new_tokens, context_size(run.model_dir("sft")))
    sampling = SamplingConfig(pcfg.max_new_tokens, pcfg.temperature, pcfg.top_p, pcfg.top_k)
    clip_high = pcfg.clip if pcfg.clip_high is None else pcfg.clip_high
    device, rank = accelerator.device, accelerator.process_index
    set_cpu_threads("ppo", pcfg.cpu_threads, device)

    # 2. Four roles, dropout off in every one (load_* disable it): trainable policy and critic in one
    #    module (one optimizer, one checkpoint), frozen reference and reward model.
    critic = value_model_from_reward(load_reward_model(run.model_dir("reward"))) if pcfg.value_model == "separate" else None
    model = PolicyAndValue(load_policy(run.model_dir("sft")), critic)
    reference = frozen(load_policy(run.model_dir("sft")), device)
    reward_model = frozen(load_reward_model(run.model_dir("reward")), device)
    frozen_before = {"reference": weights_digest(reference), "reward": weights_digest(reward_model)}
    optimizer = build_ppo_optimizer(model, pcfg)
    scheduler = build_scheduler(optimizer, pcfg, plan.optimizer_steps)
    model, optimizer = accelerator.prepare(model, optimizer)
    kl_controller = make_kl_controller(pcfg)
    accelerator.print(f"[ppo] {plan.iterations} iterations x {pcfg.batch_size} episodes; policy "
                      f"{sum(p.numel() for p in accelerator.unwrap_model(model).policy.parameters()) / 1e6:.2f}M parameters, "
                      f"critic: {pcfg.value_model}")

    # 3. Resume from the last checkpoint written for this same config, if any.
    fingerprint = run.fingerprint("ppo", cfg)
    iteration = 0
    state = load_training_state(run.checkpoint_dir("ppo"), accelerator.unwrap_model(model), optimizer, scheduler)
    if state is not None and state.get("fingerprint") != fingerprint:
        raise UserError(f"{run.checkpoint_dir('ppo')} belongs to a different config; delete it or pass --force to start over")
    if state is not None:
        iteration, kl_controller.value = state["iteration"], state["kl_coef"]
        accelerator.print(f"[ppo] resumed from iteration {iteration}/{plan.iterations}")
    resumed_from = iteration
    logger = MetricLogger("ppo", run.stage("ppo"), run.tensorboard_dir("ppo"), cfg, enabled=accelerator.is_main_process)
    logger.resume(iteration)
    logger.progress(plan.iterations, initial=iteration, desc="ppo")
    loop_start = time.perf_counter()
    metrics: dict[str, float] = {}

    # 4. Iterations: sample, score, shape rewards, estimate advantages, optimise.
    while iteration < plan.iterations:
        # 4a. Rollouts from the current policy (KV-cached generation on left-padded prompts).
        t0 = time.perf_counter()
        prompt_rows = iteration_prompts(len(train_ids), plan.prompts_per_iteration, iteration, cfg.run.seed)
        local_rows = prompt_rows[rank * plan.local_prompts:(rank + 1) * plan.local_prompts]
        model.eval()
        with accelerator.autocast():
            rollout = generate_rollout(accelerator.unwrap_model(model).policy, tokenizer, [train_ids[i] for i in local_rows],
                                       sampling, pcfg.forward_batch_size)
        mask = rollout.response_mask  # (B, T)
        t1 = time.perf_counter()

        # 4b. No-grad passes in large chunks: policy log-probs and values, reference log-probs, scores.
        with accelerator.autocast():
            logprobs, values = policy_and_values(model, rollout, pcfg.temperature, pcfg.forward_batch_size)  # (B, T) each
            ref_logprobs = rollout_logprobs(reference, rollout, pcfg.temperature, pcfg.forward_batch_size)  # (B, T)
            rm_scores = score_rollout(reward_model, rollout, pcfg.forward_batch_size)  # (B,)
        scores = apply_missing_eos_penalty(rm_scores, rollout.finished, pcfg.missing_eos_penalty)  # (B,)

        # 4c. Per-token rewards (KL penalty + score at the last token), GAE, whitened advantages.
        kl_coef = kl_controller.value
        rewards, kl = shape_rewards(scores, logprobs, ref_logprobs, mask, kl_coef)  # (B, T) each
        if pcfg.whiten_rewards:
            rewards = masked_whiten(rewards, mask, shift_mean=False)
        advantages, returns = gae_advantages(rewards, values, mask, pcfg.gamma, pcfg.lam)  # (B, T) each
        advantages = masked_whiten(advantages, mask)
        t2 = time.perf_counter()

        # 4d. PPO epochs over minibatches; micro-batches weighted by their share of the minibatch's tokens.
        model.train()
        generator = torch.Generator().manual_seed(cfg.run.seed * 1_000_003 + iteration * 101 + rank)
        stats: dict[str, list[torch.Tensor]] = {}
        kl_stopped = False
        for _ in range(pcfg.epochs):
            for minibatch in minibatch_indices(plan.local_batch, pcfg.num_minibatches, generator):
                minibatch = minibatch.to(device)
                minibatch = minibatch[torch.argsort(rollout.lengths[minibatch], stable=True)]  # similar lengths share a micro-batch
                weights = accumulation_weights(mask[minibatch], pcfg.micro_batch_size, "token")
                step_stats: dict[str, torch.Tensor] = {}
                for k, weight in enumerate(weights):
                    rows = minibatch[k * pcfg.micro_batch_size:(k + 1) * pcfg.micro_batch_size]
                    t = int(rollout.lengths[rows].max())  # columns past the longest row are padding
                    input_ids, micro_mask = rollout.input_ids[rows, :t], mask[rows, :t]  # (b, t) each
                    with accelerator.no_sync(model) if k < len(weights) - 1 else nullcontext():
                        logits, position_values = model(input_ids, rollout.attention_mask[rows, :t])
                        new_logprobs = shifted_logprobs(logits, input_ids, pcfg.temperature)  # (b, t)
                        new_values = align_values(position_values)  # (b, t)
                        pg_loss, pg_stats = ppo_policy_loss(new_logprobs, logprobs[rows, :t], advantages[rows, :t], micro_mask,
                                                            pcfg.clip, clip_high)
                        vf_loss, vf_stats = ppo_value_loss(new_values, values[rows, :t], returns[rows, :t], micro_mask, pcfg.value_clip)
                        with torch.set_grad_enabled(pcfg.entropy_coef > 0):
                            entropy = masked_mean(shifted_entropy(logits, pcfg.temperature), micro_mask)
                        loss = pg_loss + pcfg.vf_coef * vf_loss - pcfg.entropy_coef * entropy
                        if not torch.isfinite(loss):
                            raise UserError(f"ppo: non-finite loss at iteration {iteration + 1}; lower ppo.lr (last good checkpoint: {run.checkpoint_dir('ppo')})")
                        accelerator.backward(loss * weight)
                    micro_stats = {"train/loss": loss, "policy/approxkl": pg_stats["approxkl"], "policy/clipfrac": pg_stats["clipfrac"],
                                   "policy/ratio_mean": pg_stats["ratio_mean"], "val/loss": vf_loss, "val/clipfrac": vf_stats["clipfrac"],
                                   "val/value_mean": vf_stats["value_mean"], "objective/entropy": entropy}
                    for key, value in micro_stats.items():
                        step_stats[key] = step_stats.get(key, 0.0) + weight * value.detach().float()
                if pcfg.max_grad_norm > 0:
                    step_stats["train/grad_norm"] = accelerator.clip_grad_norm_(model.parameters(), pcfg.max_grad_norm).detach().float()
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
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

        # 4f. Metrics (means over processes), samples, checkpoint.
        lengths = rollout.response_lengths.float()
        non_score = -kl_coef * seq_kl  # (B,)
        local = {
            "objective/scores": scores.mean(), "objective/kl": seq_kl.mean(), "objective/non_score_reward": non_score.mean(),
            "objective/rlhf_reward": (scores + non_score).mean(), "val/explained_variance": explained_variance(values, returns, mask),
            "responses/length_mean": lengths.mean(), "responses/eos_rate": rollout.finished.float().mean(),
            "responses/unfinished": (~rollout.finished).float().sum(),
            "responses/length_score_corr": torch.tensor(pearson(lengths, scores)),
            "time/tokens_per_s": lengths.sum() / max(t1 - t0, 1e-9),
            **{key: torch.stack(values).mean() for key, values in stats.items()},
        }
        if cfg.data.path == "embedded":  # the gold judge on the training samples: over-optimisation shows here first
            gold = torch.tensor(gold_scores([train_prompts[i] for i in local_rows], rollout.texts(tokenizer)))
            local.update({"gold/score_mean": gold.mean(), "gold/good_rate": (gold == 1.0).float().mean()})
        metrics = {f"ppo/{key}": accelerator.reduce(value.float().to(device), reduction="mean").item() for key, value in local.items()}
        metrics.update({"ppo/objective/kl_coef": kl_coef, "ppo/policy/kl_stopped": float(kl_stopped), "ppo/train/lr": scheduler.get_last_lr()[0],
                        "ppo/time/generate_s": t1 - t0, "ppo/time/score_s": t2 - t1, "ppo/time/train_s": t3 - t2,
                        "ppo/memory/peak_mb": peak_memory_mb(device)[0], "ppo/train/episodes": iteration * pcfg.batch_size})
        logger.log(iteration, metrics, postfix=("ppo/objective/scores", "ppo/objective/kl"))
        if accelerator.is_main_process and pcfg.samples_every and (iteration % pcfg.samples_every == 0 or iteration == 1):
            n = pcfg.num_samples
            append_samples(run.stage("ppo") / "samples.jsonl", iteration, [train_prompts[i] for i in local_rows[:n]],
                           rollout.texts(tokenizer)[:n], scores[:n].tolist(), rollout.finished[:n].tolist(), cfg.data.path == "embedded")
        if pcfg.save_every and iteration % pcfg.save_every == 0 and iteration < plan.iterations:
            if accelerator.is_main_process:
                save_training_state(run.checkpoint_dir("ppo"), accelerator.unwrap_model(model), optimizer, scheduler,
                                    {"iteration": iteration, "fingerprint": fingerprint, "kl_coef": kl_controller.value})
            accelerator.wait_for_everyone()
    loop_s = time.perf_counter() - loop_start
    episodes_run = (iteration - resumed_from) * pcfg.batch_size
    peak_mb, peak_source = peak_memory_mb(device)
    unwrapped = accelerator.unwrap_model(model)
    state_mb = state_memory_mb([unwrapped, reference, reward_model], [optimizer])
    frozen_after = {"reference": weights_digest(reference), "reward": weights_digest(reward_model)}
    if frozen_after != frozen_before:
        raise RuntimeError(f"ppo: a frozen role changed during training: {frozen_before} -> {frozen_after}")

    # 5. Final policy vs SFT on held-out prompts: same sampling settings and seed for both.
    policy_eval = sample_for_eval(unwrapped.policy, tokenizer, eval_ids, sampling, cfg.run.seed, pcfg.forward_batch_size,
                                  reward_model, accelerator, reference=reference)
    sft_eval = sample_for_eval(reference, tokenizer, eval_ids, sampling, cfg.run.seed, pcfg.forward_batch_size, reward_model, accelerator)
    results = compare_with_sft(eval_prompts, policy_eval, sft_eval, gold=cfg.data.path == "embedded")
    results.update({
        "iterations": iteration, "episodes": iteration * pcfg.batch_size, "resumed_from_iteration": resumed_from,
        "final_kl_coef": kl_controller.value, "train_score_mean": metrics["ppo/objective/scores"] if resumed_from < iteration else None,
        "train_kl": metrics["ppo/objective/kl"] if resumed_from < iteration else None,
        "time_per_sample_ms": 1000 * loop_s / episodes_run if episodes_run else None,
        "peak_memory_mb": peak_mb, "peak_memory_source": peak_source, "state_memory_mb": state_mb,
        "frozen_roles_unchanged": True, "value_model": pcfg.value_model,
    })
    logger.log(iteration, {f"ppo/eval/{k}": v for k, v in results.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and v is not None})

    # 6. Publish: the HF policy, evaluation samples, curves, summary; then mark complete.
    if accelerator.is_main_process:
        save_pretrained_atomic(unwrapped.policy, tokenizer, run.model_dir("ppo"))
        write_jsonl(run.stage("ppo") / "eval_samples.jsonl", eval_rows(eval_prompts, policy_eval, sft_eval))
        plot_training_curves(logger.history, CURVES, run.stage("ppo") / "curves.png", "PPO")
        write_json_atomic(run.stage("ppo") / "results.json", results)
        run.update_summary({"ppo": results, "timing_s": {"ppo": round(time.perf_counter() - t_start, 2)}})
        run.mark_complete("ppo", cfg, {"iterations": iteration})
    logger.close()
    accelerator.wait_for_everyone()
    line = f"[ppo] RM score {results['reward_mean']:+.3f} (SFT {results['sft_reward_mean']:+.3f}), KL to ref {results['kl_to_ref']:.2f} nats"
    if "gold_score_mean" in results:
        line += (f"; gold {results['gold_score_mean']:.3f} (SFT {results['sft_gold_score_mean']:.3f}), "
                 f"gold win rate vs SFT {results['gold_win_rate_vs_sft']:.3f}")
    accelerator.print(line)


if __name__ == "__main__":
    run_stage(main)
