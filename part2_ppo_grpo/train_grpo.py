"""Stage `grpo`: align the SFT policy to the reward model (or reward functions) with group-relative
policy optimisation.

    python part2_ppo_grpo/train_grpo.py --preset tiny [grpo.reward=rlhf.task:gold_rewards] [grpo.eval_every=4]

Reads `<run>/data/` (prompts), `<run>/sft/model/` (policy init, reference) and `<run>/reward/model/`
(frozen reward model). Writes `<run>/grpo/model/` in Hugging Face format, samples.jsonl,
eval_samples.jsonl (final policy vs SFT on held-out prompts), curves.png, metrics.jsonl, and
`grpo.*` / `timing_s.grpo` in summary.json. Metric keys are defined in rlhf/online/__init__.py.

The training score comes from `grpo.reward` (rlhf/rollout/reward_spec.py): the reward model by default, or
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
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlhf, even under another clone's .venv

from rlhf.methods.rules import STAGE_RULES
from rlhf.stage.cli import answer_early, run_stage, start_stage

if __name__ == "__main__":
    answer_early("grpo", STAGE_RULES["grpo"])  # --help and config errors at once, before torch loads below

import torch
from tqdm.auto import tqdm

from rlhf.analysis.evaluation import sequence_kl
from rlhf.core.losses import grpo_loss
from rlhf.core.ops import group_advantages, masked_mean, masked_moments, moments_mean_var
from rlhf.core.stages import STAGES
from rlhf.loop.step import train_step
from rlhf.methods.passes import minibatch_indices, rollout_micro_batches
from rlhf.methods.plan import check_group_packing, plan_rl
from rlhf.models.lora import load_trainable_policy, reference_policy
from rlhf.models.modeling import load_reward_model
from rlhf.models.roles import frozen
from rlhf.models.training import build_optimizer
from rlhf.online.harness import OnlineStage
from rlhf.online.sampling import engine_mismatch_metrics, importance_weights
from rlhf.online.stats import flat_reward_warning
from rlhf.rollout.batch import SamplingConfig
from rlhf.rollout.forward import rollout_logprobs
from rlhf.rollout.layout import RowLayout
from rlhf.rollout.packing import check_packable

CURVES = list(STAGES["grpo"].curves)
EVAL_CURVES = list(STAGES["grpo"].eval_curves)  # drawn when grpo.eval_every > 0


def grpo_loss_fn(gcfg, layout: RowLayout, tis_cap: float | None, seen_logprobs: torch.Tensor | None = None):
    """GRPO's loss on a selection of rollouts (`Rollout.select`, carrying their advantages and old and reference
    log-probs): (policy, chunk) -> (loss, token-mean statistics). Without old log-probs (on-policy) the pass's own,
    detached, are the old ones, and are written into `seen_logprobs` (N, T) at the chunk's rows."""

    def loss_fn(policy, chunk):
        mask = chunk.response_mask  # (b, t)
        new_logprobs, token_entropy = layout.training_pass(policy, chunk, gcfg.temperature)  # (b, t) each
        old_logprobs = new_logprobs.detach() if chunk.old_logprobs is None else chunk.old_logprobs
        loss, loss_stats = grpo_loss(
            new_logprobs,
            old_logprobs,
            chunk.ref_logprobs,
            chunk.advantages,
            mask,
            gcfg.clip,
            gcfg.clip if gcfg.clip_high is None else gcfg.clip_high,
            gcfg.kl_coef,
            gcfg.loss_normalization,
            importance_weights(chunk, old_logprobs, tis_cap),
            gcfg.ratio_level,
        )
        if seen_logprobs is not None:
            seen_logprobs[chunk.rows, : mask.shape[1]] = torch.where(mask, new_logprobs.detach(), 0.0)
        return loss, {
            "policy/approxkl": loss_stats["approxkl"],
            "policy/clipfrac": loss_stats["clipfrac"],
            "policy/ratio_mean": loss_stats["ratio_mean"],
            "policy/k3_kl": loss_stats["kl"],
            "objective/entropy": masked_mean(token_entropy, mask),
        }

    return loss_fn


