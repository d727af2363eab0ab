"""Stage `grpo`: align the SFT policy to the reward model with group-relative policy optimisation.

    python part2_ppo_grpo/train_grpo.py --preset tiny

Reads `<run>/data/` (prompts), `<run>/sft/model/` (policy init, reference) and `<run>/reward/model/`
(frozen reward model). Writes `<run>/grpo/model/` in Hugging Face format, samples.jsonl,
eval_samples.jsonl (final policy vs SFT on held-out prompts), curves.png, metrics.jsonl, and
`grpo.*` / `timing_s.grpo` in summary.json. Metric keys are defined in rlhf/rl.py.

GRPO (DeepSeekMath, Shao et al. 2024, arXiv 2402.03300), with its variants as options:
- sample G = `grpo.group_size` responses per prompt and score them with the reward model (a
  response without EOS loses `grpo.missing_eos_penalty`, as in PPO);
- advantage of each response = (r - group mean) / (group std + eps), the same for all its tokens;
  `grpo.scale_rewards=false` drops the std division (Dr. GRPO, arXiv 2503.20783);
- clipped surrogate; `grpo.clip_high` > `grpo.clip` is DAPO's clip-higher (arXiv 2503.14476);
- KL to the reference as the k3 estimator in the loss with coefficient beta = `grpo.kl_coef`;
  beta = 0 never loads a reference model during training;
- loss normalisation `grpo.loss_normalization`: "sequence" (1/|o| per response, DeepSeekMath) or
  "token" (over all tokens of the batch, DAPO);
- no value model. Groups whose rewards are all equal carry no signal; their share is logged.
With one epoch and one minibatch the update is on-policy: the old log-probs equal the new ones,
so no separate pass computes them (as TRL does).
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
from rlhf.losses import grpo_loss
from rlhf.models import load_policy, load_reward_model, load_tokenizer, position_ids_from_mask
from rlhf.ops import group_advantages, masked_mean
from rlhf.plots import plot_training_curves
from rlhf.rl import (
    accumulation_weights, append_samples, apply_missing_eos_penalty, check_context, check_gold_prompts, check_grpo_config,
    compare_with_sft, context_size, eval_rows, frozen, gold_scores, iteration_prompts, minibatch_indices, pearson,
    peak_memory_mb, plan_rl, sample_for_eval, sequence_kl, set_cpu_threads, shifted_entropy, shifted_logprobs,
    state_memory_mb, unique_prompts, weights_digest,
)
from rlhf.rollout import SamplingConfig, generate_rollout, rollout_logprobs, score_rollout
from rlhf.run import write_json_atomic
from rlhf.tracking import MetricLogger
from rlhf.training import build_optimizer, build_scheduler, make_accelerator

CURVES = ["grpo/objective/scores", "grpo/gold/score_mean", "grpo/objective/kl", "grpo/objective/entropy", "grpo/objective/zero_std_groups",
          "grpo/responses/length_mean", "grpo/responses/eos_rate", "grpo/policy/clipfrac", "grpo/policy/approxkl",
          "grpo/policy/k3_kl", "grpo/responses/length_score_corr", "grpo/train/loss", "grpo/train/grad_norm"]


def main(argv: list[str] | None = None) -> None:
    started = start_stage("grpo", argv, requires=("reward",), check=lambda cfg: check_grpo_config(cfg.grpo))
    if started is None:
        return
    cfg, run = started
    gcfg = cfg.grpo
    t_start = time.perf_counter()

    # 1. Prompts and batch-size rules (whole groups per process), checked before any model is loaded.
    accelerator = make_accelerator(cfg)
    tokenizer = load_tokenizer(run.model_dir("sft"))
    train_prompts = unique_prompts(read_jsonl(run.stage("data") / "train.jsonl"))
    eval_prompts = unique_prompts(read_jsonl(run.stage("data") / "val.jsonl"))[: gcfg.eval_prompts]
    train_ids = [ids[-cfg.data.max_prompt_tokens:] for ids in encode_texts(tokenizer, train_prompts)]
    eval_ids = [ids[-cfg.data.max_prompt_tokens:] for ids in encode_texts(tokenizer, eval_prompts)]
    if cfg.data.path == "embedded":
        check_gold_prompts("grpo", train_prompts, "data/train.jsonl")
        check_gold_prompts("grpo", eval_prompts, "data/val.jsonl")
    plan = plan_rl("grpo", gcfg, accelerator.num_processes, len(train_ids), gcfg.group_size)
    check_context("grpo", max(map(len, train_ids + eval_ids)), gcfg.max_new_tokens, context_size(run.model_dir("sft")))
    sampling = SamplingConfig(gcfg.max_new_tokens, gcfg.temperature, gcfg.top_p, gcfg.top_k)
    clip_high = gcfg.clip if gcfg.clip_high is None else gcfg.clip_high
    on_policy = gcfg.epochs == 1 and gcfg.num_minibatches == 1  # old log-probs = new ones, detached
    device, rank, G = accelerator.device, accelerator.process_index, gcfg.group_size
    set_cpu_threads("grpo", gcfg.cpu_threads, device)

    # 2. Roles: a trainable policy and a frozen reward model; a frozen reference only when beta > 0.
    policy = load_policy(run.model_dir("sft"))
    reward_model = frozen(load_reward_model(run.model_dir("reward")), device)
    reference = frozen(load_policy(run.model_dir("sft")), device) if gcfg.kl_coef > 0 else None
    frozen_before = {"reward": weights_digest(reward_model), **({"reference": weights_digest(reference)} if reference else {})}
    optimizer = build_optimizer(policy, gcfg)
    scheduler = build_scheduler(optimizer, gcfg, plan.optimizer_steps)
    policy, optimizer = accelerator.prepare(policy, optimizer)
    accelerator.print(f"[grpo] {plan.iterations} iterations x {plan.prompts_per_iteration} prompts x G={G}; policy "
                      f"{sum(p.numel() for p in policy.parameters()) / 1e6:.2f}M parameters; reference "
                      f"{'loaded' if reference is not None else 'not loaded (kl_coef=0)'}")

    # 3. Resume from the last checkpoint written for this same config, if any.
    fingerprint = run.fingerprint("grpo", cfg)
    iteration = 0
    state = load_training_state(run.checkpoint_dir("grpo"), accelerator.unwrap_model(policy), optimizer, scheduler)
    if state is not None and state.get("fingerprint") != fingerprint:
        raise UserError(f"{run.checkpoint_dir('grpo')} belongs to a different config; delete it or pass --force to start over")
    if state is not None:
        iteration = state["iteration"]
        accelerator.print(f"[grpo] resumed from iteration {iteration}/{plan.iterations}")
    resumed_from = iteration
    logger = MetricLogger("grpo", run.stage("grpo"), run.tensorboard_dir("grpo"), cfg, enabled=accelerator.is_main_process)
    logger.resume(iteration)
    logger.progress(plan.iterations, initial=iteration, desc="grpo")
    loop_start = time.perf_counter()
    metrics: dict[str, float] = {}

    # 4. Iterations: G samples per prompt, group-relative advantages, clipped updates.
    while iteration < plan.iterations:
        # 4a. Rollouts: each prompt repeated G times, consecutive rows forming its group.
        t0 = time.perf_counter()
        prompt_rows = iteration_prompts(len(train_ids), plan.prompts_per_iteration, iteration, cfg.run.seed)
        local_rows = [i for i in prompt_rows[rank * plan.local_prompts:(rank + 1) * plan.local_prompts] for _ in range(G)]
        policy.eval()
        with accelerator.autocast():
            rollout = generate_rollout(accelerator.unwrap_model(policy), tokenizer, [train_ids[i] for i in local_rows], sampling,
                                       gcfg.forward_batch_size)
        mask = rollout.response_mask  # (N, T)
        t1 = time.perf_counter()

        # 4b. No-grad passes: old log-probs (only off-policy), reference log-probs (only beta > 0), scores.
        with accelerator.autocast():
            logprobs = None if on_policy else rollout_logprobs(policy, rollout, gcfg.temperature, gcfg.forward_batch_size)  # (N, T)
            ref_logprobs = None if reference is None else rollout_logprobs(reference, rollout, gcfg.temperature, gcfg.forward_batch_size)
            rm_scores = score_rollout(reward_model, rollout, gcfg.forward_batch_size)  # (N,)
        scores = apply_missing_eos_penalty(rm_scores, rollout.finished, gcfg.missing_eos_penalty)  # (N,)

        # 4c. Group-relative advantages (DeepSeekMath section 4.1.2; Dr. GRPO without the std).
        advantages, zero_std = group_advantages(scores, G, scale=gcfg.scale_rewards)  # (N,), (N / G,)
        t2 = time.perf_counter()

        # 4d. Epochs over minibatches; micro-batches weighted to reproduce the chosen normalisation.
        policy.train()
        generator = torch.Generator().manual_seed(cfg.run.seed * 1_000_003 + iteration * 101 + rank)
        seen_logprobs = torch.zeros_like(mask, dtype=torch.float32) if on_policy else logprobs  # for the KL metric
        stats: dict[str, list[torch.Tensor]] = {}
        for _ in range(gcfg.epochs):
            for minibatch in minibatch_indices(plan.local_batch, gcfg.num_minibatches, generator):
                minibatch = minibatch.to(device)
                minibatch = minibatch[torch.argsort(rollout.lengths[minibatch], stable=True)]  # similar lengths share a micro-batch
                weights = accumulation_weights(mask[minibatch], gcfg.micro_batch_size, gcfg.loss_normalization)
                step_stats: dict[str, torch.Tensor] = {}
                for k, weight in enumerate(weights):
                    rows = minibatch[k * gcfg.micro_batch_size:(k + 1) * gcfg.micro_batch_size]
                    t = int(rollout.lengths[rows].max())  # columns past the longest row are padding
                    input_ids, micro_mask = rollout.input_ids[rows, :t], mask[rows, :t]  # (b, t) each
                    with accelerator.no_sync(policy) if k < len(weights) - 1 else nullcontext():
                        attention_mask = rollout.attention_mask[rows, :t]
                        logits = policy(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask),
                                        use_cache=False).logits  # (b, t, V)
                        new_logprobs = shifted_logprobs(logits, input_ids, gcfg.temperature)  # (b, t)
                        old_logprobs = new_logprobs.detach() if on_policy else logprobs[rows, :t]
                        loss, loss_stats = grpo_loss(new_logprobs, old_logprobs, None if ref_logprobs is None else ref_logprobs[rows, :t],
                                                     advantages[rows], micro_mask, gcfg.clip, clip_high, gcfg.kl_coef,
                                                     gcfg.loss_normalization)
                        if not torch.isfinite(loss):
                            raise UserError(f"grpo: non-finite loss at iteration {iteration + 1}; lower grpo.lr (last good checkpoint: {run.checkpoint_dir('grpo')})")
                        accelerator.backward(loss * weight)
                    if on_policy:
                        seen_logprobs[rows, :t] = torch.where(micro_mask, new_logprobs.detach(), 0.0)
                    with torch.no_grad():
                        entropy = masked_mean(shifted_entropy(logits.detach(), gcfg.temperature), micro_mask)
                    micro_stats = {"train/loss": loss, "policy/approxkl": loss_stats["approxkl"], "policy/clipfrac": loss_stats["clipfrac"],
                                   "policy/ratio_mean": loss_stats["ratio_mean"], "policy/k3_kl": loss_stats["kl"], "objective/entropy": entropy}
                    for key, value in micro_stats.items():
                        step_stats[key] = step_stats.get(key, 0.0) + weight * value.detach().float()
                if gcfg.max_grad_norm > 0:
                    step_stats["train/grad_norm"] = accelerator.clip_grad_norm_(policy.parameters(), gcfg.max_grad_norm).detach().float()
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                for key, value in step_stats.items():
                    stats.setdefault(key, []).append(value)
        t3 = time.perf_counter()
        iteration += 1
        logger.advance()

        # 4e. Metrics (means over processes), samples, checkpoint.
        lengths = rollout.response_lengths.float()
        local = {
            "objective/scores": scores.mean(), "objective/zero_std_groups": zero_std.float().mean(),
            "objective/advantage_std": advantages.std() if advantages.numel() > 1 else torch.zeros(()),
            "responses/length_mean": lengths.mean(), "responses/eos_rate": rollout.finished.float().mean(),
            "responses/unfinished": (~rollout.finished).float().sum(),
            "responses/length_score_corr": torch.tensor(pearson(lengths, scores)),
            "time/tokens_per_s": lengths.sum() / max(t1 - t0, 1e-9),
            **{key: torch.stack(values).mean() for key, values in stats.items()},
        }
        if cfg.data.path == "embedded":  # the gold judge on the training samples: over-optimisation shows here first
            gold = torch.tensor(gold_scores([train_prompts[i] for i in local_rows], rollout.texts(tokenizer)))
            local.update({"gold/score_mean": gold.mean(), "gold/good_rate": (gold == 1.0).float().mean()})
        if ref_logprobs is not None:
            local["objective/kl"] = sequence_kl(seen_logprobs, ref_logprobs, mask).mean()
        metrics = {f"grpo/{key}": accelerator.reduce(value.float().to(device), reduction="mean").item() for key, value in local.items()}
        metrics.update({"grpo/train/lr": scheduler.get_last_lr()[0], "grpo/time/generate_s": t1 - t0, "grpo/time/score_s": t2 - t1,
                        "grpo/time/train_s": t3 - t2, "grpo/memory/peak_mb": peak_memory_mb(device)[0],
                        "grpo/train/episodes": iteration * gcfg.batch_size})
        logger.log(iteration, metrics, postfix=("grpo/objective/scores", "grpo/objective/zero_std_groups"))
        if accelerator.is_main_process and gcfg.samples_every and (iteration % gcfg.samples_every == 0 or iteration == 1):
            n = gcfg.num_samples
            append_samples(run.stage("grpo") / "samples.jsonl", iteration, [train_prompts[i] for i in local_rows[:n]],
                           rollout.texts(tokenizer)[:n], scores[:n].tolist(), rollout.finished[:n].tolist(), cfg.data.path == "embedded")
        if gcfg.save_every and iteration % gcfg.save_every == 0 and iteration < plan.iterations:
            if accelerator.is_main_process:
                save_training_state(run.checkpoint_dir("grpo"), accelerator.unwrap_model(policy), optimizer, scheduler,
                                    {"iteration": iteration, "fingerprint": fingerprint})
            accelerator.wait_for_everyone()
    loop_s = time.perf_counter() - loop_start
    episodes_run = (iteration - resumed_from) * gcfg.batch_size
    peak_mb, peak_source = peak_memory_mb(device)
    unwrapped = accelerator.unwrap_model(policy)
    state_mb = state_memory_mb([unwrapped, reward_model] + ([reference] if reference is not None else []), [optimizer])
    frozen_after = {"reward": weights_digest(reward_model), **({"reference": weights_digest(reference)} if reference else {})}
    if frozen_after != frozen_before:
        raise RuntimeError(f"grpo: a frozen role changed during training: {frozen_before} -> {frozen_after}")

    # 5. Final policy vs SFT on held-out prompts: same sampling settings and seed for both. The SFT
    #    policy is loaded now if training ran without a reference (peak memory was read above).
    sft_policy = reference if reference is not None else frozen(load_policy(run.model_dir("sft")), device)
    policy_eval = sample_for_eval(unwrapped, tokenizer, eval_ids, sampling, cfg.run.seed, gcfg.forward_batch_size, reward_model,
                                  accelerator, reference=sft_policy)
    sft_eval = sample_for_eval(sft_policy, tokenizer, eval_ids, sampling, cfg.run.seed, gcfg.forward_batch_size, reward_model, accelerator)
    results = compare_with_sft(eval_prompts, policy_eval, sft_eval, gold=cfg.data.path == "embedded")
    trained = resumed_from < iteration
    results.update({
        "iterations": iteration, "episodes": iteration * gcfg.batch_size, "resumed_from_iteration": resumed_from,
        "group_size": G, "reference_loaded_for_training": reference is not None,
        "train_score_mean": metrics.get("grpo/objective/scores") if trained else None,
        "train_zero_std_groups": metrics.get("grpo/objective/zero_std_groups") if trained else None,
        "time_per_sample_ms": 1000 * loop_s / episodes_run if episodes_run else None,
        "peak_memory_mb": peak_mb, "peak_memory_source": peak_source, "state_memory_mb": state_mb, "frozen_roles_unchanged": True,
    })
    logger.log(iteration, {f"grpo/eval/{k}": v for k, v in results.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})

    # 6. Publish: the HF policy, evaluation samples, curves, summary; then mark complete.
    if accelerator.is_main_process:
        save_pretrained_atomic(unwrapped, tokenizer, run.model_dir("grpo"))
        write_jsonl(run.stage("grpo") / "eval_samples.jsonl", eval_rows(eval_prompts, policy_eval, sft_eval))
        plot_training_curves(logger.history, CURVES, run.stage("grpo") / "curves.png", "GRPO")
        write_json_atomic(run.stage("grpo") / "results.json", results)
        run.update_summary({"grpo": results, "timing_s": {"grpo": round(time.perf_counter() - t_start, 2)}})
        run.mark_complete("grpo", cfg, {"iterations": iteration})
    logger.close()
    accelerator.wait_for_everyone()
    line = f"[grpo] RM score {results['reward_mean']:+.3f} (SFT {results['sft_reward_mean']:+.3f}), KL to ref {results['kl_to_ref']:.2f} nats"
    if "gold_score_mean" in results:
        line += (f"; gold {results['gold_score_mean']:.3f} (SFT {results['sft_gold_score_mean']:.3f}), "
                 f"gold win rate vs SFT {results['gold_win_rate_vs_sft']:.3f}")
    accelerator.print(line)


if __name__ == "__main__":
    run_stage(main)
