"""What a stage process costs to start, in a fresh interpreter against forked from a process that imported the
libraries once (`rlhf/pipeline/stage_process.py`, as run_all.sh, seeds.py and the tests start stages).

Two workloads on a copy of a run folder's data, sft and reward stages (the tiny preset's):
- `complete`: the GRPO script on a run where GRPO is complete; it imports, reads its config and exits, so this is
  the start alone;
- `grpo-1-iteration`: one GRPO iteration, 16 prompts x 4 samples, and a 16-prompt evaluation: a short stage as the
  end-to-end tests run them.

    python bench/stage_start.py --run outputs/tiny [--repeats 5] [--out bench/results] [section.key=value ...]

(the overrides the run folder was made with, if any).

Each is timed from the start of `run_stage_script` to the stage's exit, `--repeats` times each way, alternating.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlhf.pipeline.stage_process import fork_supported, preload, run_stage_script

preload()  # first, before anything runs torch code: what run_all.sh does

from bench.run import device_name  # noqa: E402  (after the preload, on purpose)
from rlhf.stage.cli import REPO_ROOT  # noqa: E402
from rlhf.stage.run import STAGE_SCRIPTS  # noqa: E402

GRPO = REPO_ROOT / STAGE_SCRIPTS["grpo"]
ONE_ITERATION = ["grpo.total_episodes=64", "grpo.batch_size=64", "grpo.eval_prompts=16"]


def timed(args: list[str], fork: bool, log: Path) -> float:
    """Seconds to run GRPO with `args` to its end, forked or in a fresh interpreter (RLHF_FORK_STAGES)."""
    os.environ["RLHF_FORK_STAGES"] = "1" if fork else "0"
    started = time.perf_counter()
    code = run_stage_script(GRPO, args, output=log)
    elapsed = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"grpo exited {code}:\n{log.read_text()[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", default="outputs/tiny", help="a tiny-preset run folder with data, sft and reward")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", help="write <device>-<date>-stage-start.json here")
    parser.add_argument("overrides", nargs="*", help="section.key=value overrides the run folder was made with")
    args = parser.parse_args()
    if not fork_supported():
        raise SystemExit("stages are not forked here (rlhf.pipeline.stage_process.fork_supported): nothing to compare")
    run = Path(args.run)
    with tempfile.TemporaryDirectory(prefix="stage-start-") as folder:
        copy = Path(folder) / "run"
        for stage in ("data", "sft", "reward"):
            shutil.copytree(run / stage, copy / stage, symlinks=True)
        shutil.copy(run / "summary.json", copy / "summary.json")
        base, overrides = ["--preset", "tiny", "--output-dir", str(copy)], [*args.overrides, *ONE_ITERATION]
        log = Path(folder) / "stage.log"
        timed([*base, *overrides], fork=False, log=log)  # GRPO complete, and the files cached
        workloads = {"complete": [*base, *overrides], "grpo-1-iteration": [*base, "--force", *overrides]}
        results = {}
        for name, stage_args in workloads.items():
            times = {"fresh": [], "forked": []}
            for _ in range(args.repeats):
                for way in times:
                    times[way].append(round(timed(stage_args, way == "forked", log), 3))
            medians = {way: statistics.median(values) for way, values in times.items()}
            results[name] = {
                "seconds": times,
                "median_s": medians,
                "saved_s": round(medians["fresh"] - medians["forked"], 3),
                "speedup": round(medians["fresh"] / medians["forked"], 2),
            }
            print(
                f"{name}: fresh {medians['fresh']:.2f} s, forked {medians['forked']:.2f} s "
                f"(median of {args.repeats}; {results[name]['speedup']:.2f}x)"
            )
    if args.out:
        import torch
        import transformers

        record = {
            "device": device_name(),
            "date": date.today().isoformat(),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "command": "python bench/stage_start.py " + " ".join(sys.argv[1:]),
            "results": results,
        }
        path = Path(args.out) / f"{record['device']}-{record['date']}-stage-start.json"
        path.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
