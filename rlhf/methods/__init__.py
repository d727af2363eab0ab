"""The methods' own parts, above rollouts and below the online-stage harness.

dpo         the DPO family's objective over pairs (training and evaluation use the same one)
online_dpo  online DPO: pairs from the policy's own samples, batch-size plan
raft        RAFT: which samples are kept, the fine-tuning plan
plan        PPO/GRPO batch-size rules
rules       every stage's config rules, torch-free: checked before a stage's heavy imports and by run_all.sh
shaping     the missing-EOS penalty, per-token reward shaping, KL controllers
passes      shifted log-probs, minibatches, loss units and gradient accumulation
"""
