"""What the online stages (PPO, GRPO, RAFT, online DPO) share, one concern per module:

    harness      OnlineStage: set-up, sampling and scoring, held-out checks, metrics, checkpoints, publishing
    prompts      the stage's prompts and the order iterations draw them in
    sampling     one iteration's samples, engine-vs-trainer log-prob mismatch, truncated importance weights
    checkpoints  resumable checkpoints, the samples log, the metric logger
    held_out     held-out evaluation against SFT, along training and at the end
    stats        response statistics, gold scores, head-to-head counts, loop costs
    publish      the published model, results, curves and summary.json keys

The methods' own math lives below, in rlhf.methods (batch plans, shaping, passes) and rlhf.core (losses,
advantage estimators); it is pure (tensors in, tensors out) and tested in tests/test_rl.py, test_ops.py and
test_losses.py. Shapes: B rollouts, T = P + R tokens (see
rlhf.rollout.batch for the layout), per-token tensors aligned with the token they belong to.

Metrics (keys `<stage>/<group>/<name>`, stage `ppo` or `grpo`; one row per iteration)
-----------------------------------------------------------------------------------------
objective/scores            mean training score of the batch (`<stage>.reward`: the reward model, functions, or a
                            weighted sum; rlhf/rollout/reward_spec.py), after the missing-EOS penalty
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
