"""Fault injection: kill stages at random points, resume them, and check they end where an uninterrupted run ends.

    python -m rlhf.pipeline.faults --preset tiny --trials 3 [--stages sft,reward,ppo,...] [--output-dir DIR]

The runner builds one small run folder (data -> sft -> reward on `FAULT_OVERRIDES`, budgets of a
few seconds per stage), then for each stage runs it once uninterrupted (the reference) and `trials`
times with one SIGKILL each, re-running the same command until the stage completes. The kill is
chosen per trial, from a seed, among three kinds:

    time        SIGKILL from outside after a random share of the reference's wall time
    checkpoint  the stage kills itself halfway through writing its k-th checkpoint (weights and
                optimizer written, RNG and state.json not yet)
    publish     the stage kills itself between the two renames that publish its k-th folder (a
                checkpoint, or the final model), the moment only `<name>.old` is complete

A trial *survived* when the stage completed, every re-run resumed from exactly the step of the
last complete checkpoint on disk (the data position is a function of the step), and the folder it
would load held every file, weights that parse included: it never loads a partial checkpoint.
It is *identical* when its final weights are bitwise equal to the reference's, and so are its
summary.json results, metrics.jsonl and samples, timings and memory left out (`VOLATILE_KEYS`).
On CPU with one thread per process the kernels are deterministic, so no tolerance is needed.
The table (stage, trials, survived, identical) is printed and written to `<output-dir>/faults.json`.

The stages carry one hook for this, `rlhf.stage.fault_points.fault_point(name)`, a no-op unless the environment
variable RLHF_FAULT names that point.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rlhf.core.stages import STAGES, TRAINED_STAGES
from rlhf.models.checkpoint import STATE_FILE, resolve_complete
from rlhf.stage.fault_points import FAULT_ENV

REPO_ROOT = Path(__file__).resolve().parents[2]
STAGE_ORDER = (*TRAINED_STAGES, "eval")  # every stage trained with its own settings, then the evaluation

# Small budgets: each stage a few seconds to a minute on one CPU core, with a checkpoint every
# step or two so that kills land between, and inside, many checkpoint writes.
FAULT_OVERRIDES = [
    "data.embedded.n_train_pairs=1200",
    "data.embedded.n_test_pairs=200",
    "run.log_every=2",
    "sft.max_steps=24",
    "sft.save_every=4",
    "sft.gold_eval_prompts=16",
    "sft.num_samples=2",
    "reward.max_steps=24",
    "reward.save_every=4",
    "ppo.total_episodes=96",
    "ppo.batch_size=16",
    "ppo.micro_batch_size=8",
    "ppo.epochs=2",
    "ppo.max_new_tokens=16",
    "ppo.eval_prompts=16",
    "ppo.save_every=1",
    "ppo.samples_every=1",
    "ppo.cpu_threads=1",
    "grpo.total_episodes=96",
    "grpo.batch_size=16",
    "grpo.micro_batch_size=8",
    "grpo.max_new_tokens=16",
    "grpo.eval_prompts=16",
    "grpo.save_every=1",
    "grpo.samples_every=1",
    "grpo.cpu_threads=1",
    "raft.rounds=6",
    "raft.prompts_per_round=8",
    "raft.samples_per_prompt=4",
    "raft.batch_size=8",
    "raft.micro_batch_size=8",
    "raft.max_new_tokens=16",
    "raft.eval_prompts=16",
    "raft.cpu_threads=1",
    "dpo.max_train_pairs=256",
    "dpo.batch_size=16",
    "dpo.micro_batch_size=16",
    "dpo.save_every=4",
    "dpo.eval_prompts=16",
    "online_dpo.total_episodes=96",
    "online_dpo.batch_size=16",
    "online_dpo.micro_batch_size=8",
    "online_dpo.forward_batch_size=16",
    "online_dpo.max_new_tokens=16",
    "online_dpo.eval_prompts=16",
    "online_dpo.save_every=1",
    "online_dpo.samples_every=1",
    "online_dpo.cpu_threads=1",
    "eval.num_prompts=48",
    "eval.best_of_n=4",
    "eval.best_of_n_prompts=8",
    "eval.judges=gold,reward",
]
# built once: the inputs the stages under test cannot run without (data, sft, reward), all that they read here
UPSTREAM = tuple(name for name in STAGES if any(name in STAGES[stage].inputs for stage in STAGE_ORDER))
KILL_KINDS = ("time", "checkpoint", "publish")
# the stages under test that train nothing, so keep no checkpoint (eval): killed at random times only (mid-judging);
# a re-run redoes them from the start
NO_CHECKPOINT_STAGES = tuple(stage for stage in STAGE_ORDER if STAGES[stage].trains_as is None)
MAX_RUNS = 4  # runs of one trial's command before it counts as not surviving
# Keys that measure the machine rather than the computation (speed, memory), or say how the run went (resumed
# from where, what was read from a cache); left out of comparisons.
VOLATILE_KEYS = re.compile(r"time|_s$|_per_s|memory|resumed_from|timing|cached")
RESUMED = re.compile(r"resumed from (?:step|iteration) (\d+)")


@dataclass
class Trial:
    stage: str
    index: int
    kill: str  # a KILL_KINDS entry, with its parameter: "time 7.3s", "checkpoint 2", "publish 3"
    runs: list[dict] = field(default_factory=list)  # per run: exit code, seconds, expected and actual resume step
    survived: bool = False
    identical: bool = False
    problem: str | None = None  # why it did not survive or is not identical


def stage_command(stage: str, run_dir: Path, preset: str, extra: list[str]) -> list[str]:
    script = REPO_ROOT / STAGES[stage].script
    return [sys.executable, str(script), "--preset", preset, "--output-dir", str(run_dir), *FAULT_OVERRIDES, *extra]


def run_command(
    command: list[str], fault: str | None = None, kill_after: float | None = None
) -> tuple[int, str, float]:
    """Run a stage; with `kill_after` seconds, SIGKILL it then if it is still running. -> exit code, output, seconds."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    env.pop(FAULT_ENV, None)
    if fault:
        env[FAULT_ENV] = fault
    started = time.perf_counter()
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO_ROOT, env=env
    )
    try:
        output, _ = process.communicate(timeout=kill_after)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGKILL)
        output, _ = process.communicate()
    return process.returncode, output, time.perf_counter() - started


