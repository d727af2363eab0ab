"""The seed-spread tables of README's Results and ANALYSIS's headline, recomputed from a published run's answers.

    python part4_eval/seed_tables.py results/tiny

For each scope that the run has (`pipeline_seeds/`: the whole pipeline redrawn per seed; `seeds/`: the methods
alone), reads the seed folders and methods named in its summary.json, re-aggregates every seed's
eval/responses/*.jsonl (`rlhf.analysis.seeds.aggregate_seed_runs`: the crossed interval, the p-values, both Holm
adjustments, gold scores, KL) and prints the tables as the report renders them (`rlhf.report.seeds_section`).
Exits 1, naming the number, when a recomputed value differs from the committed summary.json: what is printed is
then not what the run wrote. `publish_results.py` copies a run's answers and summaries into results/.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlhf, even under another clone's .venv

import yaml

from rlhf.analysis.seeds import SCOPE_DIRS, aggregate_seed_runs
from rlhf.core.errors import UserError
from rlhf.report.contract import RunData
from rlhf.report.seeds_section import SCOPE_TEXT, head_to_head_table, vs_sft_table
from rlhf.stage.cli import run_stage

NUMERIC_KEYS = ("mean", "ci95_low", "ci95_high", "sd", "p_value", "p_holm", "p_holm_all", "tie_rate")


def recompute(run: Path, scope: str) -> tuple[dict, dict]:
    """The seeds summary of one scope recomputed from the committed answers of every seed folder its summary.json
    names, and that summary.json as published."""
    path = run / SCOPE_DIRS[scope] / "summary.json"
    published = json.loads(path.read_text(encoding="utf-8"))
    eval_config = run / "eval" / "config.yaml"
    judge = (yaml.safe_load(eval_config.read_text()) or {}).get("judge", {}) if eval_config.is_file() else {}
    tolerance = float(judge.get("reward_tie_tolerance", 0.0))  # only read when there is no gold judge
    eval_dirs = [run / entry["folder"] / "eval" for entry in published["seeds"]]
    spread = aggregate_seed_runs(eval_dirs, published["methods"], tolerance)
    return {**published, **spread}, published


def differences(recomputed: dict, published: dict, where: str = "") -> list[str]:
    """Every numeric field of the blocks that differs between the two summaries (relative 1e-9)."""
    found = []
    for key, value in recomputed.items():
        other = published.get(key) if isinstance(published, dict) else None
        if isinstance(value, dict):
            found += differences(value, other or {}, f"{where}{key}.")
        elif key in NUMERIC_KEYS and not (
            isinstance(other, (int, float)) and math.isclose(value, other, rel_tol=1e-9, abs_tol=1e-12)
        ):
            found.append(f"{where}{key}: recomputed {value}, published {other}")
    return found


def tables(run: Path) -> dict[str, list[str]]:
    """Per scope present in `run`, its tables as markdown (the table against SFT, then the head-to-heads)."""
    summary_path = run / "summary.json"
    if not summary_path.is_file():
        raise UserError(f"{summary_path} is missing: give a run folder or its copy by part4_eval/publish_results.py")
    data = RunData(summary=json.loads(summary_path.read_text(encoding="utf-8")))
    out = {}
    for scope in ("pipeline", "methods"):
        if not (run / SCOPE_DIRS[scope] / "summary.json").is_file():
            continue
        spread, published = recompute(run, scope)
        found = differences(spread, published)
        if found:
            raise UserError(
                f"{run / SCOPE_DIRS[scope] / 'summary.json'} differs from its answers recomputed: {found[0]}"
                + (f" (and {len(found) - 1} more)" if len(found) > 1 else "")
                + "; re-run part4_eval/seeds.py there and publish again"
            )
        out[scope] = [vs_sft_table(data, spread), *filter(None, [head_to_head_table(spread)])]
    if not out:
        raise UserError(f"{run} has no seeds summary (seeds/ or pipeline_seeds/); run part4_eval/seeds.py first")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python part4_eval/seed_tables.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a published run folder (results/tiny) or a run's --output-dir")
    args = parser.parse_args(argv)
    for scope, markdown in tables(args.run).items():
        print(f"## {SCOPE_TEXT[scope][0]}\n")
        print("\n\n".join(markdown) + "\n")


if __name__ == "__main__":
    run_stage(main)
