"""Benchmark: training-step throughput of the shared SFT loop's forward/backward, with and without
length-grouped batching, on the tiny preset's data and model shape.

    python bench/bench_train_step.py --run outputs/tiny [--steps 30] [--batch 32]

Needs a run folder whose `data` stage is complete. Prints tokens/s (real, non-pad tokens) for
each order and their ratio; report the ratio, or absolute numbers with device and date.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlhf, even under another clone's .venv

from rlhf.core.batching import collate_sequences, encode_responses, encode_texts
from rlhf.core.losses import sft_loss
from rlhf.data import read_jsonl
from rlhf.models.modeling import build_policy, load_tokenizer, token_logprobs
from rlhf.models.training import epoch_order
from rlhf.stage.config import load_config, preset_path


def measure(model, examples, order, batch, steps, pad_id) -> float:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    real_tokens, elapsed = 0, 0.0
    for step in range(steps + 2):  # two warm-up steps
        chunk = [examples[i] for i in order[step * batch : (step + 1) * batch]]
        prompts, responses = zip(*chunk)
        inputs = collate_sequences(list(prompts), list(responses), pad_id)
        start = time.perf_counter()
        loss, _ = sft_loss(
            token_logprobs(model, inputs["input_ids"], inputs["attention_mask"]), inputs["response_mask"]
        )
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step >= 2:
            elapsed += time.perf_counter() - start
            real_tokens += int(inputs["attention_mask"].sum())
    return real_tokens / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", default="outputs/tiny")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    cfg = load_config(preset_path(args.preset))
    run = Path(args.run)
    tokenizer = load_tokenizer(run / "data" / "tokenizer")
    rows = read_jsonl(run / "data" / "train.jsonl")
    examples = list(
        zip(
            encode_texts(tokenizer, [r["prompt"] for r in rows]),
            encode_responses(tokenizer, [r["chosen"] for r in rows]),
        )
    )
    lengths = [len(p) + len(r) for p, r in examples]
    torch.manual_seed(0)
    model = build_policy(cfg.model, tokenizer)
    results = {}
    for grouped in (False, True):
        order = epoch_order(lengths, seed=0, epoch=0, batch_size=args.batch, group_by_length=grouped)
        results[grouped] = measure(model, examples, order, args.batch, args.steps, tokenizer.pad_token_id)
        print(f"group_by_length={grouped}: {results[grouped]:,.0f} real tokens/s")
    print(
        f"speed-up from length grouping: {results[True] / results[False]:.2f}x "
        f"({torch.get_num_threads()} threads, {time.strftime('%Y-%m-%d')})"
    )


if __name__ == "__main__":
    main()
