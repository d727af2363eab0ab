"""Stage `raft`: align the SFT policy by reward-ranked fine-tuning.

    python part2_ppo_grpo/train_raft.py --preset tiny [raft.reward=rlhf.task:gold_rewards] [raft.top_k=2]

Reads `<run>/data/` (prompts), `<run>/sft/model/` (policy init, KL reference of the evaluations) and
`<run>/reward/model/` (frozen reward model). Writes `<run>/raft/model/` in Hugging Face format,
samples.jsonl (kept samples), eval_samples.jsonl (final policy vs SFT on held-out prompts),
curves.png, metrics.jsonl, and `raft.*` / `timing_s.raft` in summary.json. Metric keys are defined
in rlhf/raft.py and rlhf/rl/.

RAFT (Dong et al. 2023, arXiv 2304.06767, Algorithm 1). Each round:
1. sample N = `raft.samples_per_prompt` responses to each of `raft.prompts_per_round` training
   prompts from the current policy, at `raft.temperature`;
2. score them with `raft.reward` (rlhf/rewards.py: the reward model by default, reward functions,
   or a weighted sum, as `ppo.reward` and `grpo.reward`); a response without EOS loses
   `raft.missing_eos_penalty`, as in PPO and GRPO;
3. keep each prompt's `raft.top_k` best samples (1: best-of-N; rlhf/raft.py);
4. fine-tune the policy on the kept (prompt, response) pairs with the SFT loss on response tokens
   (`rlhf.training.sft_batch_loss`), `raft.epochs` passes in batches of `raft.batch_size`.
There is no reference model, KL penalty, critic or importance ratio in training: the policy moves
as far as fine-tuning on its own best samples takes it, and the held-out evaluations measure its KL
to the SFT policy. One optimizer and one learning-rate schedule run across all rounds.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from accelerate.utils import gather_object

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlhf, even under another clone's .venv

from rlhf.batching import collate_sequences
from rlhf.cli import run_stage, start_stage
from rlhf.engines import build_engine, check_engine
from rlhf.lora import load_trainable_policy, reference_policy
from rlhf.models import load_reward_model, load_tokenizer
from rlhf.raft import check_raft_config, kept_rows, plan_raft, tied_prompts
from rlhf.rewards import load_reward_source
from rlhf.rl.checkpoints import load_rl_checkpoint, open_rl_logger, save_rl_checkpoint
from rlhf.rl.held_out import append_samples, eval_due, eval_metrics, evaluate_against_sft, held_out_eval
from rlhf.rl.plan import check_context, context_size, set_cpu_threads
from rlhf.rl.prompts import load_rl_prompts
from rlhf.rl.publish import publish_rl
from rlhf.rl.roles import check_frozen, frozen, frozen_digests
from rlhf.rl.sampling import sample_train_batch
from rlhf.rl.shaping import apply_missing_eos_penalty
from rlhf.rl.stats import gold_metrics, loop_costs, peak_memory_mb, response_metrics
from rlhf.rollout import SamplingConfig, eval_sampling, score_rollout
from rlhf.run import stage_seed
from rlhf.sharding import prepare_trained_model
from rlhf.signals import checkpoint_due
from rlhf.training import build_optimizer, build_scheduler, epoch_order, make_accelerator, sft_batch_loss, train_step

CURVES = [
    "raft/objective/scores",
    "raft/selected/score_mean",
    "raft/gold/score_mean",
    "raft/selected/gold_score_mean",
    "raft/objective/tied_prompts",
    "raft/responses/length_mean",
    "raft/selected/length_mean",
    "raft/responses/eos_rate",
    "raft/responses/length_score_corr",
    "raft/train/loss",
    "raft/train/grad_norm",
]
EVAL_CURVES = [
    "raft/eval/reward_mean",
    "raft/eval/gold_score_mean",
    "raft/eval/kl_to_ref",
]  # drawn when raft.eval_every > 0


def main(argv: list[str] | None = None) -> None:
    started = start_stage("raft", argv, requires=("reward",), check=lambda cfg: check_raft_config(cfg.raft))
    if started is None:
        return
    cfg, run = started
    seed = stage_seed(cfg, "raft")  # run.method_seed when set (part4_eval/seeds.py)
    rcfg = cfg.raft
    gold = cfg.data.path == "embedded"  # the embedded task has a gold judge
    t_start = time.perf_counter()

    # 1. Reward source, prompts and derived sizes, checked before any model is loaded.
    reward_source = load_reward_source("raft", rcfg.reward)
    accelerator = make_accelerator(cfg, "raft")
    tokenizer = load_tokenizer(run.model_dir("sft"))
    prompts = load_rl_prompts("raft", run, cfg, tokenizer, rcfg.eval_prompts)
    plan = plan_raft(rcfg, accelerator.num_processes, len(prompts.train_ids))
    context = context_size(run.model_dir("sft"))
    check_context("raft", prompts.longest, rcfg.max_new_tokens, context)
    validation = eval_sampling(cfg)  # held-out checks decode as the test does (rlhf.rollout.eval_sampling)
    check_context("eval", prompts.longest, validation.max_new_tokens, context)
    sampling = SamplingConfig(rcfg.max_new_tokens, rcfg.temperature)
    device, rank, N = accelerator.device, accelerator.process_index, rcfg.samples_per_prompt
    finetune = plan.finetune  # one round's fine-tuning
    set_cpu_threads("raft", rcfg.cpu_threads, device)
    check_engine(cfg.rollout, "raft")

    # 2. Roles: a trainable policy and a frozen reward model (it scores the held-out evaluations even
    #    when functions rank the samples). The SFT policy, to measure KL against, only when evaluating
    #    along training; the final evaluation loads it otherwise.
    #    With LoRA, the SFT policy is the policy with its adapters disabled.
    policy = load_trainable_policy(run.model_dir("sft"), cfg.model.lora.for_stage("raft"))
    reward_model = frozen(load_reward_model(run.model_dir("reward")), device)
    sft_policy = reference_policy(policy, run.model_dir("sft"), device) if rcfg.eval_every else None
    frozen_roles = {"reward": reward_model, "sft": sft_policy}
    frozen_before = frozen_digests(frozen_roles)
    policy, optimizer, whole = prepare_trained_model(accelerator, policy, lambda m: build_optimizer(m, rcfg))
    scheduler = build_scheduler(optimizer, rcfg, plan.optimizer_steps)
    engine = build_engine(cfg.rollout, "raft", run.model_dir("sft"), tokenizer, accelerator, rcfg.eval_batch_size)
    accelerator.print(
        f"[raft] {rcfg.rounds} rounds x {rcfg.prompts_per_round} prompts x N={N}, top {rcfg.top_k} kept: "
        f"{finetune.total_steps} optimizer steps per round; policy "
        f"{sum(p.numel() for p in policy.parameters()) / 1e6:.2f}M parameters"
    )

    # 3. Resume from the last checkpoint written for this same config, if any (taken between rounds).
    state = load_rl_checkpoint("raft", run, cfg, accelerator, policy, optimizer, scheduler, rcfg.rounds)
    round_index = resumed_from = 0 if state is None else state["iteration"]
    logger = open_rl_logger("raft", run, cfg, accelerator, round_index, rcfg.rounds)

    eval_s = 0.0  # seconds of held-out evaluation inside the loop, left out of its per-sample cost

    def evaluate_now() -> dict[str, float]:
        """The current policy on the held-out prompts (RM score, gold score, KL to SFT), logged as raft/eval/*."""
        nonlocal eval_s
        started = time.perf_counter()
        measured = held_out_eval(
            "raft",
            engine,
            whole.of(policy),
            sft_policy,
            reward_model,
            tokenizer,
            prompts,
            validation,
            seed,
            rcfg.eval_batch_size,
            accelerator,
            gold,
        )
        seconds = time.perf_counter() - started
        eval_s += seconds
        return {**measured, "raft/time/eval_s": seconds}

    loop_start = time.perf_counter()
    if round_index == 0 and eval_due(0, rcfg.eval_every, rcfg.rounds):
        logger.log(0, evaluate_now())  # the SFT policy: the origin of the reward-vs-KL curve
    metrics: dict[str, float] = {}

    # 4. Rounds: sample N per prompt, keep the best, fine-tune on them.
    while round_index < rcfg.rounds:
        # 4a. Samples from the current policy: each prompt repeated N times, prompt p's in rows p*N .. p*N + N-1,
        #     whole prompts on one process.
        t0 = time.perf_counter()
        local_rows, rollout = sample_train_batch(
            engine,
            whole.of(policy),
            prompts,
            rcfg.prompts_per_round,
            round_index,
            seed,
            accelerator,
            sampling,
            N,
        )
        t1 = time.perf_counter()

        # 4b. Scores (the reward model only when the reward spec uses it; functions score the decoded text).
        batch_prompts, responses = [prompts.train_texts[i] for i in local_rows], rollout.texts(tokenizer)
        with accelerator.autocast():
            rm_scores = (
                score_rollout(reward_model, rollout, rcfg.eval_batch_size) if reward_source.uses_model else None
            )  # (P*N,)
        raw_scores, reward_terms = reward_source.score(batch_prompts, responses, rm_scores)  # (P*N,), {term: (P*N,)}
        scores = apply_missing_eos_penalty(raw_scores.to(device), rollout.finished, rcfg.missing_eos_penalty)  # (P*N,)

        # 4c. Ranking: each prompt's top_k samples (Dong et al. 2023, Algorithm 1, step 2). A prompt's N samples
        #     are on one process, so ranking them there keeps what ranking the whole round would.
        kept = kept_rows(scores.view(-1, N), rcfg.top_k)  # (P*k,) rows of the batch
        kept_rollout, kept_scores = rollout.select(kept), scores[kept]  # P*k rows; (P*k,)
        # (prompt ids, response ids with EOS when it has one) of every process's kept samples, in the round's
        # prompt order: the global rows one process would fine-tune on.
        kept_pairs = gather_object(
            list(zip([prompts.train_ids[local_rows[row]] for row in kept.tolist()], kept_rollout.response_ids()))
        )
        t2 = time.perf_counter()

        # 4d. Fine-tuning on the kept pairs with the SFT loss, in length-grouped batches, each process its slice of
        #     a global batch (as `rlhf.training.fit`); the data order is a function of (seed, round, epoch), so a
        #     resumed run trains on what an uninterrupted one would.
        lengths = [len(p) + len(r) for p, r in kept_pairs]
        train_stats: dict[str, list[torch.Tensor]] = {}
        for step_in_round in range(finetune.total_steps):
            epoch, position = divmod(step_in_round, finetune.steps_per_epoch)
            order = epoch_order(
                lengths, seed, round_index * plan.epochs_per_round + epoch, rcfg.batch_size, rcfg.group_by_length
            )
            micro_batches = [
                collate_sequences(
                    [kept_pairs[i][0] for i in rows], [kept_pairs[i][1] for i in rows], tokenizer.pad_token_id
                )
                for rows in finetune.micro_rows(order, position, rank)
            ]
            step_stats = train_step(
                "raft",
                run,
                round_index * finetune.total_steps + step_in_round,
                accelerator,
                policy,
                optimizer,
                scheduler,
                micro_batches,
                sft_batch_loss,
                rcfg.max_grad_norm,
            )
            for key, value in step_stats.items():
                train_stats.setdefault(key, []).append(value)
        t3 = time.perf_counter()
        round_index += 1
        logger.advance()

        # 4e. Metrics (means over processes), kept samples, checkpoint.
        kept_prompts, kept_responses = [batch_prompts[row] for row in kept.tolist()], kept_rollout.texts(tokenizer)
        local = {
            "objective/scores": scores.mean(),
            "objective/tied_prompts": tied_prompts(scores.view(-1, N)).float().mean(),
            "selected/score_mean": kept_scores.mean(),
            "selected/length_mean": kept_rollout.response_lengths.float().mean(),
            "selected/eos_rate": kept_rollout.finished.float().mean(),
            **response_metrics(*accelerator.gather((rollout.response_lengths, rollout.finished, scores)), t1 - t0),
            **{f"train/{key}": torch.stack(values).mean() for key, values in train_stats.items()},
            **{f"reward/{name}": term.mean() for name, term in reward_terms.items()},
        }
        if gold:  # the gold judge on all samples and on the kept ones: is the ranking choosing better answers?
            local.update(gold_metrics(batch_prompts, responses))
            kept_gold = gold_metrics(kept_prompts, kept_responses)
            local["selected/gold_score_mean"] = kept_gold["gold/score_mean"]
            local["selected/gold_good_rate"] = kept_gold["gold/good_rate"]
        metrics = {
            f"raft/{key}": accelerator.reduce(value.float().to(device), reduction="mean").item()
            for key, value in local.items()
        }
        metrics.update(
            {
                "raft/train/lr": scheduler.get_last_lr()[0],
                "raft/time/generate_s": t1 - t0,
                "raft/time/score_s": t2 - t1,
                "raft/time/train_s": t3 - t2,
                "raft/memory/peak_mb": peak_memory_mb(device)[0],
                "raft/train/episodes": round_index * rcfg.prompts_per_round * N,
            }
        )
        logger.log(round_index, metrics, postfix=("raft/objective/scores", "raft/selected/score_mean"))
        if eval_due(round_index, rcfg.eval_every, rcfg.rounds):  # before the checkpoint, so a resumed run has this row
            logger.log(round_index, evaluate_now())
        if accelerator.is_main_process and rcfg.samples_every and round_index % rcfg.samples_every == 0:
            n = rcfg.num_samples
            append_samples(
                run.stage("raft") / "samples.jsonl",
                round_index,
                kept_prompts[:n],
                kept_responses[:n],
                kept_scores[:n].tolist(),
                kept_rollout.finished[:n].tolist(),
                gold,
            )
        if checkpoint_due(accelerator, rcfg.save_every, round_index, rcfg.rounds):
            save_rl_checkpoint("raft", run, cfg, accelerator, policy, optimizer, scheduler, round_index)
    unwrapped = whole.of(policy)
    costs = loop_costs(
        time.perf_counter() - loop_start - eval_s,
        (round_index - resumed_from) * rcfg.prompts_per_round * N,
        device,
        [unwrapped, reward_model] + ([sft_policy] if sft_policy is not None else []),
        [optimizer],
    )
    check_frozen("raft", frozen_roles, frozen_before)

    # 5. Final policy vs SFT on held-out prompts: the test's decoding and the same seed for both. The SFT
    #    policy is loaded now if nothing loaded it yet (peak memory was read above).
    sft_policy = sft_policy if sft_policy is not None else reference_policy(unwrapped, run.model_dir("sft"), device)
    results, eval_samples = evaluate_against_sft(
        engine,
        unwrapped,
        sft_policy,
        reward_model,
        tokenizer,
        prompts,
        validation,
        seed,
        rcfg.eval_batch_size,
        accelerator,
        gold,
    )
    trained = resumed_from < round_index
    results.update(
        {
            "rounds": round_index,
            "episodes": round_index * rcfg.prompts_per_round * N,
            "optimizer_steps": round_index * finetune.total_steps,
            "resumed_from_round": resumed_from,
            "samples_per_prompt": N,
            "top_k": rcfg.top_k,
            "reward_source": reward_source.spec,
            "train_score_mean": metrics.get("raft/objective/scores") if trained else None,
            "train_selected_score_mean": metrics.get("raft/selected/score_mean") if trained else None,
            **costs,
            "frozen_roles_unchanged": True,
        }
    )
    logger.log(round_index, eval_metrics("raft", results))

    # 6. Publish: the HF policy, evaluation samples, curves, summary; then mark complete.
    publish_rl(
        "raft",
        run,
        cfg,
        accelerator,
        logger,
        unwrapped,
        tokenizer,
        results,
        eval_samples,
        CURVES + (EVAL_CURVES if rcfg.eval_every else []),
        t_start,
        {"rounds": round_index},
    )


if __name__ == "__main__":
    run_stage(main)
