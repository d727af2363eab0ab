"""Stage `grpo`: align the SFT policy to the reward model (or reward functions) with group-relative
policy optimisation.

    python part2_ppo_grpo/train_grpo.py --preset tiny [grpo.reward=rlhf.task:gold_rewards] [grpo.eval_every=4]

Reads `<run>/data/` (prompts), `<run>/sft/model/` (policy init, reference) and `<run>/reward/model/`
(frozen reward model). Writes `<run>/grpo/model/` in Hugging Face format, samples.jsonl,
eval_samples.jsonl (final policy vs SFT on held-out prompts), curves.png, metrics.jsonl, and
`grpo.*` / `timing_s.grpo` in summary.json. Metric keys are defined in rlhf/rl/__init__.py.

The training score comes from `grpo.reward` (rlhf/rewards.py): the reward model by default, or
Python reward functions (DeepSeekMath's rule-based rewards; the embedded task's gold judge is
`rlhf.task:gold_rewards`), or a weighted sum. The reward model is loaded either way: it scores
every held-out evaluation. `grpo.eval_every` > 0 evaluates the policy on the held-out prompts along
training as well, measuring its KL to the SFT policy even when training uses no reference.

GRPO (DeepSeekMath, Shao et al. 2024, arXiv 2402.03300), with its variants as options:
- sample G = `grpo.group_size` responses per prompt and score them with `grpo.reward` (a
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

import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from tqdm.auto import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlhf, even under another clone's .venv

from rlhf.cli import run_stage, start_stage
from rlhf.engines import build_engine, check_engine
from rlhf.errors import UserError
from rlhf.evaluation import sequence_kl
from rlhf.group_rows import check_packable
from rlhf.lora import load_trainable_policy, reference_policy
from rlhf.losses import grpo_loss
from rlhf.models import load_reward_model, load_tokenizer
from rlhf.ops import group_advantages, masked_mean, masked_moments, moments_mean_var
from rlhf.rewards import load_reward_source
from rlhf.rl.checkpoints import load_rl_checkpoint, open_rl_logger, save_rl_checkpoint
from rlhf.rl.held_out import append_samples, eval_due, eval_metrics, evaluate_against_sft, held_out_eval
from rlhf.rl.passes import mean_process_units, micro_batches, minibatch_indices, policy_token_pass
from rlhf.rl.plan import check_context, check_group_packing, check_grpo_config, context_size, plan_rl, set_cpu_threads
from rlhf.rl.prompts import load_rl_prompts
from rlhf.rl.publish import publish_rl
from rlhf.rl.roles import check_frozen, frozen, frozen_digests
from rlhf.rl.sampling import engine_mismatch_metrics, importance_weights, sample_train_batch
from rlhf.rl.shaping import apply_missing_eos_penalty
from rlhf.rl.stats import flat_reward_warning, gold_metrics, loop_costs, peak_memory_mb, response_metrics
from rlhf.rollout import SamplingConfig, eval_sampling, rollout_logprobs, score_rollout
from rlhf.run import stage_seed
from rlhf.sharding import prepare_trained_model
from rlhf.signals import checkpoint_due
from rlhf.training import build_optimizer, build_scheduler, make_accelerator, optimizer_step

CURVES = [
    "grpo/objective/scores",
    "grpo/gold/score_mean",
    "grpo/objective/kl",
    "grpo/objective/entropy",
    "grpo/objective/zero_std_groups",
    "grpo/responses/length_mean",
    "grpo/responses/eos_rate",
    "grpo/policy/clipfrac",
    "grpo/policy/approxkl",
    "grpo/policy/k3_kl",
    "grpo/responses/length_score_corr",
    "grpo/rollout/mismatch_kl",
    "grpo/train/loss",
    "grpo/train/grad_norm",
]
EVAL_CURVES = [
    "grpo/eval/reward_mean",
    "grpo/eval/gold_score_mean",
    "grpo/eval/kl_to_ref",
]  # drawn when grpo.eval_every > 0


def main(argv: list[str] | None = None) -> None:
    started = start_stage("grpo", argv, requires=("reward",), check=lambda cfg: check_grpo_config(cfg.grpo))
    if started is None:
        return
    cfg, run = started
    seed = stage_seed(cfg, "grpo")  # run.method_seed when set (part4_eval/seeds.py)
    gcfg = cfg.grpo
    gold = cfg.data.path == "embedded"  # the embedded task has a gold judge
    t_start = time.perf_counter()

    # 1. Reward source, prompts and batch-size rules (whole groups per process), checked before any model is loaded.
    reward_source = load_reward_source("grpo", gcfg.reward)
    accelerator = make_accelerator(cfg, "grpo")
    tokenizer = load_tokenizer(run.model_dir("sft"))
    prompts = load_rl_prompts("grpo", run, cfg, tokenizer, gcfg.eval_prompts)
    plan = plan_rl("grpo", gcfg, accelerator.num_processes, len(prompts.train_ids), gcfg.group_size)
    check_group_packing(plan, gcfg)
    context = context_size(run.model_dir("sft"))
    check_context("grpo", prompts.longest, gcfg.max_new_tokens, context)
    validation = eval_sampling(cfg)  # held-out checks decode as the test does (rlhf.rollout.eval_sampling)
    check_context("eval", prompts.longest, validation.max_new_tokens, context)
    sampling = SamplingConfig(gcfg.max_new_tokens, gcfg.temperature, gcfg.top_p, gcfg.top_k)
    clip_high = gcfg.clip if gcfg.clip_high is None else gcfg.clip_high
    device, rank, G = accelerator.device, accelerator.process_index, gcfg.group_size
    on_policy = gcfg.epochs == 1 and gcfg.num_minibatches == 1  # old log-probs = new ones, detached
    packing = G if gcfg.pack_groups else 1  # rows per forward row: a group's G responses share one prompt pass
    set_cpu_threads("grpo", gcfg.cpu_threads, device)
    check_engine(cfg.rollout, "grpo")

    # 2. Roles: a trainable policy and a frozen reward model (it scores the held-out evaluations even
    #    when functions give the training score); a frozen reference only when beta > 0. Without one,
    #    periodic evaluation still needs the SFT policy to measure KL against.
    #    With LoRA, the reference is the policy with its adapters disabled.
    policy = load_trainable_policy(run.model_dir("sft"), cfg.model.lora.for_stage("grpo"))
    reward_model = frozen(load_reward_model(run.model_dir("reward")), device)
    if gcfg.pack_groups:
        check_packable(policy.config, "grpo")
    reference = reference_policy(policy, run.model_dir("sft"), device) if gcfg.kl_coef > 0 else None
    eval_reference = (
        reference
        if reference is not None or gcfg.eval_every == 0
        else reference_policy(policy, run.model_dir("sft"), device)
    )
    frozen_roles = {
        "reward": reward_model,
        "reference": reference,
        "eval_reference": eval_reference if reference is None else None,
    }
    frozen_before = frozen_digests(frozen_roles)
    policy, optimizer, whole = prepare_trained_model(accelerator, policy, lambda m: build_optimizer(m, gcfg))
    scheduler = build_scheduler(optimizer, gcfg, plan.optimizer_steps)
    engine = build_engine(cfg.rollout, "grpo", run.model_dir("sft"), tokenizer, accelerator, gcfg.forward_batch_size)
    accelerator.print(
        f"[grpo] {plan.iterations} iterations x {plan.prompts_per_iteration} prompts x G={G}; policy "
        f"{sum(p.numel() for p in policy.parameters()) / 1e6:.2f}M parameters; reference "
        f"{'loaded' if reference is not None else 'not loaded (kl_coef=0)'}"
        f"{'; SFT policy loaded for evaluation' if reference is None and eval_reference is not None else ''}"
    )

    # 3. Resume from the last checkpoint written for this same config, if any.
    state = load_rl_checkpoint("grpo", run, cfg, accelerator, policy, optimizer, scheduler, plan.iterations)
    iteration = resumed_from = 0 if state is None else state["iteration"]
    logger = open_rl_logger("grpo", run, cfg, accelerator, iteration, plan.iterations)

    eval_s = 0.0  # seconds of held-out evaluation inside the loop, left out of its per-sample cost

    def evaluate_now() -> dict[str, float]:
        """The current policy on the held-out prompts (RM score, gold score, KL to SFT), logged as grpo/eval/*."""
        nonlocal eval_s
        started = time.perf_counter()
        measured = held_out_eval(
            "grpo",
            engine,
            whole.of(policy),
            eval_reference,
            reward_model,
            tokenizer,
            prompts,
            validation,
            seed,
            gcfg.forward_batch_size,
            accelerator,
            gold,
        )
        seconds = time.perf_counter() - started
        eval_s += seconds
        return {**measured, "grpo/time/eval_s": seconds}

    loop_start = time.perf_counter()
    if iteration == 0 and eval_due(0, gcfg.eval_every, plan.iterations):
        logger.log(0, evaluate_now())  # the SFT policy: the origin of the reward-vs-KL curve
    metrics: dict[str, float] = {}
    zero_std_shares: list[float] = []  # per iteration of this run, for flat_reward_warning

    # 4. Iterations: G samples per prompt, group-relative advantages, clipped updates.
    while iteration < plan.iterations:
        # 4a. Rollouts from the current weights: each prompt repeated G times, consecutive rows forming its group,
        #     whole groups on one process.
        t0 = time.perf_counter()
        local_rows, rollout = sample_train_batch(
            engine,
            whole.of(policy),
            prompts,
            plan.prompts_per_iteration,
            iteration,
            seed,
            accelerator,
            sampling,
            G,
        )
        mask = rollout.response_mask  # (N, T)
        t1 = time.perf_counter()

        # 4b. No-grad passes: old log-probs (only off-policy), reference log-probs (only beta > 0), scores
        #     (reward model only when the reward spec uses it; functions score the decoded text).
        batch_prompts, responses = [prompts.train_texts[i] for i in local_rows], rollout.texts(tokenizer)
        with accelerator.autocast():
            logprobs = (
                None
                if on_policy
                else rollout_logprobs(policy, rollout, gcfg.temperature, gcfg.forward_batch_size, packing)
            )  # (N, T)
            ref_logprobs = (
                None
                if reference is None
                else rollout_logprobs(reference, rollout, gcfg.temperature, gcfg.forward_batch_size, packing)
            )
            rm_scores = (
                score_rollout(reward_model, rollout, gcfg.forward_batch_size, group_size=packing)
                if reward_source.uses_model
                else None
            )  # (N,)
        raw_scores, reward_terms = reward_source.score(batch_prompts, responses, rm_scores)  # (N,), {term: (N,)}
        scores = apply_missing_eos_penalty(raw_scores.to(device), rollout.finished, gcfg.missing_eos_penalty)  # (N,)

        # 4c. Group-relative advantages (DeepSeekMath section 4.1.2; Dr. GRPO without the std).
        advantages, zero_std = group_advantages(scores, G, scale=gcfg.scale_rewards)  # (N,), (N / G,)
        t2 = time.perf_counter()

        # 4d. Epochs over minibatches; micro-batches weighted to reproduce the chosen normalisation over all processes.
        policy.train()
        generator = torch.Generator().manual_seed(seed * 1_000_003 + iteration * 101 + rank)
        seen_logprobs = torch.zeros_like(mask, dtype=torch.float32) if on_policy else logprobs  # for the KL metric
        stats: dict[str, list[torch.Tensor]] = {}
        for _ in range(gcfg.epochs):
            for minibatch in minibatch_indices(plan.local_batch, gcfg.num_minibatches, generator, packing):
                units = mean_process_units(accelerator, mask[minibatch], gcfg.loss_normalization)
                # Token-mean metrics weigh a micro-batch by its share of the minibatch's tokens on all processes
                # (times their number, as the loss weights), whatever the loss normalisation: so they are the
                # minibatch's token means, not depending on which rows share a micro-batch.
                token_units = (
                    units
                    if gcfg.loss_normalization == "token"
                    else mean_process_units(accelerator, mask[minibatch], "token")
                )
                micro = micro_batches(
                    minibatch.to(device),
                    rollout.lengths,
                    mask,
                    plan.micro_batch_size,
                    gcfg.loss_normalization,
                    units,
                    packing,
                )
                step_stats: dict[str, torch.Tensor] = {}
                for k, (rows, t, weight) in enumerate(micro):
                    micro_mask = mask[rows, :t]  # (b, t)
                    with accelerator.no_sync(policy) if k < len(micro) - 1 else nullcontext():
                        new_logprobs, token_entropy = policy_token_pass(
                            policy, rollout, rows, gcfg.temperature, packing
                        )  # (b, t) each
                        old_logprobs = new_logprobs.detach() if on_policy else logprobs[rows, :t]
                        weights = importance_weights(rollout, old_logprobs, rows, t, cfg.rollout.tis_cap)
                        loss, loss_stats = grpo_loss(
                            new_logprobs,
                            old_logprobs,
                            None if ref_logprobs is None else ref_logprobs[rows, :t],
                            advantages[rows],
                            micro_mask,
                            gcfg.clip,
                            clip_high,
                            gcfg.kl_coef,
                            gcfg.loss_normalization,
                            weights,
                        )
                        if not torch.isfinite(loss):
                            raise UserError(
                                f"grpo: non-finite loss at iteration {iteration + 1}; lower grpo.lr "
                                f"(last good checkpoint: {run.checkpoint_dir('grpo')})"
                            )
                        accelerator.backward(loss * weight)
                    if on_policy:
                        seen_logprobs[rows, :t] = torch.where(micro_mask, new_logprobs.detach(), 0.0)
                    token_weight = float(micro_mask.sum()) / token_units if token_units else 0.0
                    micro_stats = {  # (value, weight): the loss as optimised, the others as token means
                        "train/loss": (loss, weight),
                        "policy/approxkl": (loss_stats["approxkl"], token_weight),
                        "policy/clipfrac": (loss_stats["clipfrac"], token_weight),
                        "policy/ratio_mean": (loss_stats["ratio_mean"], token_weight),
                        "policy/k3_kl": (loss_stats["kl"], token_weight),
                        "objective/entropy": (masked_mean(token_entropy, micro_mask), token_weight),
                    }
                    for key, (value, share) in micro_stats.items():
                        step_stats[key] = step_stats.get(key, 0.0) + share * value.detach().float()
                grad_norm = optimizer_step(accelerator, policy, optimizer, scheduler, gcfg.max_grad_norm)
                if grad_norm is not None:
                    step_stats["train/grad_norm"] = grad_norm
                for key, value in step_stats.items():
                    stats.setdefault(key, []).append(value)
        t3 = time.perf_counter()
        iteration += 1
        logger.advance()

        # 4e. Metrics (means over processes; variances and correlations over all rollouts), samples, checkpoint.
        advantage_moments = accelerator.reduce(masked_moments(advantages, torch.ones_like(mask[:, 0])), reduction="sum")
        local = {
            "objective/scores": scores.mean(),
            "objective/zero_std_groups": zero_std.float().mean(),
            "objective/advantage_std": moments_mean_var(advantage_moments)[1].sqrt(),
            **response_metrics(*accelerator.gather((rollout.response_lengths, rollout.finished, scores)), t1 - t0),
            **{key: torch.stack(values).mean() for key, values in stats.items()},
            **{f"reward/{name}": term.mean() for name, term in reward_terms.items()},
            **engine_mismatch_metrics(rollout, seen_logprobs),  # the engine's log-probs vs the trainer's
        }
        if gold:  # the gold judge on the training samples: over-optimisation shows here first
            local.update(gold_metrics(batch_prompts, responses))
        if ref_logprobs is not None:
            local["objective/kl"] = sequence_kl(seen_logprobs, ref_logprobs, mask).mean()
        metrics = {
            f"grpo/{key}": accelerator.reduce(value.float().to(device), reduction="mean").item()
            for key, value in local.items()
        }
        metrics.update(
            {
                "grpo/train/lr": scheduler.get_last_lr()[0],
                "grpo/time/generate_s": t1 - t0,
                "grpo/time/score_s": t2 - t1,
                "grpo/time/train_s": t3 - t2,
                "grpo/memory/peak_mb": peak_memory_mb(device)[0],
                "grpo/train/episodes": iteration * gcfg.batch_size,
            }
        )
        logger.log(iteration, metrics, postfix=("grpo/objective/scores", "grpo/objective/zero_std_groups"))
        zero_std_shares.append(metrics["grpo/objective/zero_std_groups"])
        if accelerator.is_main_process and (warning := flat_reward_warning(zero_std_shares, reward_source.spec, G)):
            tqdm.write(warning, file=sys.stderr)
        if eval_due(
            iteration, gcfg.eval_every, plan.iterations
        ):  # before the checkpoint, so a resumed run has this row
            logger.log(iteration, evaluate_now())
        if (
            accelerator.is_main_process
            and gcfg.samples_every
            and (iteration % gcfg.samples_every == 0 or iteration == 1)
        ):
            n = gcfg.num_samples
            append_samples(
                run.stage("grpo") / "samples.jsonl",
                iteration,
                batch_prompts[:n],
                responses[:n],
                scores[:n].tolist(),
                rollout.finished[:n].tolist(),
                gold,
            )
        if checkpoint_due(accelerator, gcfg.save_every, iteration, plan.iterations):
            save_rl_checkpoint("grpo", run, cfg, accelerator, policy, optimizer, scheduler, iteration)
    unwrapped = whole.of(policy)
    costs = loop_costs(
        time.perf_counter() - loop_start - eval_s,
        (iteration - resumed_from) * gcfg.batch_size,
        device,
        [unwrapped, reward_model] + ([eval_reference] if eval_reference is not None else []),
        [optimizer],
    )
    check_frozen("grpo", frozen_roles, frozen_before)

    # 5. Final policy vs SFT on held-out prompts: the test's decoding and the same seed for both. The SFT
    #    policy is loaded now if nothing loaded it yet (peak memory was read above).
    sft_policy = (
        eval_reference if eval_reference is not None else reference_policy(unwrapped, run.model_dir("sft"), device)
    )
    results, eval_samples = evaluate_against_sft(
        engine,
        unwrapped,
        sft_policy,
        reward_model,
        tokenizer,
        prompts,
        validation,
        seed,
        gcfg.forward_batch_size,
        accelerator,
        gold,
    )
    trained = resumed_from < iteration
    results.update(
        {
            "iterations": iteration,
            "episodes": iteration * gcfg.batch_size,
            "resumed_from_iteration": resumed_from,
            "group_size": G,
            "reference_loaded_for_training": reference is not None,
            "reward_source": reward_source.spec,
            "train_score_mean": metrics.get("grpo/objective/scores") if trained else None,
            "train_zero_std_groups": metrics.get("grpo/objective/zero_std_groups") if trained else None,
            **costs,
            "frozen_roles_unchanged": True,
        }
    )
    logger.log(iteration, eval_metrics("grpo", results))

    # 6. Publish: the HF policy, evaluation samples, curves, summary; then mark complete.
    publish_rl(
        "grpo",
        run,
        cfg,
        accelerator,
        logger,
        unwrapped,
        tokenizer,
        results,
        eval_samples,
        CURVES + (EVAL_CURVES if gcfg.eval_every else []),
        t_start,
        {"iterations": iteration},
    )


if __name__ == "__main__":
    run_stage(main)