def main(argv: list[str] | None = None) -> None:
    started = start_stage("grpo", argv, requires=("reward",), check=STAGE_RULES["grpo"])
    if started is None:
        return
    cfg, run = started
    gcfg = cfg.grpo

    # 1. Reward source, prompts, context (rlhf.online.harness) and batch-size rules (whole groups per process),
    #    checked before any model is loaded.
    batch_size = gcfg.forward_batch_size  # rows per no-grad pass
    stage = OnlineStage("grpo", cfg, run, batch_size)
    accelerator, device, seed = stage.accelerator, stage.device, stage.seed
    plan = plan_rl("grpo", gcfg, accelerator.num_processes, len(stage.prompts.train_ids), gcfg.group_size)
    check_group_packing(plan, gcfg)
    sampling = SamplingConfig(gcfg.max_new_tokens, gcfg.temperature, gcfg.top_p, gcfg.top_k)
    G = gcfg.group_size
    on_policy = gcfg.epochs == 1 and gcfg.num_minibatches == 1  # old log-probs = new ones, detached
    layout = RowLayout(G if gcfg.pack_groups else 1)  # a packed group's G responses share one prompt pass

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
    policy, optimizer, scheduler = stage.prepare(
        policy, lambda m: build_optimizer(m, gcfg), plan.optimizer_steps, reward_model, frozen_roles, eval_reference
    )
    accelerator.print(
        f"[grpo] {plan.iterations} iterations x {plan.prompts_per_iteration} prompts x G={G}; policy "
        f"{sum(p.numel() for p in policy.parameters()) / 1e6:.2f}M parameters; reference "
        f"{'loaded' if reference is not None else 'not loaded (kl_coef=0)'}"
        f"{'; SFT policy loaded for evaluation' if reference is None and eval_reference is not None else ''}"
    )

    # 3. Resume from the last checkpoint written for this same config, if any.
    #    Before training: the SFT policy's held-out check.
    stage.resume(plan.iterations)
    metrics: dict[str, float] = {}
    zero_std_shares: list[float] = []  # per iteration of this run, for flat_reward_warning

    # 4. Iterations: G samples per prompt, group-relative advantages, clipped updates.
    while stage.iteration < plan.iterations:
        # 4a. Rollouts from the current weights: each prompt repeated G times, consecutive rows forming its group,
        #     whole groups on one process.
        t0 = time.perf_counter()
        local_rows, rollout = stage.sample(plan.prompts_per_iteration, sampling, G)
        mask = rollout.response_mask  # (N, T)
        t1 = time.perf_counter()

        # 4b. No-grad passes: old log-probs (only off-policy), reference log-probs (only beta > 0); the score.
        with accelerator.autocast():
            old_logprobs = (
                None if on_policy else rollout_logprobs(policy, rollout, gcfg.temperature, batch_size, layout)
            )  # (N, T)
            ref_logprobs = (
                None
                if reference is None
                else rollout_logprobs(reference, rollout, gcfg.temperature, batch_size, layout)
            )
        scored = stage.score(rollout, local_rows, batch_size, layout)
        scores = scored.scores  # (N,)

        # 4c. Group-relative advantages (DeepSeekMath section 4.1.2; Dr. GRPO without the std; RLOO's baseline),
        #     carried with the rollouts from here on.
        advantages, zero_std = group_advantages(
            scores, G, scale=gcfg.scale_rewards, leave_one_out=gcfg.baseline == "leave_one_out"
        )  # (N,), (N / G,)
        rollout = replace(
            rollout, old_logprobs=old_logprobs, ref_logprobs=ref_logprobs, advantages=advantages, scores=scores
        )
        t2 = time.perf_counter()

        # 4d. Epochs over minibatches; micro-batches weighted to reproduce the chosen normalisation over all
        #     processes, their metrics weighted by their share of the minibatch's tokens (`rollout_micro_batches`).
        generator = torch.Generator().manual_seed(seed * 1_000_003 + stage.iteration * 101 + accelerator.process_index)
        seen_logprobs = torch.zeros_like(mask, dtype=torch.float32) if on_policy else old_logprobs  # for the KL metric
        loss_fn = grpo_loss_fn(gcfg, layout, cfg.rollout.tis_cap, seen_logprobs if on_policy else None)
        stats: dict[str, list[torch.Tensor]] = {}
        for _ in range(gcfg.epochs):
            for minibatch in minibatch_indices(plan.local_batch, gcfg.num_minibatches, generator, layout):
                micro = rollout_micro_batches(
                    accelerator,
                    minibatch.to(device),
                    rollout,
                    plan.micro_batch_size,
                    gcfg.loss_normalization,
                    layout,
                    gcfg.micro_batch_tokens,
                )
                step_stats = train_step(
                    "grpo",
                    run,
                    f"iteration {stage.iteration + 1}",
                    accelerator,
                    policy,
                    optimizer,
                    scheduler,
                    micro,
                    loss_fn,
                    gcfg.max_grad_norm,
                )
                for key, value in step_stats.items():
                    stats.setdefault(key, []).append(value)
        t3 = time.perf_counter()
        iteration = stage.advance()

        # 4e. Metrics (means over processes; variances and correlations over all rollouts), samples, checkpoint.
        advantage_moments = accelerator.reduce(masked_moments(advantages, torch.ones_like(mask[:, 0])), reduction="sum")
        local = {
            "objective/scores": scores.mean(),
            "objective/zero_std_groups": zero_std.float().mean(),
            "objective/advantage_std": moments_mean_var(advantage_moments)[1].sqrt(),
            **stage.sample_metrics(rollout, scores, t1 - t0, scored.prompts, scored.responses),
            **{key: torch.stack(values).mean() for key, values in stats.items()},
            **{f"reward/{name}": term.mean() for name, term in scored.terms.items()},
            **engine_mismatch_metrics(rollout, seen_logprobs),  # the engine's log-probs vs the trainer's
        }
        if ref_logprobs is not None:
            local["objective/kl"] = sequence_kl(seen_logprobs, ref_logprobs, mask).mean()
        seconds = {"generate": t1 - t0, "score": t2 - t1, "train": t3 - t2}
        metrics = stage.metrics(local, seconds, iteration * gcfg.batch_size)
        zero_std_shares.append(metrics["grpo/objective/zero_std_groups"])
        if accelerator.is_main_process and (
            warning := flat_reward_warning(zero_std_shares, stage.reward_source.spec, G)
        ):
            tqdm.write(warning, file=sys.stderr)
        stage.end_iteration(
            metrics,
            ("grpo/objective/scores", "grpo/objective/zero_std_groups"),
            (scored.prompts, scored.responses, scores.tolist(), rollout.finished.tolist()),
        )

    # 5-6. Final policy vs SFT on held-out prompts (the test's decoding, the same seed for both); publish the HF
    #      policy, evaluation samples, curves and summary, then mark complete.
    summary = {
        "iterations": stage.iteration,
        "episodes": stage.iteration * gcfg.batch_size,
        "resumed_from_iteration": stage.resumed_from,
        "group_size": G,
        "reference_loaded_for_training": reference is not None,
        "reward_source": stage.reward_source.spec,
        "train_score_mean": metrics.get("grpo/objective/scores") if stage.trained else None,
        "train_zero_std_groups": metrics.get("grpo/objective/zero_std_groups") if stage.trained else None,
    }
    stage.finish(gcfg.batch_size, summary, CURVES + (EVAL_CURVES if gcfg.eval_every else []))


if __name__ == "__main__":
    run_stage(main)
