"""Stage `online_dpo`: DPO on pairs of the current policy's own samples, labelled as training goes.

    python part3_dpo/train_online_dpo.py --preset tiny [online_dpo.judge=simulated] [online_dpo.reference=iteration]

Reads `<run>/data/` (prompts), `<run>/sft/model/` (policy init and reference) and `<run>/reward/model/`
(the default judge; it also scores the held-out evaluations). Writes `<run>/online_dpo/model/` in Hugging
Face format, samples.jsonl (pairs), eval_samples.jsonl (final policy vs SFT on held-out prompts), curves.png,
metrics.jsonl, and `online_dpo.*` / `timing_s.online_dpo` in summary.json. Metric keys: rlhf/methods/online_dpo.py.

Offline DPO (part3_dpo/train_dpo.py) learns from pairs a demonstrator wrote; once the policy moves, those
pairs say little about what it now samples. Online DPO (Guo et al. 2024, "Direct Language Model Alignment
from Online AI Feedback", arXiv 2402.04792, Algorithm 1; iterative DPO, Xu et al. 2023, arXiv 2312.16682)
labels the policy's own samples instead. Each iteration:
1. sample K = `online_dpo.samples_per_prompt` responses to each of batch_size / K training prompts from the
   current policy, prompt i's row from its own seed (W processes sample what one does);
2. the judge makes each prompt's samples a pair: `reward` ranks them by `online_dpo.reward` (the reward model
   by default, a response without EOS losing `missing_eos_penalty`, as in PPO) and pairs the best with the
   worst; `simulated` / `openai` are the collect stage's pairwise annotators. Prompts without a preference
   (equal scores, identical samples, an annotator tie or failure) are left out and counted;
3. reference log-probs of the pairs: pi_ref is the SFT policy by default (`online_dpo.reference=sft`, as Guo
   et al. and TRL's OnlineDPOTrainer: a fixed anchor keeps the implicit KL penalty measured from where every
   other method starts); `iteration` uses the sampling policy itself, iterative DPO's choice, which lets each
   step move beta-far from the last;
4. `online_dpo.epochs` DPO steps on the pairs (`rlhf.core.losses.DPO_LOSSES`, the offline stage's loss, through
   `rlhf.methods.dpo.make_loss_fn`), plus `online_dpo.rpo_alpha` x the chosen samples' per-token NLL when it is set
   (iterative RPO, Pang et al. 2024, arXiv 2404.19733).
One optimizer and one learning-rate schedule run across the iterations.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlhf, even under another clone's .venv

from rlhf.methods.rules import STAGE_RULES
from rlhf.stage.cli import answer_early, run_stage, start_stage

if __name__ == "__main__":
    answer_early("online_dpo", STAGE_RULES["online_dpo"])  # --help and config errors at once, before torch loads below

import torch

from rlhf.core.batching import EncodedPair, collate_shared_prompt_pairs, shared_prompt_pair_length
from rlhf.core.losses import DPO_AVERAGES_LOGPS
from rlhf.core.stages import STAGES
from rlhf.judges import OpenAIJudge, SimulatedAnnotatorJudge
from rlhf.loop.step import MicroBatch, accumulation_weights, train_step
from rlhf.methods.dpo import PrecomputedReference, indexed_pairs, local_pair_logps, make_loss_fn
from rlhf.methods.online_dpo import best_worst_pairs, pair_indices_to_rows, plan_online_dpo, split_micro_batches
from rlhf.models.lora import load_trainable_policy, reference_policy
from rlhf.models.modeling import load_reward_model
from rlhf.models.roles import frozen
from rlhf.models.training import build_optimizer
from rlhf.online.harness import OnlineStage
from rlhf.rollout.batch import SamplingConfig
from rlhf.stage.run import stage_seed

CURVES = list(STAGES["online_dpo"].curves)
EVAL_CURVES = list(STAGES["online_dpo"].eval_curves)


def build_pairwise_annotator(cfg, run):
    """The collect stage's annotators, for online_dpo.judge=simulated|openai (pairwise, both orders for the LLM)."""
    if cfg.online_dpo.judge == "simulated":
        spec = cfg.data.embedded
        return SimulatedAnnotatorJudge(spec.annotator_noise, spec.length_bias, seed=stage_seed(cfg, "online_dpo"))
    return OpenAIJudge(cfg.judge, cache_path=run.stage("online_dpo") / "openai_cache.jsonl")


