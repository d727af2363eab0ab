"""The whole pipeline alone and beside another torch job: the wall seconds of each, their ratio, and whether the
runs' models and evaluation answers agree bit for bit (they must: how idle threads wait never changes the arithmetic).

    python bench/pipeline_shared.py [--preset tiny] [--work DIR] [--runs quiet,loaded,quiet_default] [--name NAME]

Runs `bash run_all.sh --preset <preset> --output-dir <work>/quiet` alone, then `<work>/loaded` beside
bench/omp_wait.py's neighbour (small matrix products at torch's default thread count and OpenMP's default wait, as
another user's job would run), each with run_all.sh's own wait setting (GOMP_SPINCOUNT=1000 unless the caller sets
one); then `<work>/quiet_default` alone with OpenMP's default wait (`python -m rlhf.pipeline`, run_all.sh's Python
entry point, without OMP_WAIT_POLICY or GOMP_SPINCOUNT). `--runs` keeps some of the three, in that order. The fair
share of two equal jobs on a machine is 2x. Writes bench/results/<device>-<date>-<name>.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script: bench.* imports from the repo root

from bench.omp_wait import NEIGHBOUR, environment_with  # noqa: E402
from bench.run import device_name  # noqa: E402

RUNS = {  # name -> what the printed line calls it
    "quiet": "alone",
    "loaded": "beside the neighbour",
    "quiet_default": "alone, OpenMP's default wait",
}


def run_pipeline(preset: str, out: Path, default_policy: bool = False) -> float:
    """`bash run_all.sh` for `preset` into `out` (or, with `default_policy`, `python -m rlhf.pipeline` with no wait
    setting), its output in `out`.log -> wall seconds."""
    entry = [sys.executable, "-m", "rlhf.pipeline"] if default_policy else ["bash", "run_all.sh"]
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(out.with_suffix(".log"), "w") as log:
        subprocess.run(
            [*entry, "--preset", preset, "--output-dir", str(out)],
            cwd=REPO,
            env=environment_with({}) if default_policy else None,
            stdout=log,
            stderr=subprocess.STDOUT,
            check=True,
        )
    return time.perf_counter() - started


def digests(run: Path) -> dict[str, str]:
    """sha256 of every model file and every evaluation answer file of a run folder."""
    files = [p for p in sorted(run.rglob("*")) if p.is_file()]
    chosen = [p for p in files if "model" in p.relative_to(run).parts or p.parent.name == "responses"]
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest() for p in chosen}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--work", type=Path, help="where the two run folders go (default: a temporary folder)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--runs", default=",".join(RUNS), help="which of the runs, comma-separated (default: all)")
    parser.add_argument("--name", default="pipeline-shared", help="the results file's name after device and date")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="pipeline-shared-"))

    runs = args.runs.split(",")
    if unknown := set(runs) - set(RUNS):
        parser.error(f"--runs: unknown {', '.join(sorted(unknown))}; choose from {', '.join(RUNS)}")
    seconds = {}
    for name in [run for run in RUNS if run in runs]:
        neighbour = None
        if name == "loaded":
            neighbour = subprocess.Popen([sys.executable, "-c", NEIGHBOUR], env=environment_with({}))
            time.sleep(2)  # its torch import done, its threads running
        try:
            seconds[name] = run_pipeline(args.preset, work / name, default_policy=name == "quiet_default")
        finally:
            if neighbour is not None:
                neighbour.kill()
                neighbour.wait()
        print(f"[pipeline-shared] {RUNS[name]}: {seconds[name]:.0f} s", flush=True)

    files = [digests(work / name) for name in seconds]
    results = {
        "device": device_name(),
        "date": time.strftime("%Y-%m-%d"),
        "command": "python bench/pipeline_shared.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "preset": args.preset,
        "seconds": seconds,
        **(
            {"loaded_over_quiet": seconds["loaded"] / seconds["quiet"]} if {"quiet", "loaded"} <= seconds.keys() else {}
        ),
        **(
            {"quiet_over_quiet_default_policy": seconds["quiet"] / seconds["quiet_default"]}
            if {"quiet", "quiet_default"} <= seconds.keys()
            else {}
        ),
        "files_compared": len(files[0]),
        "identical": all(other == files[0] for other in files[1:]),
    }
    path = args.out / f"{results['device']}-{results['date']}-{args.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results))
    print(f"[pipeline-shared] wrote {path}")


if __name__ == "__main__":
    main()
