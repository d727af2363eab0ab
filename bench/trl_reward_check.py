"""How TRL's GRPO would score the run's reward model, against how ours does, on one batch of SFT samples: the check
behind bench/trl_stages.py's `scored_as_ours`. Prints one JSON line.

    python bench/trl_reward_check.py --run outputs/tiny-final [--samples 64]

- `ours`: the mean of ours' GRPO scores (`rlhf.rollout.forward.score_rollout` on the token ids, EOS included, then
  `grpo.missing_eos_penalty` off a response without one);
- `trl_default`: the mean TRL's own reward-model path gives the same samples (prompt + completion decoded without
  special tokens, re-tokenized, right-padded, the score at the last token);
- `harness_max_abs_diff`: the largest difference between ours and `scored_as_ours` over the samples.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlhf, run from anywhere

from trl_stages import scored_as_ours

from rlhf.data import read_jsonl
from rlhf.methods.shaping import apply_missing_eos_penalty
from rlhf.models.modeling import load_policy, load_reward_model, load_tokenizer
from rlhf.rollout.batch import SamplingConfig
from rlhf.rollout.engines import HFEngine
from rlhf.rollout.forward import score_rollout
from rlhf.stage.config import load_config, preset_path
from rlhf.stage.run import RunDir


@torch.no_grad()
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a run folder whose data, sft and reward completed")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--samples", type=int, default=64)
    args = parser.parse_args(argv)
    cfg, run = load_config(preset_path(args.preset), []), RunDir(args.run)
    tokenizer = load_tokenizer(run.model_dir("sft"))
    prompts = [row["prompt"] for row in read_jsonl(run.stage("data") / "train.jsonl")[: args.samples]]
    engine = HFEngine(tokenizer, args.samples)
    engine.load(load_policy(run.model_dir("sft")))
    g = cfg.grpo
    sampling = SamplingConfig(temperature=g.temperature, top_p=g.top_p, top_k=g.top_k, max_new_tokens=g.max_new_tokens)
    rollout = engine.sample([tokenizer(p)["input_ids"] for p in prompts], sampling, list(range(len(prompts))))
    ours = apply_missing_eos_penalty(
        score_rollout(load_reward_model(run.model_dir("reward")), rollout, args.samples),
        rollout.finished,
        g.missing_eos_penalty,
    )
    completions = rollout.texts(tokenizer)
    reward_model = AutoModelForSequenceClassification.from_pretrained(str(run.model_dir("reward"))).eval()
    texts = [p + c for p, c in zip(prompts, completions)]
    inputs = tokenizer(texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
    trl_default = reward_model(**inputs).logits[:, 0]
    harness = torch.tensor(
        scored_as_ours(reward_model, tokenizer, g.missing_eos_penalty)(prompts, completions, rollout.response_ids())
    )
    print(
        json.dumps(
            {
                "samples": len(prompts),
                "finished": rollout.finished.float().mean().item(),
                "ours": ours.mean().item(),
                "trl_default": trl_default.mean().item(),
                "harness_max_abs_diff": (harness - ours).abs().max().item(),
            }
        )
    )


if __name__ == "__main__":
    main()
