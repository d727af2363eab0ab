"""Benchmark: forward-only reward scoring (what the reward stage's evaluation and DPO's reference
pass do) with `rlhf.models.training.forward_map`, in input order vs longest-first length order, at a
few batch sizes.

    python bench/bench_forward_batching.py --run outputs/tiny [--pairs 2000] [--batch-sizes 32,128]

Needs a run folder whose `reward` stage is complete. Prints seconds per configuration and the
speed-up of each against input order at the largest batch size; report the ratios, or absolute
numbers with device and date.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlhf, even under another clone's .venv

from rlhf.core.batching import collate_pairs, encode_pairs, pair_length
from rlhf.data import read_jsonl
from rlhf.models.modeling import load_reward_model, load_tokenizer, reward_scores
from rlhf.models.training import forward_map
from rlhf.stage.config import load_config, preset_path


class OneProcess:
    process_index, num_processes = 0, 1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", default="outputs/tiny")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--batch-sizes", default="32,128")
    args = parser.parse_args()
    cfg = load_config(preset_path(args.preset))
    run = Path(args.run)
    tokenizer = load_tokenizer(run / "reward" / "model")
    model = load_reward_model(run / "reward" / "model").eval()
    pairs = encode_pairs(tokenizer, read_jsonl(run / "data" / "train.jsonl")[: args.pairs])
    lengths = [pair_length(p) for p in pairs]

    def score(batch_pairs):
        batch = collate_pairs(
            batch_pairs, tokenizer.pad_token_id, cfg.data.max_prompt_tokens, cfg.data.max_response_tokens + 1
        )
        return reward_scores(model, batch["input_ids"], batch["attention_mask"]).tolist()

    forward_map(score, pairs[:64], 32, OneProcess())  # warm-up
    seconds = {}
    for batch_size in sorted(int(b) for b in args.batch_sizes.split(",")):
        for by_length in (False, True):
            start = time.perf_counter()
            forward_map(score, pairs, batch_size, OneProcess(), lengths=lengths if by_length else None)
            seconds[batch_size, by_length] = time.perf_counter() - start
            print(
                f"batch {batch_size:4d}, {'length order' if by_length else 'input order '}: "
                f"{seconds[batch_size, by_length]:6.2f} s"
            )
    baseline = seconds[max(seconds)[0], False]
    print(
        f"{len(pairs)} pairs, {torch.get_num_threads()} threads, {time.strftime('%Y-%m-%d')}; "
        "speed-up against input order "
        f"at batch {max(seconds)[0]}: "
        + ", ".join(f"batch {b} {'length' if s else 'input'} {baseline / t:.2f}x" for (b, s), t in seconds.items())
    )


if __name__ == "__main__":
    main()
