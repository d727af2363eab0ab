"""`bash run_all.sh`: run the stage scripts in order, each as its own process.

    python -m rlhf.pipeline [--preset NAME | --config FILE] [--output-dir DIR] [--only a,b | --from STAGE]
                            [--force] [section.key=value ...]

A stage that already completed for the same config skips itself, so re-running the pipeline
after a change re-runs only the stages the change reaches. Set RLHF_LAUNCH to start each
stage under a launcher, e.g. `accelerate launch --config_file configs/accelerate/ddp.yaml` or
`torchrun --nproc_per_node 8` (README, "Many GPUs (accelerate)").
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time

from rlhf.cli import REPO_ROOT, parse_stage_args, run_stage
from rlhf.errors import UserError
from rlhf.run import STAGE_SCRIPTS, STAGES, collect_needed


def select_stages(only: str | None, start: str | None, with_collect: bool = True) -> list[str]:
    """The stages to run, in pipeline order. `collect` runs when named in --only, or when
    `with_collect` (some stage trains on collected pairs); otherwise nothing would read its pairs."""
    available = [stage for stage in STAGES if with_collect or stage != "collect"]
    if only:
        chosen = [name.strip() for name in only.split(",") if name.strip()]
        unknown = [name for name in chosen if name not in STAGES]
        if unknown:
            raise UserError(f"unknown stage(s) {', '.join(unknown)} in --only; stages are: {', '.join(STAGES)}")
        return [stage for stage in STAGES if stage in chosen]
    if start:
        if start not in STAGES:
            raise UserError(f"unknown stage '{start}' in --from; stages are: {', '.join(STAGES)}")
        return [stage for stage in available if STAGES.index(stage) >= STAGES.index(start)]
    return available


def stage_command(stage: str, stage_args: list[str], launch: str) -> list[str]:
    """The command that runs one stage: its script under `launch` (RLHF_LAUNCH, split as a shell
    would, e.g. "accelerate launch --config_file configs/accelerate/ddp.yaml"), or under this
    interpreter when `launch` is empty."""
    return [*(shlex.split(launch) or [sys.executable]), str(REPO_ROOT / STAGE_SCRIPTS[stage]), *stage_args]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="run_all.sh", description="Run the RLHF pipeline's stages in order.")
    parser.add_argument("--only", help=f"comma-separated stages to run, from: {', '.join(STAGES)}")
    parser.add_argument("--from", dest="start", help="run this stage and every later one")
    args, stage_args = parser.parse_known_args(argv)
    if args.only and args.start:
        raise UserError("give --only or --from, not both")
    # Validate the config once, before any stage starts: a typo fails here, not an hour in.
    cfg, run, _ = parse_stage_args("pipeline", stage_args)
    stages = select_stages(args.only, args.start, with_collect=collect_needed(cfg))
    print(f"[pipeline] stages: {', '.join(stages)} -> {run.root}")
    pipeline_start = time.perf_counter()
    for stage in stages:
        started = time.perf_counter()
        result = subprocess.run(stage_command(stage, stage_args, os.environ.get("RLHF_LAUNCH", "")))
        if result.returncode != 0:
            print(
                f"[pipeline] stage '{stage}' failed (exit {result.returncode}); fix it and resume with: "
                f"bash run_all.sh --from {stage} {shlex.join(stage_args)}".rstrip(),
                file=sys.stderr,
            )
            sys.exit(result.returncode)
        print(f"[pipeline] {stage} done in {time.perf_counter() - started:.1f}s")
    total = time.perf_counter() - pipeline_start
    run.update_summary({"timing_s": {"pipeline_total": round(total, 2)}})
    print(f"[pipeline] finished in {total:.0f}s; results in {run.summary_path}")


if __name__ == "__main__":
    run_stage(main)
