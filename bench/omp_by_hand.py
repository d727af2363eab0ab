"""A stage script started by hand, as a user types it, alone and beside another torch job: with the shell's
GOMP_SPINCOUNT unset (the stage then sets run_all.sh's 1000 itself, `rlhf.stage.cli.default_openmp_wait`) and with
libgomp's own default spin count, 300,000, which is what a stage started by hand spun before.

    python bench/omp_by_hand.py --run outputs/tiny [--epochs 0.5] [--preset tiny]

Each case runs `python part1_reward/train_sft.py --preset tiny --output-dir <copy> sft.epochs=<epochs>` on a copy of
the run's data stage, in a fresh process, and times the whole command (start-up included). The neighbour is
bench/omp_wait.py's: small matrix products on two threads with OpenMP's default wait. The four SFT models must be
byte-identical (the wait changes how idle threads wait, not what they compute); the script checks it. Writes
bench/results/<device>-<date>-omp-by-hand.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script: bench.* imports from the repo root

from bench.omp_wait import NEIGHBOUR, environment_with  # noqa: E402
from bench.run import device_name  # noqa: E402

SETTINGS = {
    "unset (the stage's default)": {},
    "GOMP_SPINCOUNT=300000 (libgomp's default)": {"GOMP_SPINCOUNT": "300000"},
}


def timed_sft(run: Path, work: Path, preset: str, epochs: float, env: dict[str, str]) -> tuple[float, str]:
    """Seconds of one hand-started SFT on a copy of `run`'s data stage, and the sha256 of the model it wrote."""
    shutil.copytree(run / "data", work / "data")
    shutil.copy(run / "summary.json", work / "summary.json")
    command = [sys.executable, str(REPO / "part1_reward" / "train_sft.py"), "--preset", preset, "--output-dir"]
    start = time.perf_counter()
    subprocess.run([*command, str(work), f"sft.epochs={epochs}"], env=env, cwd=REPO, check=True, capture_output=True)
    seconds = time.perf_counter() - start
    return seconds, hashlib.sha256((work / "sft" / "model" / "model.safetensors").read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a run folder whose data stage completed")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--epochs", type=float, default=0.5)
    args = parser.parse_args(argv)
    rows, digests = [], set()
    with tempfile.TemporaryDirectory() as tmp:
        for name, setting in SETTINGS.items():
            for beside in (False, True):
                env = environment_with(setting)
                neighbour = None
                if beside:
                    neighbour = subprocess.Popen([sys.executable, "-c", NEIGHBOUR], env=environment_with({}))
                    time.sleep(2)  # its torch import done, its threads running
                try:
                    seconds, digest = timed_sft(args.run, Path(tmp) / f"{len(rows)}", args.preset, args.epochs, env)
                finally:
                    if neighbour is not None:
                        neighbour.kill()
                        neighbour.wait()
                digests.add(digest)
                rows.append({"setting": name, "beside_neighbour": beside, "seconds": round(seconds, 1)})
                print(f"{name:45s} {'beside the neighbour' if beside else 'alone':22s} {seconds:7.1f} s", flush=True)
    if len(digests) != 1:
        raise SystemExit(
            f"the SFT models differ between the cases ({len(digests)} distinct): the wait changed a result"
        )
    out = REPO / "bench" / "results" / f"{device_name()}-{time.strftime('%Y-%m-%d')}-omp-by-hand.json"
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    record = {
        "command": " ".join(["python bench/omp_by_hand.py", *(argv if argv is not None else sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%d"),
        "cpu": next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if "model name" in line), None),
        "avx512f": "avx512f" in flags,
        "amx": any(flag.startswith("amx") for flag in flags),
        "rows": rows,
        "models_identical": True,
    }
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
