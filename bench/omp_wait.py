"""OpenMP's wait policy on a shared CPU: one stage's training steps timed alone and beside another torch job, with
torch's idle OpenMP threads spinning at each barrier (the default: OMP_WAIT_POLICY unset) or sleeping (PASSIVE).

    python bench/omp_wait.py --run outputs/tiny [--stage sft] [--steps 30] [--warmup 3] [--repeats 2]
                             [--spincount N ...]

The neighbour is another torch job of the tiny preset's kind: small matrix products at torch's default thread
count, with the default (spinning) policy, as another user's job would run. Each configuration runs in a fresh
process (`bench/run.py`'s `measure_stage`), interleaved over repeats; the median seconds per step of each is kept.
`--spincount N ...` adds a configuration for each N, libgomp's `GOMP_SPINCOUNT=N` with the policy unset: an idle
thread spins N times before it sleeps (unset: 300,000; PASSIVE: 0; run_all.sh sets 1000). Writes
bench/results/<device>-<date>-omp-wait.json. The policy
changes only how idle threads wait, never the arithmetic, so the stage's results are the same under both
(docs/performance.md says where that was checked).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script: bench.* imports from the repo root

from bench.run import device_name, measure_stage  # noqa: E402

NEIGHBOUR = "import torch\nx = torch.randn(192, 192)\nwhile True:\n    x = torch.tanh(x @ x)\n"
POLICIES = {"default": {}, "PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"}}  # name -> the variables that make it
WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def environment_with(policy: dict[str, str]) -> dict[str, str]:
    """This environment without the caller's own wait settings, plus `policy`'s."""
    return {**{key: value for key, value in os.environ.items() if key not in WAIT_VARIABLES}, **policy}


def seconds_per_step(stage: str, run: Path, preset: str, steps: int, warmup: int, policy: dict[str, str]) -> float:
    """`measure_stage` in a process whose environment has `policy`'s wait settings and no others."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(environment_with(policy))
    try:
        result = measure_stage(stage, run, preset, steps, warmup, [])
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return result["timed_s"] / result["steps"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a run folder with the stage's inputs")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--stage", default="sft", choices=("sft", "reward", "dpo"))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--spincount", type=int, nargs="+", default=[], help="also time GOMP_SPINCOUNT=N (OMP_WAIT_POLICY unset)"
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    policies = dict(POLICIES)
    for count in args.spincount:
        policies[f"spin{count}"] = {"GOMP_SPINCOUNT": str(count)}

    times: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for load in ("quiet", "loaded"):
            neighbour = None
            if load == "loaded":
                neighbour = subprocess.Popen([sys.executable, "-c", NEIGHBOUR], env=environment_with({}))
                time.sleep(2)  # its torch import done, its threads running
            try:
                for name, policy in policies.items():
                    seconds = seconds_per_step(args.stage, args.run, args.preset, args.steps, args.warmup, policy)
                    times.setdefault(f"{load}/{name}", []).append(seconds)
                    print(f"[omp-wait] {load:<6} {name:<7} {seconds:.3f} s/step", flush=True)
            finally:
                if neighbour is not None:
                    neighbour.kill()
                    neighbour.wait()

    median = {key: statistics.median(values) for key, values in times.items()}
    results = {
        "device": device_name(),
        "cpu": next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            None,
        )
        if Path("/proc/cpuinfo").exists()
        else None,
        "date": time.strftime("%Y-%m-%d"),
        "command": "python bench/omp_wait.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "stage": args.stage,
        "steps": args.steps,
        "warmup": args.warmup,
        "seconds_per_step": times,
        "median_seconds_per_step": median,
        "passive_over_default": {
            load: median[f"{load}/PASSIVE"] / median[f"{load}/default"] for load in ("quiet", "loaded")
        },
        "loaded_over_quiet": {name: median[f"loaded/{name}"] / median[f"quiet/{name}"] for name in policies},
        "over_default": {
            f"{load}/{name}": median[f"{load}/{name}"] / median[f"{load}/default"]
            for load in ("quiet", "loaded")
            for name in policies
            if name != "default"
        },
    }
    path = args.out / f"{results['device']}-{results['date']}-omp-wait.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({k: results[k] for k in ("median_seconds_per_step", "over_default", "loaded_over_quiet")}))
    print(f"[omp-wait] wrote {path}")


if __name__ == "__main__":
    main()
