"""Rollouts: sampling responses from a policy, and the no-grad passes over them.

Built around one data type, `Rollout` (batch.py): left-padded prompts followed by responses, with their
masks and the sampler's own log-probs.

    batch             Rollout, SamplingConfig, the held-out evaluation's sampling settings
    layout            RowLayout: how many rollout rows one forward row holds (a GRPO group packed over one prompt)
    generate          sampling with transformers' generate, one seed per prompt row
    forward           log-probs and reward scores of a rollout, chunked, in row order
    packing           a group's responses packed after one copy of their prompt (attention masks, positions)
    engines           the sampler a stage uses: `generate`, or vLLM (vllm_engine.py) with weights pushed in place
    rewards           the training score: the reward model, Python reward functions, or a weighted sum
    reward_functions  ready-made reward functions (format, length)
"""
