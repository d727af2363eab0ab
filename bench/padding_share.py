"""How much of the offline stages' training computation is padding: one epoch of SFT's demonstrations and of the
preference pairs (as the reward model and DPO read them, one row per pair), in the stage's own epoch order and
batches, cut into micro-batches of `<stage>.micro_batch_size` rows and by token budgets
(`<stage>.micro_batch_tokens`, `rlhf.models.training.budget_micro_rows`). Counts only: no model runs.

    python bench/padding_share.py --run outputs/tiny [--preset tiny] [--budgets 512,1024] [key=value ...]

For each stage and grouping: positions computed (rows x each micro-batch's widest row, summed), real tokens,
padding share = 1 - real / positions, micro-batches per step, and the widest micro-batch in positions (what sets
peak memory). Writes bench/results/<preset>-<date>-padding-share.json (counts, the same on any machine).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlhf.core.batching import (  # noqa: E402
    collate_sequences,
    collate_shared_prompt_pairs,
    encode_demonstrations,
    encode_pairs,
    shared_prompt_pair_length,
)
from rlhf.data import read_demonstrations, read_jsonl  # noqa: E402
from rlhf.models.modeling import load_tokenizer  # noqa: E402
from rlhf.models.training import budget_micro_rows, epoch_order, plan_steps  # noqa: E402
from rlhf.stage.config import load_config, preset_path  # noqa: E402
from rlhf.stage.run import RunDir, stage_seed  # noqa: E402


def epoch_positions(stage: str, cfg, examples: list, lengths: list[int], collate, pad_id: int, budget: int | None):
    """One epoch of `stage`'s steps on one process: positions computed, real tokens, micro-batches, the widest."""
    tcfg = getattr(cfg, stage)
    plan = plan_steps(stage, tcfg, len(examples), 1)
    order = epoch_order(lengths, stage_seed(cfg, stage), 0, tcfg.batch_size, tcfg.group_by_length)
    positions = real = micro_count = widest = 0
    for position in range(plan.steps_per_epoch):
        micro_rows = plan.micro_rows(order, position, 0)
        if budget is not None:
            micro_rows = budget_micro_rows([i for rows in micro_rows for i in rows], lengths, budget)
        for rows in micro_rows:
            ids = collate([examples[i] for i in rows])["input_ids"]  # (b, t)
            positions += ids.numel()
            real += int((ids != pad_id).sum())
            widest = max(widest, ids.numel())
        micro_count += len(micro_rows)
    return {
        "positions": positions,
        "real_tokens": real,
        "padding_share": round(1 - real / positions, 4),
        "micro_batches_per_step": round(micro_count / plan.steps_per_epoch, 2),
        "widest_micro_batch_positions": widest,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a run folder whose data and sft stages completed")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--budgets", default="512,1024", help="token budgets to compare, comma-separated")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")
    args = parser.parse_intermixed_args(argv)
    cfg = load_config(preset_path(args.preset), args.overrides)
    run = RunDir(args.run)
    tokenizer = load_tokenizer(run.model_dir("sft"))
    truncation = (cfg.data.max_prompt_tokens, cfg.data.max_response_tokens + 1)  # +1: the EOS, as the stages

    demonstrations = encode_demonstrations(
        tokenizer, read_demonstrations(run.stage("data"), "train", cfg.data.sft_path is not None)
    )
    pairs = encode_pairs(tokenizer, read_jsonl(run.stage("data") / "train.jsonl"))
    workloads = {
        "sft": (
            demonstrations,
            [len(p) + len(r) for p, r in demonstrations],  # as the stage: before truncation
            lambda batch: collate_sequences(*map(list, zip(*batch)), tokenizer.pad_token_id, *truncation),
        ),
        "reward": (
            pairs,
            [shared_prompt_pair_length(p) for p in pairs],
            lambda batch: collate_shared_prompt_pairs(batch, tokenizer.pad_token_id, *truncation),
        ),
    }  # fmt: skip
    workloads["dpo"] = workloads["reward"]  # the same pairs, one row each
    budgets = [int(b) for b in args.budgets.split(",") if b]
    results = {}
    for stage, (examples, lengths, collate) in workloads.items():
        tcfg = getattr(cfg, stage)
        rows = {f"micro_batch_size={tcfg.micro_batch_size}": None, **{f"micro_batch_tokens={b}": b for b in budgets}}
        results[stage] = {
            "batch_size": tcfg.batch_size,
            **{name: epoch_positions(stage, cfg, examples, lengths, collate, tokenizer.pad_token_id, budget)
               for name, budget in rows.items()},
        }  # fmt: skip
        for name in rows:
            print(f"[padding] {stage:6s} {name:24s} {json.dumps(results[stage][name])}")
    out = (
        REPO / "bench" / "results" / f"{args.preset}-{datetime.date.today().isoformat()}-padding-share.json"
    )  # counts: any device
    command = "python bench/padding_share.py " + " ".join(argv if argv is not None else sys.argv[1:])
    out.write_text(json.dumps({"command": command, "preset": args.preset, "stages": results}, indent=1) + "\n")
    print(f"[padding] wrote {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
