"""The command-line contract shared by every stage script.

    python <stage script> [--preset NAME | --config FILE] [--output-dir DIR] [--force] [section.key=value ...]

Errors a user can cause (bad keys, types, files, missing upstream stages) surface as one line
on stderr and exit code 2, before any model is loaded.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rlhf.config import Config, load_config, preset_path
from rlhf.errors import UserError
from rlhf.run import RunDir, config_inputs

REPO_ROOT = Path(__file__).resolve().parent.parent


def parse_stage_args(stage: str, argv: list[str] | None = None) -> tuple[Config, RunDir, bool]:
    parser = argparse.ArgumentParser(
        prog=f"{stage} stage", description=f"Run the '{stage}' stage of the RLHF pipeline."
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--preset", help="configs/NAME.yaml (default: tiny)")
    source.add_argument("--config", help="any YAML config file")
    parser.add_argument("--output-dir", help="run folder (default: outputs/<preset>)")
    parser.add_argument("--force", action="store_true", help="re-run even if the stage completed for this config")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="override any config key")
    args = parser.parse_args(argv)
    name = args.preset or (None if args.config else "tiny")
    cfg = load_config(preset_path(name) if name else args.config, args.overrides)
    if args.output_dir:
        cfg.run.output_dir = args.output_dir
    if cfg.run.output_dir is None:
        cfg.run.output_dir = str(REPO_ROOT / "outputs" / (name or Path(args.config).stem))
    return cfg, RunDir(cfg.run.output_dir, preset=name), args.force


def start_stage(
    stage: str,
    argv: list[str] | None = None,
    requires: tuple[str, ...] = (),
    check: Callable[[Config], None] | None = None,
) -> tuple[Config, RunDir] | None:
    """Parse the command line; None (after saying so) when the stage already completed for this config.

    `check` (config-only rules) must pass, and then the input stages in `requires` (and those the
    config adds, `rlhf.run.config_inputs`, e.g. `collect` for reward.pairs=collected) must be complete
    for this config, before the stage's own completion marker is cleared: a mistyped re-run fails
    in one line and leaves the finished stage as it was.
    """
    cfg, run, force = parse_stage_args(stage, argv)
    if run.is_complete(stage, cfg) and not force:
        print(f"[{stage}] already complete for this config in {run.stage(stage)}; skipping (--force re-runs it)")
        return None
    if check is not None:
        check(cfg)
    for upstream in (*requires, *config_inputs(stage, cfg)):
        run.require(upstream, cfg)
    run.clear_complete(stage)
    if force:
        shutil.rmtree(run.checkpoint_dir(stage), ignore_errors=True)
    run.stage(stage).mkdir(parents=True, exist_ok=True)
    return cfg, run


def run_stage(main: Callable[[list[str] | None], None]) -> None:
    """Entry point wrapper: one-line errors, exit 2; Ctrl-C exits 130 with checkpoints intact."""
    start = time.perf_counter()
    try:
        main(sys.argv[1:])
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print(
            f"interrupted after {time.perf_counter() - start:.0f}s; "
            "re-run the same command to resume from the last checkpoint",
            file=sys.stderr,
        )
        sys.exit(130)
