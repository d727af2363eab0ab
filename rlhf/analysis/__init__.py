"""Statistics and figures computed from a run's numbers, above the judges that produce them.

evaluation        KL of a policy to its reference, per-prompt aggregates of the evaluation stage
overoptimization  the reward-vs-KL frontier and where the gold score peaks on it
reward_analysis   what the reward model rewards (length, refusals) on held-out pairs
seeds             intervals over seeds and prompts (two-way random effects), p-values with Holm's adjustment
plots             the PNG figures
"""
