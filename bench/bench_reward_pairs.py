"""Benchmark: reward-model training steps on preference pairs laid out as two rows per pair
(`collate_pairs`: [prompt][chosen] and [prompt][rejected]) vs one row per pair with the prompt
encoded once (`collate_shared_prompt_pairs`, what the reward stage trains on).

    python bench/bench_reward_pairs.py --run outputs/tiny [--steps 40] [--batch 16]

Needs a run folder whose `sft` stage is complete. Both layouts see the same length-grouped
batches of pairs; prints pairs/s of forward + backward + AdamW for each and their ratio. Report
the ratio, or absolute numbers with device and date.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlhf, even under another clone's .venv

from rlhf.core.batching import collate_pairs, collate_shared_prompt_pairs, encode_pairs, shared_prompt_pair_length
from rlhf.core.losses import bradley_terry_loss
from rlhf.data import read_jsonl
from rlhf.models.modeling import SharedPromptPairRewards, build_reward_model, load_tokenizer, reward_scores
from rlhf.models.training import epoch_order
from rlhf.stage.config import load_config, preset_path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", default="outputs/tiny")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    cfg = load_config(preset_path(args.preset))
    run = Path(args.run)
    tokenizer = load_tokenizer(run / "sft" / "model")
    pairs = encode_pairs(tokenizer, read_jsonl(run / "data" / "train.jsonl"))
    order = epoch_order(
        [shared_prompt_pair_length(p) for p in pairs], seed=0, epoch=0, batch_size=args.batch, group_by_length=True
    )
    truncation = (tokenizer.pad_token_id, cfg.data.max_prompt_tokens, cfg.data.max_response_tokens + 1)

    def two_rows(model, batch_pairs):
        batch = collate_pairs(batch_pairs, *truncation)
        return reward_scores(model, batch["input_ids"], batch["attention_mask"]).chunk(2)

    def shared_prompt(model, batch_pairs):
        return SharedPromptPairRewards(model)(collate_shared_prompt_pairs(batch_pairs, *truncation))[:2]

    pairs_per_second = {}
    for name, rewards in (("two rows per pair", two_rows), ("shared prompt", shared_prompt)):
        torch.manual_seed(0)
        model = build_reward_model(run / "sft" / "model", cfg.reward).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
        elapsed = 0.0
        for step in range(args.steps + 2):  # two warm-up steps
            batch_pairs = [pairs[i] for i in order[step * args.batch : (step + 1) * args.batch]]
            start = time.perf_counter()
            chosen, rejected = rewards(model, batch_pairs)
            bradley_terry_loss(chosen, rejected)[0].backward()
            optimizer.step()
            optimizer.zero_grad()
            if step >= 2:
                elapsed += time.perf_counter() - start
        pairs_per_second[name] = args.steps * args.batch / elapsed
        print(f"{name:18s}: {pairs_per_second[name]:7.1f} pairs/s")
    ratio = pairs_per_second["shared prompt"] / pairs_per_second["two rows per pair"]
    print(
        f"speed-up from the shared prompt: {ratio:.2f}x (batch {args.batch}, {torch.get_num_threads()} threads, "
        f"{time.strftime('%Y-%m-%d')})"
    )


if __name__ == "__main__":
    main()
