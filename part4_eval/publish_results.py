"""Copy a finished run's small result files into the repository's results/, so a reader can recompute its numbers.

    python part4_eval/publish_results.py outputs/smollm2-ifeval results/smollm2-ifeval
    python part4_eval/publish_results.py outputs/benchmarks/smollm2 results/smollm2-ifeval/anchor

Copies what a number in README or ANALYSIS is computed from, never weights: summary.json, every stage's
config.yaml and results.json, data/stats.json, eval's per-prompt verdicts (win_rates.json, suites/*.jsonl,
benchmarks/*.jsonl) and every model's answers (eval/responses/*.jsonl), part4_eval/seeds.py's summaries and every
seed run's answers (seeds/, pipeline_seeds/: what part4_eval/seed_tables.py recomputes), the RL stages' held-out
samples (eval_samples.jsonl) and DPO's (dpo/samples.jsonl, what part4_eval/degeneration.py reads), every stage's
logged metrics (metrics.jsonl, its curves), overoptimization.py's points, and part4_eval/benchmarks.py's
benchmarks.json with its answers. A file over --max-mb is left out and named. Writes MANIFEST.json: each file's
size and sha256, the source folder and the command.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlhf, even under another clone's .venv

from rlhf.core.errors import UserError
from rlhf.stage.cli import run_stage

PATTERNS = (
    "summary.json",
    "*/config.yaml",
    "*/results.json",
    "data/stats.json",
    "eval/win_rates.json",
    "eval/suites/*.jsonl",
    "eval/benchmarks/*.jsonl",
    "*/eval_samples.jsonl",
    "dpo/samples.jsonl",
    "*/metrics.jsonl",
    "eval/responses/*.jsonl",
    "overopt/overoptimization.json",
    "seeds/summary.json",
    "pipeline_seeds/summary.json",
    "seeds/seed_*/eval/responses/*.jsonl",
    "pipeline_seeds/seed_*/eval/responses/*.jsonl",
    "benchmarks.json",
    "ifeval.jsonl",
    "xstest.jsonl",
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python part4_eval/publish_results.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a run folder (--output-dir), or part4_eval/benchmarks.py's --output")
    parser.add_argument("dest", type=Path, help="where in results/ to put the copies (replaced whole)")
    parser.add_argument("--max-mb", type=float, default=5.0, help="leave out any file larger than this (MB)")
    args = parser.parse_args(argv)
    if not args.run.is_dir():
        raise UserError(f"{args.run} is not a folder; give a run's --output-dir")
    found = sorted({path for pattern in PATTERNS for path in args.run.glob(pattern) if path.is_file()})
    if not found:
        raise UserError(f"{args.run} holds no result file ({', '.join(PATTERNS[:3])}, ...); is it a finished run?")
    tmp = args.dest.with_name(args.dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    files, left_out = {}, []
    for path in found:
        relative = path.relative_to(args.run)
        size = path.stat().st_size
        if size > args.max_mb * 1e6:
            left_out.append(f"{relative} ({size / 1e6:.1f} MB)")
            continue
        (tmp / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, tmp / relative)
        files[str(relative)] = {"bytes": size, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    manifest = {"source": str(args.run.resolve()), "command": " ".join(["python", *sys.argv]), "files": files}
    manifest["left_out"] = left_out
    (tmp / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    shutil.rmtree(args.dest, ignore_errors=True)
    tmp.rename(args.dest)
    print(f"[publish] {len(files)} files, {sum(f['bytes'] for f in files.values()) / 1e6:.2f} MB -> {args.dest}")
    for item in left_out:
        print(f"[publish] left out (over --max-mb): {item}")


if __name__ == "__main__":
    run_stage(main)
