"""Stage `raft`: align the SFT policy by reward-ranked fine-tuning.

    python part2_ppo_grpo/train_raft.py --preset tiny [raft.reward=rlhf.task:gold_rewards] [raft.top_k=2]

Reads `<run>/data/` (prompts), `<run>/sft/model/` (policy init, KL reference of the evaluations) and
`<run>/reward/model/` (frozen reward model). Writes `<run>/raft/model/` in Hugging Face format,
samples.jsonl (kept samples), eval_samples.jsonl (final policy vs SFT on held-out prompts),
curves.png, metrics.jsonl, and `raft.*` / `timing_s.raft` in summary.json. Metric keys are defined
in rlhf/methods/raft.py and rlhf/online/.

RAFT (Dong et al. 2023, arXiv 2304.06767, Algorithm 1). Each round:
1. sample N = `raft.samples_per_prompt` responses to each of `raft.prompts_per_round` training
   prompts from the current policy, at `raft.temperature`;
2. score them with `raft.reward` (rlhf/rollout/reward_spec.py: the reward model by default, reward functions,
   or a weighted sum, as `ppo.reward` and `grpo.reward`); a response without EOS loses
   `raft.missing_eos_penalty`, as in PPO and GRPO;
3. keep each prompt's `raft.top_k` best samples (1: best-of-N; rlhf/methods/raft.py);
4. fine-tune the policy on the kept (prompt, response) pairs with the SFT loss on response tokens
   (`rlhf.models.training.sft_batch_loss`), `raft.epochs` passes in batches of `raft.batch_size`, in
   micro-batches of `raft.micro_batch_size` rows, or of at most `raft.micro_batch_tokens` positions weighed by their
   response tokens (`rlhf.loop.fit.step_micro_batches`, as SFT's).
There is no reference model, KL penalty, critic or importance ratio in training: the policy moves
as far as fine-tuning on its own best samples takes it, and the held-out evaluations measure its KL
to the SFT policy. One optimizer and one learning-rate schedule run across all rounds.
"""

from __future__ import annotations

import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlhf, even under another clone's .venv

from rlhf.methods.rules import STAGE_RULES
from rlhf.stage.cli import answer_early, run_stage, start_stage

if __name__ == "__main__":
    answer_early("raft", STAGE_RULES["raft"])  # --help and config errors at once, before torch loads below

import torch
from accelerate.utils import gather_object

from rlhf.core.batching import collate_sequences
from rlhf.core.stages import STAGES
from rlhf.loop.fit import step_micro_batches
from rlhf.loop.step import train_step
from rlhf.methods.raft import kept_rows, plan_raft, tied_prompts
from rlhf.models.lora import load_trainable_policy, reference_policy
from rlhf.models.modeling import load_reward_model
from rlhf.models.roles import frozen
from rlhf.models.training import build_optimizer, epoch_order, response_tokens, sft_batch_loss
from rlhf.online.harness import OnlineStage
from rlhf.online.stats import gold_metrics
from rlhf.rollout.batch import SamplingConfig

CURVES = list(STAGES["raft"].curves)
EVAL_CURVES = list(STAGES["raft"].eval_curves)  # drawn when raft.eval_every > 0


def collate_kept(kept_pairs: list[tuple[list[int], list[int]]], pad_id: int, rows: list[int]) -> dict:
    """The kept (prompt ids, response ids) pairs at `rows`, collated for the SFT loss."""
    return collate_sequences([kept_pairs[i][0] for i in rows], [kept_pairs[i][1] for i in rows], pad_id)