def main(argv: list[str] | None = None) -> None:
    started = start_stage("online_dpo", argv, requires=("reward",), check=STAGE_RULES["online_dpo"])
    if started is None:
        return
    cfg, run = started
    ocfg = cfg.online_dpo
    batch_size = ocfg.forward_batch_size  # rows per no-grad pass

    # 1. Judge, prompts, context (rlhf.online.harness) and derived sizes, checked before any model is loaded.
    stage = OnlineStage("online_dpo", cfg, run, batch_size)
    accelerator, device, tokenizer = stage.accelerator, stage.device, stage.tokenizer
    plan = plan_online_dpo(ocfg, accelerator.num_processes, len(stage.prompts.train_ids))
    annotator = build_pairwise_annotator(cfg, run) if ocfg.judge != "reward" else None
    sampling = SamplingConfig(ocfg.max_new_tokens, ocfg.temperature, ocfg.top_p, ocfg.top_k)
    K = ocfg.samples_per_prompt
    average = DPO_AVERAGES_LOGPS[ocfg.loss_type]

    def collate(pairs: list[EncodedPair]) -> dict[str, torch.Tensor]:
        return collate_shared_prompt_pairs(pairs, tokenizer.pad_token_id)

    # 2. Roles: a trainable policy, the frozen reward model (judge and held-out scorer) and the frozen SFT policy
    #    (the reference with online_dpo.reference=sft, and the KL anchor of every evaluation). With LoRA the SFT
    #    policy is the policy with its adapters disabled.
    policy = load_trainable_policy(run.model_dir("sft"), cfg.model.lora.for_stage("online_dpo"))
    reward_model = frozen(load_reward_model(run.model_dir("reward")), device)
    sft_policy = reference_policy(policy, run.model_dir("sft"), device)
    policy, optimizer, scheduler = stage.prepare(
        policy,
        lambda m: build_optimizer(m, ocfg),
        plan.optimizer_steps,
        reward_model,
        {"reward": reward_model, "sft": sft_policy},
        sft_policy,
    )
    accelerator.print(
        f"[online_dpo] {plan.iterations} iterations x {plan.prompts_per_iteration} prompts x K={K}, judge "
        f"{ocfg.judge}, reference {ocfg.reference}; loss {ocfg.loss_type} beta={ocfg.beta}; policy "
        f"{sum(p.numel() for p in policy.parameters()) / 1e6:.2f}M parameters"
    )

    # 3. Resume from the last checkpoint written for this same config, if any (taken between iterations).
    #    Before training: the SFT policy's held-out check.
    stage.resume(plan.iterations)
    metrics: dict[str, float] = {}

    # 4. Iterations: sample K per prompt, judge them into pairs, take DPO steps on the pairs.
    while stage.iteration < plan.iterations:
        # 4a. Samples from the current policy: prompt p's K samples in rows p*K .. p*K + K-1.
        t0 = time.perf_counter()
        local_rows, rollout = stage.sample(plan.prompts_per_iteration, sampling, K)
        local_batch = len(local_rows)
        t1 = time.perf_counter()

        # 4b. The judge: each prompt's best and worst sample by score, or the annotator's verdict on the two.
        response_ids = rollout.response_ids()  # EOS included when the response has one
        if annotator is None:
            scored = stage.score(rollout, local_rows, batch_size)
            batch_prompts, responses, scores, reward_terms = (
                scored.prompts,
                scored.responses,
                scored.scores,
                scored.terms,
            )
            chosen, rejected, has_pair = best_worst_pairs(scores.view(-1, K).cpu())  # (P,) each
        else:
            batch_prompts, responses = stage.texts(rollout, local_rows)
            reward_terms, scores = {}, None
            firsts, seconds = range(0, local_batch, 2), range(1, local_batch, 2)
            verdicts = annotator.compare(
                batch_prompts[::2], [responses[i] for i in firsts], [responses[i] for i in seconds]
            ).outcomes
            chosen = torch.tensor([0 if v == "A" else 1 for v in verdicts])  # (P,)
            rejected = 1 - chosen
            has_pair = torch.tensor([v in ("A", "B") for v in verdicts])
        identical = torch.tensor(
            [len({tuple(response_ids[p * K + k]) for k in range(K)}) == 1 for p in range(local_batch // K)]
        )
        has_pair &= ~identical  # (P,)
        chosen_rows, rejected_rows = pair_indices_to_rows(chosen, rejected, has_pair, K)  # rows of the rollout batch
        pairs = [
            EncodedPair(stage.prompts.train_ids[local_rows[c]], response_ids[c], response_ids[r])
            for c, r in zip(chosen_rows, rejected_rows)
        ]
        n_pairs = int(accelerator.reduce(torch.tensor(len(pairs), device=device), reduction="sum"))
        own_pairs = len(pairs)
        if not pairs and n_pairs:  # other processes step: join them with a pair of one response with itself,
            # weighted 0 below (its DPO gradient is zero anyway: chosen and rejected log-probs move together)
            pairs = [EncodedPair(stage.prompts.train_ids[local_rows[0]], response_ids[0], response_ids[0])]
        # 4c. Reference log-probs of the pairs: the SFT policy, or the sampling policy itself (no grad either way).
        ref_model = sft_policy if ocfg.reference == "sft" else stage.policy()
        ref_logps = local_pair_logps(ref_model, pairs, collate, ocfg.forward_batch_size, accelerator, average)
        reference = PrecomputedReference({"train": ref_logps})  # (n, 2), by each row's index (`indexed_pairs`)
        t2 = time.perf_counter()

        # 4d. DPO steps on the pairs, in micro-batches of near-equal size (gradients averaged over processes).
        loss_fn = make_loss_fn(
            ocfg.loss_type,
            ocfg.beta,
            ocfg.label_smoothing,
            reference,
            length_heuristic=ocfg.length_heuristic,
            rpo_alpha=ocfg.rpo_alpha,
        )
        order = sorted(range(len(pairs)), key=lambda i: shared_prompt_pair_length(pairs[i]))  # little padding
        chunks = [[order[i] for i in chunk] for chunk in split_micro_batches(len(pairs), ocfg.micro_batch_size)]
        # every pair of every process weighs the same, as in one process (a process without pairs weighs 0)
        pairs_per_process = n_pairs / accelerator.num_processes
        weights = accumulation_weights([len(c) for c in chunks], pairs_per_process) if own_pairs else [0.0]
        micro = [
            MicroBatch(
                {k: v.to(device) for k, v in indexed_pairs(collate, pairs, chunk).items()},
                weight,
                weight,
            )
            for chunk, weight in zip(chunks, weights)
        ]
        train_stats: dict[str, list[torch.Tensor]] = {}
        for epoch in range(ocfg.epochs if n_pairs else 0):  # no pair on any process: nothing to learn, no step
            step_stats = train_step(
                "online_dpo",
                run,
                f"step {stage.iteration * ocfg.epochs + epoch + 1}",
                accelerator,
                policy,
                optimizer,
                scheduler,
                micro,
                loss_fn,
                ocfg.max_grad_norm,
            )
            for key, value in step_stats.items():
                train_stats.setdefault(key, []).append(value)
        t3 = time.perf_counter()
        iteration = stage.advance()

        # 4e. Metrics (means over processes), a few pairs, checkpoint.
        # per-pair means over all processes' pairs (processes keep different numbers); per-row ones over equal shares
        pair_sums = {
            "pairs/chosen_length_mean": sum(len(response_ids[c]) for c in chosen_rows),
            "pairs/rejected_length_mean": sum(len(response_ids[r]) for r in rejected_rows),
        }
        if scores is not None:
            pair_sums["pairs/score_margin"] = float((scores[chosen_rows] - scores[rejected_rows]).sum())
        pair_totals = accelerator.reduce(torch.tensor(list(pair_sums.values()), device=device), reduction="sum")
        local = {
            "pairs/kept_rate": has_pair.float().mean(),
            **{key: pair_totals[i] / max(n_pairs, 1) for i, key in enumerate(pair_sums)},
            **{key: torch.stack(values).mean() for key, values in train_stats.items()},
            **{f"reward/{name}": term.mean() for name, term in reward_terms.items()},
        }
        if scores is not None:
            local["objective/scores"] = scores.mean()
        shown_scores = scores if scores is not None else torch.zeros(local_batch, device=device)
        # (the gold judge's metrics are logging only: it never labels or selects what online DPO trains on)
        local.update(stage.sample_metrics(rollout, shown_scores, t1 - t0, batch_prompts, responses))
        seconds = {"generate": t1 - t0, "judge": t2 - t1, "train": t3 - t2}
        metrics = stage.metrics(local, seconds, iteration * ocfg.batch_size)
        pair_rows = [row for pair in zip(chosen_rows, rejected_rows) for row in pair]  # chosen, then rejected
        stage.end_iteration(
            metrics,
            ("online_dpo/pairs/kept_rate", "online_dpo/train/loss"),
            (
                [batch_prompts[row] for row in pair_rows],
                [responses[row] for row in pair_rows],
                [float(scores[row]) if scores is not None else float("nan") for row in pair_rows],
                [bool(rollout.finished[row]) for row in pair_rows],
            ),
            rows_per_sample=2,
        )

    # 5-6. Final policy vs SFT on held-out prompts (the test's decoding, the same seed for both); publish the HF
    #      policy, evaluation samples, curves and summary, then mark complete.
    summary = {
        "iterations": stage.iteration,
        "episodes": stage.iteration * ocfg.batch_size,
        "optimizer_steps": stage.iteration * ocfg.epochs,
        "resumed_from_iteration": stage.resumed_from,
        "samples_per_prompt": K,
        "judge": ocfg.judge if annotator is None else annotator.name,
        "reference": ocfg.reference,
        "loss_type": ocfg.loss_type,
        "beta": ocfg.beta,
        "rpo_alpha": ocfg.rpo_alpha,
        "reward_source": stage.reward_source.spec if annotator is None else None,
        "pairs_kept_rate": metrics.get("online_dpo/pairs/kept_rate") if stage.trained else None,
        "train_score_mean": metrics.get("online_dpo/objective/scores") if stage.trained else None,
    }
    stage.finish(ocfg.batch_size, summary, CURVES + (EVAL_CURVES if ocfg.eval_every else []))


if __name__ == "__main__":
    run_stage(main)
