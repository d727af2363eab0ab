"""The whole pipeline alone and beside another torch job: the wall seconds of each, their ratio, and whether the two
runs' models and evaluation answers agree bit for bit (they must: how idle threads wait never changes the arithmetic).

    python bench/pipeline_shared.py [--preset tiny] [--work DIR]

Runs `bash run_all.sh --preset <preset> --output-dir <work>/quiet` alone, then `<work>/loaded` beside
bench/omp_wait.py's neighbour (small matrix products at torch's default thread count and the default, spinning,
wait policy, as another user's job would run), each with run_all.sh's own settings (OMP_WAIT_POLICY=PASSIVE unless
the caller sets it); then `<work>/quiet_default` alone with OpenMP's default wait policy (`python -m rlhf.pipeline`,
run_all.sh's Python entry point, without the variable), the policy before run_all.sh set one. The fair share of two
equal jobs on a machine is 2x. Writes bench/results/<device>-<date>-pipeline-shared.json.
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
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="pipeline-shared-"))

    quiet_s = run_pipeline(args.preset, work / "quiet")
    print(f"[pipeline-shared] alone: {quiet_s:.0f} s", flush=True)
    neighbour = subprocess.Popen([sys.executable, "-c", NEIGHBOUR], env=environment_with({}))
    try:
        time.sleep(2)  # its torch import done, its threads running
        loaded_s = run_pipeline(args.preset, work / "loaded")
    finally:
        neighbour.kill()
        neighbour.wait()
    print(f"[pipeline-shared] beside the neighbour: {loaded_s:.0f} s", flush=True)
    default_s = run_pipeline(args.preset, work / "quiet_default", default_policy=True)
    print(f"[pipeline-shared] alone, OpenMP's default wait policy: {default_s:.0f} s", flush=True)

    quiet, loaded, default = (digests(work / name) for name in ("quiet", "loaded", "quiet_default"))
    results = {
        "device": device_name(),
        "date": time.strftime("%Y-%m-%d"),
        "command": "python bench/pipeline_shared.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "preset": args.preset,
        "quiet_s": quiet_s,
        "loaded_s": loaded_s,
        "quiet_default_policy_s": default_s,
        "loaded_over_quiet": loaded_s / quiet_s,
        "quiet_over_quiet_default_policy": quiet_s / default_s,
        "files_compared": len(quiet),
        "identical": quiet == loaded == default,
    }
    path = args.out / f"{results['device']}-{results['date']}-pipeline-shared.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results))
    print(f"[pipeline-shared] wrote {path}")


if __name__ == "__main__":
    main()
