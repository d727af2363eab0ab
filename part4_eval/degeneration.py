"""Whether a stage's policy has degenerated, read on its own held-out check: the guard for choosing a setting on
validation, where eval's degeneration flag (on the test prompts) cannot be used.

    python part4_eval/degeneration.py RUN [RUN ...] [--stage dpo] [--json FILE]

For each run folder, reads `<stage>/samples.jsonl` (the stage's held-out check: the policy's and SFT's answers to the
same validation prompts, `<stage>.eval_prompts` of them), tokenizes both with the run's SFT tokenizer, and prints for
each: distinct-2 across the answers and 4-gram repetition within each, as eval measures them
(`rlhf.analysis.evaluation`), the stage's validation figures from `summary.json` beside them, and the reasons eval's
rule flags the policy against SFT (`degeneration_reasons`; none: not degenerate).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlhf, even under another clone's .venv

from rlhf.core.errors import UserError
from rlhf.data import read_jsonl
from rlhf.stage.cli import run_stage

VALIDATION_KEYS = ("val_accuracy", "val_margin_mean", "eos_rate", "sft_eos_rate")  # DPO's; others' where present


def answer_measures(token_ids: list[list[int]]) -> dict:
    from rlhf.analysis.evaluation import distinct_n, repetition_within

    return {"distinct_2": distinct_n(token_ids, 2), "repetition_4": repetition_within(token_ids, 4)}


def measure(run: Path, stage: str) -> dict:
    """The policy's and SFT's answer measures on `run`'s held-out check, the flag, and the stage's validation keys."""
    path = run / stage / "samples.jsonl"
    if not path.is_file():
        raise UserError(f"{path} not found; run the {stage} stage in {run} first (bash run_all.sh --only {stage} ...)")
    rows = read_jsonl(path)
    if not rows or f"{stage}_response" not in rows[0] or "sft_response" not in rows[0]:
        raise UserError(f"{path} holds no {stage}_response and sft_response pairs; give a stage whose samples do")
    if not (run / "sft" / "model" / "tokenizer_config.json").is_file():
        raise UserError(f"{run / 'sft' / 'model'} holds no tokenizer; give a run folder whose SFT stage completed")
    from transformers import AutoTokenizer

    from rlhf.analysis.evaluation import degeneration_reasons

    tokenizer = AutoTokenizer.from_pretrained(run / "sft" / "model")
    policy, sft = (
        answer_measures([tokenizer(row[key], add_special_tokens=False)["input_ids"] for row in rows])
        for key in (f"{stage}_response", "sft_response")
    )
    results = json.loads((run / "summary.json").read_text()).get(stage, {})
    return {
        "run": str(run),
        "prompts": len(rows),
        "policy": policy,
        "sft": sft,
        "degenerate": degeneration_reasons(policy, sft),
        "validation": {key: results[key] for key in VALIDATION_KEYS if key in results},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python part4_eval/degeneration.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders whose stage completed")
    parser.add_argument("--stage", default="dpo", help="the stage whose held-out samples are read (default: dpo)")
    parser.add_argument("--json", type=Path, help="also write the measures here")
    args = parser.parse_args(argv)
    measured = [measure(run, args.stage) for run in args.runs]
    keys = sorted({key for m in measured for key in m["validation"]})
    print(f"| run | prompts | {' | '.join(keys)} | distinct-2 (SFT) | repetition-4 (SFT) | degenerate |")
    print("|---|---:|" + "---:|" * len(keys) + "---:|---:|---|")
    for m in measured:
        values = " | ".join(f"{m['validation'][key]:.3f}" if key in m["validation"] else "" for key in keys)
        p, s = m["policy"], m["sft"]
        print(
            f"| {m['run']} | {m['prompts']} | {values} | {p['distinct_2']:.3f} ({s['distinct_2']:.3f}) | "
            f"{p['repetition_4']:.3f} ({s['repetition_4']:.3f}) | {'; '.join(m['degenerate']) or 'no'} |"
        )
    if args.json:
        args.json.write_text(json.dumps(measured, indent=2) + "\n")


if __name__ == "__main__":
    run_stage(main)
