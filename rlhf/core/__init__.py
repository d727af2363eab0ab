"""The bottom layer: pure math and the error contract. Nothing here imports from the rest of `rlhf`.

errors    UserError: the one-line `error: <what>; <fix>` every foreseen mistake becomes
ops       tensor operations: log-probs, masks, KL estimators, advantages, moments
losses    every training objective (SFT, Bradley-Terry, PPO, GRPO, the DPO family), as pure functions
batching  where prompt, response and padding sit in a batch; collation
winrates  win rates and their intervals, paired comparisons, Holm's adjustment
stages    the stage registry: each stage's script, config sections, inputs, summary section, report label, curves
"""