def main(argv: list[str] | None = None) -> None:
    started = start_stage("raft", argv, requires=("reward",), check=STAGE_RULES["raft"])
    if started is None:
        return
    cfg, run = started
    rcfg = cfg.raft

    # 1. Reward source, prompts, context (rlhf.online.harness) and derived sizes, checked before any model is loaded.
    stage = OnlineStage("raft", cfg, run, rcfg.eval_batch_size)
    accelerator, seed, tokenizer = stage.accelerator, stage.seed, stage.tokenizer
    plan = plan_raft(rcfg, accelerator.num_processes, len(stage.prompts.train_ids))
    sampling = SamplingConfig(rcfg.max_new_tokens, rcfg.temperature)
    N = rcfg.samples_per_prompt
    finetune = plan.finetune  # one round's fine-tuning

    # 2. Roles: a trainable policy and a frozen reward model (it scores the held-out evaluations even
    #    when functions rank the samples). The SFT policy, to measure KL against, only when evaluating
    #    along training; the final evaluation loads it otherwise.
    #    With LoRA, the SFT policy is the policy with its adapters disabled.
    policy = load_trainable_policy(run.model_dir("sft"), cfg.model.lora.for_stage("raft"))
    reward_model = frozen(load_reward_model(run.model_dir("reward")), stage.device)
    sft_policy = reference_policy(policy, run.model_dir("sft"), stage.device) if rcfg.eval_every else None
    policy, optimizer, scheduler = stage.prepare(
        policy,
        lambda m: build_optimizer(m, rcfg),
        plan.optimizer_steps,
        reward_model,
        {"reward": reward_model, "sft": sft_policy},
        sft_policy,
    )
    accelerator.print(
        f"[raft] {rcfg.rounds} rounds x {rcfg.prompts_per_round} prompts x N={N}, top {rcfg.top_k} kept: "
        f"{finetune.total_steps} optimizer steps per round; policy "
        f"{sum(p.numel() for p in policy.parameters()) / 1e6:.2f}M parameters"
    )

    # 3. Resume from the last checkpoint written for this same config, if any (taken between rounds).
    #    Before training: the SFT policy's held-out check.
    stage.resume(rcfg.rounds)
    metrics: dict[str, float] = {}

    # 4. Rounds: sample N per prompt, keep the best, fine-tune on them.
    while stage.iteration < rcfg.rounds:
        round_index = stage.iteration
        # 4a. Samples from the current policy: each prompt repeated N times, prompt p's in rows p*N .. p*N + N-1,
        #     whole prompts on one process.
        t0 = time.perf_counter()
        local_rows, rollout = stage.sample(rcfg.prompts_per_round, sampling, N)
        t1 = time.perf_counter()

        # 4b. Scores (the reward model only when the reward spec uses it; functions score the decoded text).
        scored = stage.score(rollout, local_rows, rcfg.eval_batch_size)
        scores = scored.scores  # (P*N,)

        # 4c. Ranking: each prompt's top_k samples (Dong et al. 2023, Algorithm 1, step 2). A prompt's N samples
        #     are on one process, so ranking them there keeps what ranking the whole round would.
        kept = kept_rows(scores.view(-1, N), rcfg.top_k)  # (P*k,) rows of the batch
        kept_rollout, kept_scores = rollout.select(kept), scores[kept]  # P*k rows; (P*k,)
        # (prompt ids, response ids with EOS when it has one) of every process's kept samples, in the round's
        # prompt order: the global rows one process would fine-tune on.
        kept_pairs = gather_object(
            list(zip([stage.prompts.train_ids[local_rows[row]] for row in kept.tolist()], kept_rollout.response_ids()))
        )
        t2 = time.perf_counter()

        # 4d. Fine-tuning on the kept pairs with the SFT loss, in length-grouped batches, each process its slice of
        #     a global batch (as `rlhf.loop.fit.fit`); the data order is a function of (seed, round, epoch), so a
        #     resumed run trains on what an uninterrupted one would.
        lengths = [len(p) + len(r) for p, r in kept_pairs]
        train_stats: dict[str, list[torch.Tensor]] = {}
        for step_in_round in range(finetune.total_steps):
            epoch, position = divmod(step_in_round, finetune.steps_per_epoch)
            order = epoch_order(
                lengths, seed, round_index * plan.epochs_per_round + epoch, rcfg.batch_size, rcfg.group_by_length
            )
            micro_batches = step_micro_batches(  # raft.micro_batch_size rows each, or raft.micro_batch_tokens
                accelerator,
                finetune.micro_rows(order, position, accelerator.process_index),
                lengths,
                rcfg,
                partial(collate_kept, kept_pairs, tokenizer.pad_token_id),
                response_tokens,
            )
            step_stats = train_step(
                "raft",
                run,
                f"step {round_index * finetune.total_steps + step_in_round + 1}",
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
        rounds = stage.advance()

        # 4e. Metrics (means over processes), kept samples, checkpoint.
        kept_prompts = [scored.prompts[row] for row in kept.tolist()]
        kept_responses = kept_rollout.texts(tokenizer)
        local = {
            "objective/scores": scores.mean(),
            "objective/tied_prompts": tied_prompts(scores.view(-1, N)).float().mean(),
            "selected/score_mean": kept_scores.mean(),
            "selected/length_mean": kept_rollout.response_lengths.float().mean(),
            "selected/eos_rate": kept_rollout.finished.float().mean(),
            **stage.sample_metrics(rollout, scores, t1 - t0, scored.prompts, scored.responses),
            **{key: torch.stack(values).mean() for key, values in train_stats.items()},
            **{f"reward/{name}": term.mean() for name, term in scored.terms.items()},
        }
        if stage.gold:  # the gold judge on the kept samples too: is the ranking choosing better answers?
            kept_gold = gold_metrics(kept_prompts, kept_responses)
            local["selected/gold_score_mean"] = kept_gold["gold/score_mean"]
            local["selected/gold_good_rate"] = kept_gold["gold/good_rate"]
        seconds = {"generate": t1 - t0, "score": t2 - t1, "train": t3 - t2}
        metrics = stage.metrics(local, seconds, rounds * rcfg.prompts_per_round * N)
        stage.end_iteration(
            metrics,
            ("raft/objective/scores", "raft/selected/score_mean"),
            (kept_prompts, kept_responses, kept_scores.tolist(), kept_rollout.finished.tolist()),
        )

    # 5-6. Final policy vs SFT on held-out prompts (the test's decoding, the same seed for both); publish the HF
    #      policy, evaluation samples, curves and summary, then mark complete.
    summary = {
        "rounds": stage.iteration,
        "episodes": stage.iteration * rcfg.prompts_per_round * N,
        "optimizer_steps": stage.iteration * finetune.total_steps,
        "resumed_from_round": stage.resumed_from,
        "samples_per_prompt": N,
        "top_k": rcfg.top_k,
        "reward_source": stage.reward_source.spec,
        "train_score_mean": metrics.get("raft/objective/scores") if stage.trained else None,
        "train_selected_score_mean": metrics.get("raft/selected/score_mean") if stage.trained else None,
    }
    stage.finish(rcfg.prompts_per_round * N, summary, CURVES + (EVAL_CURVES if rcfg.eval_every else []), "rounds")


if __name__ == "__main__":
    run_stage(main)