def loadable_checkpoint_step(checkpoint: Path) -> int | None:
    """The step a stage would resume from (None: none), after checking that the folder it would load
    is whole: state.json, optimizer and RNG state present, and weights that parse."""
    from safetensors.torch import load_file

    folder = resolve_complete(checkpoint, STATE_FILE)
    if folder is None:
        return None
    missing = [name for name in ("model.safetensors", "optimizer.pt", "rng.pt") if not (folder / name).is_file()]
    if missing:
        raise AssertionError(f"{folder} is marked complete but lacks {', '.join(missing)}")
    load_file(folder / "model.safetensors")  # raises on a truncated or damaged file
    state = json.loads((folder / STATE_FILE).read_text())
    return state.get("step", state.get("iteration"))


def stable(value):
    """`value` (parsed JSON) without its `VOLATILE_KEYS`, for comparing two runs."""
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if not VOLATILE_KEYS.search(k)}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


def outcome(run_dir: Path, stage: str) -> dict:
    """What two runs of `stage` must agree on: final weights, results, metric rows, samples."""
    from safetensors.torch import load_file

    folder = run_dir / stage
    weights = folder / "model" / "model.safetensors"
    read_rows = lambda path: [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []  # noqa: E731
    return {
        "weights": load_file(weights) if weights.is_file() else {},
        "summary": stable(json.loads((run_dir / "summary.json").read_text()).get(STAGES[stage].summary_section)),
        "metrics": stable(read_rows(folder / "metrics.jsonl")),
        "samples": [stable(read_rows(path)) for path in sorted(folder.glob("*samples.jsonl"))],
        "win_rates": stable(json.loads(p.read_text())) if (p := folder / "win_rates.json").is_file() else None,
    }


def differences(reference: dict, trial: dict) -> list[str]:
    """The parts of `outcome` where the trial differs from the reference (bitwise for weights)."""
    import torch

    found = []
    ref_weights, trial_weights = reference["weights"], trial["weights"]
    if ref_weights.keys() != trial_weights.keys() or not all(
        torch.equal(ref_weights[k], trial_weights[k]) for k in ref_weights
    ):
        found.append("weights")
    found += [part for part in ("summary", "metrics", "samples", "win_rates") if reference[part] != trial[part]]
    return found


def fresh_folder(base: Path, folder: Path, stage: str) -> None:
    """A run folder holding copies of the stages of `base` that `stage` reads (and the summary)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for upstream in set(STAGES[stage].inputs) & set(UPSTREAM):
        shutil.copytree(base / upstream, folder / upstream)
    shutil.copy(base / "summary.json", folder / "summary.json")


def choose_kill(rng: random.Random, stage: str, index: int, reference_s: float) -> tuple[str, str | None, float | None]:
    """Trial `index`'s kill: (description, RLHF_FAULT value or None, seconds before an outside SIGKILL or None).
    The kinds take turns so every kind is tried once in three trials; the parameter is random."""
    kind = "time" if stage in NO_CHECKPOINT_STAGES else KILL_KINDS[index % len(KILL_KINDS)]
    if kind == "time":
        seconds = round(rng.uniform(0.25, 0.95) * reference_s, 1)  # the first quarter is mostly start-up
        return f"time {seconds}s", None, seconds
    # Every budget above writes at least 3 checkpoints; a publish kill only leaves `.old` from the second on.
    nth = rng.randint(1 if kind == "checkpoint" else 2, 3)
    return f"{kind} {nth}", f"kill@{kind}:{nth}", None


def run_trial(trial: Trial, command: list[str], checkpoint: Path, fault: str | None, kill_after: float | None) -> None:
    """Kill once as chosen, then re-run the same command until it completes (at most MAX_RUNS runs)."""
    for attempt in range(MAX_RUNS):
        try:
            expected = loadable_checkpoint_step(checkpoint)
        except Exception as exc:  # a partial folder that would be loaded: the failure this runner looks for
            trial.problem = f"run {attempt + 1} would load a partial checkpoint: {exc}"
            return
        first = attempt == 0
        code, output, seconds = run_command(command, fault if first else None, kill_after if first else None)
        resumed = RESUMED.search(output)
        actual = int(resumed.group(1)) if resumed else None
        trial.runs.append({"exit": code, "seconds": round(seconds, 1), "expected_resume": expected, "resumed": actual})
        if actual != expected:
            trial.problem = f"run {attempt + 1} resumed from {actual}, the checkpoint on disk holds {expected}"
            return
        if code == -signal.SIGKILL:
            continue
        if code != 0:
            trial.problem = f"run {attempt + 1} exited {code}: {output.strip().splitlines()[-1:]}"
            return
        trial.survived = True
        return
    trial.problem = f"not complete after {MAX_RUNS} runs"


def try_stage(stage: str, base: Path, work: Path, preset: str, trials: int, seed: int) -> list[Trial]:
    """The reference run of `stage`, then `trials` killed-and-resumed runs compared with it."""
    reference_dir = work / stage / "reference"
    fresh_folder(base, reference_dir, stage)
    code, output, reference_s = run_command(stage_command(stage, reference_dir, preset, []))
    if code != 0:
        raise SystemExit(f"the reference run of {stage} failed (exit {code}):\n{output[-3000:]}")
    reference = outcome(reference_dir, stage)
    print(f"[faults] {stage}: reference run {reference_s:.0f}s", flush=True)
    results = []
    for index in range(trials):
        rng = random.Random(f"{seed}:{stage}:{index}")
        kill, fault, kill_after = choose_kill(rng, stage, index, reference_s)
        trial = Trial(stage, index, kill)
        trial_dir = work / stage / f"trial_{index}"
        fresh_folder(base, trial_dir, stage)
        run_trial(
            trial, stage_command(stage, trial_dir, preset, []), trial_dir / stage / "checkpoint", fault, kill_after
        )
        if trial.survived:
            differing = differences(reference, outcome(trial_dir, stage))
            trial.identical = not differing
            trial.problem = f"differs from the reference in {', '.join(differing)}" if differing else None
        runs = " -> ".join(f"exit {r['exit']} (resumed {r['resumed']})" for r in trial.runs)
        verdict = "identical" if trial.identical else ("survived" if trial.survived else "FAILED")
        print(
            f"[faults] {stage} trial {index}: kill at {kill}: {runs}: {verdict}"
            + (f" ({trial.problem})" if trial.problem else ""),
            flush=True,
        )
        results.append(trial)
        shutil.rmtree(trial_dir)
    shutil.rmtree(reference_dir)
    return results


def build_base(base: Path, preset: str) -> None:
    """data -> sft -> reward once, on the same small budgets, for every stage under test to copy (a
    later run of the runner reuses them, as any stage skips when complete for the same config)."""
    for stage in UPSTREAM:
        code, output, seconds = run_command(stage_command(stage, base, preset, []))
        if code != 0:
            raise SystemExit(f"building the base run failed at {stage} (exit {code}):\n{output[-3000:]}")
        print(f"[faults] base run: {stage} {seconds:.0f}s", flush=True)


def table(trials: list[Trial], stages: list[str]) -> list[dict]:
    """Per stage: trials run, how many survived, how many finished identical to the reference."""
    rows = []
    for stage in stages:
        mine = [t for t in trials if t.stage == stage]
        rows.append(
            {
                "stage": stage,
                "trials": len(mine),
                "survived": sum(t.survived for t in mine),
                "identical": sum(t.identical for t in mine),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlhf.pipeline.faults", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny", help="configs/NAME.yaml (default: tiny)")
    parser.add_argument("--trials", type=int, default=3, help="killed runs per stage (default: 3, one per kill kind)")
    parser.add_argument(
        "--stages", default=",".join(STAGE_ORDER), help=f"comma-separated (default: all of {', '.join(STAGE_ORDER)})"
    )
    parser.add_argument(
        "--output-dir", default=str(REPO_ROOT / "outputs" / "faults"), help="work folder (default: outputs/faults)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seeds the kill times and counts")
    args = parser.parse_args(argv)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = sorted(set(stages) - set(STAGE_ORDER))
    if unknown or args.trials < 1:
        parser.error(
            f"unknown stage(s) {', '.join(unknown)}; choose from {', '.join(STAGE_ORDER)}"
            if unknown
            else "--trials must be at least 1"
        )

    started = time.perf_counter()
    work = Path(args.output_dir)
    base = work / "base"
    build_base(base, args.preset)
    trials = [t for stage in stages for t in try_stage(stage, base, work, args.preset, args.trials, args.seed)]
    rows = table(trials, stages)
    elapsed = time.perf_counter() - started

    print(f"\n{'stage':<10} {'trials':>6} {'survived':>8} {'identical':>9}")
    for row in rows:
        print(f"{row['stage']:<10} {row['trials']:>6} {row['survived']:>8} {row['identical']:>9}")
    print(f"{len(trials)} trials in {elapsed:.0f}s; details in {work / 'faults.json'}")
    report = {
        "command": " ".join(["python -m rlhf.pipeline.faults", *(argv if argv is not None else sys.argv[1:])]),
        "seconds": round(elapsed, 1),
        "table": rows,
        "trials": [asdict(t) for t in trials],
    }
    (work / "faults.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0 if all(t.identical for t in trials) else 1


if __name__ == "__main__":
    sys.exit(main())
