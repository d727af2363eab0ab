"""`bash run_all.sh`: run the stage scripts in order, each as its own process.

    python -m rlhf.pipeline [--preset NAME | --config FILE] [--output-dir DIR] [--only a,b | --from STAGE]
                            [--force] [section.key=value ...]        (--help lists them)

A stage that already completed for the same config is skipped (without starting its process), so
re-running the pipeline after a change re-runs only the stages the change reaches. Set RLHF_LAUNCH to start each
stage under a launcher, e.g. `accelerate launch --config_file configs/accelerate/ddp.yaml` or
`torchrun --nproc_per_node 8` (docs/scaling.md, "Many GPUs (accelerate)"; `rlhf.pipeline.launch`). Before any stage
runs, every chosen stage's config rules and batch arithmetic (`rlhf.methods.rules`), for the number of processes the
launcher starts, are checked, each kind naming every broken setting at once.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

from rlhf.core.errors import UserError
from rlhf.core.stages import ONLINE_STAGES, PAIR_READERS, STAGES
from rlhf.data import read_demonstrations, read_jsonl, unique_prompts
from rlhf.methods.rules import check_batch_splits, check_stages
from rlhf.pipeline.launch import launched_processes, launcher_command, run_launched
from rlhf.pipeline.stage_process import preload, run_stage_script
from rlhf.stage.cli import (
    KEYS_HELP,
    REPO_ROOT,
    add_run_arguments,
    already_complete_line,
    parse_stage_args,
    run_arguments,
    say,
)
from rlhf.stage.run import collect_needed, judge_needed, write_json_atomic
from rlhf.stage.signals import Interrupted


def select_stages(
    only: str | None,
    start: str | None,
    with_collect: bool = True,
    with_judge: bool = False,
    preset_stages: str = "",
) -> list[str]:
    """The stages to run, in pipeline order. `collect` runs when named in --only, or when
    `with_collect` (some stage trains on collected pairs); otherwise nothing would read its pairs. `judge_rm`
    likewise runs when named, or `with_judge` (data.judge_fraction holds pairs out for it). `preset_stages`
    (run.stages) replaces every stage as the choice of a run without --only, and --from starts within it."""
    if only:
        chosen = stage_names(only, "--only")
        return [stage for stage in STAGES if stage in chosen]
    if preset_stages:
        listed = stage_names(preset_stages, "run.stages")
        available = [stage for stage in STAGES if stage in listed]
    else:
        available = [
            stage for stage in STAGES if (with_collect or stage != "collect") and (with_judge or stage != "judge_rm")
        ]
    if start:
        if start not in STAGES:
            raise UserError(f"unknown stage '{start}' in --from; stages are: {', '.join(STAGES)}")
        # `--from collect` names collect, so it runs even when no stage reads its pairs (as with --only)
        order = list(STAGES)
        return [stage for stage in order[order.index(start) :] if stage in available or stage == start]
    return available


def stage_names(listed: str, option: str) -> list[str]:
    """A comma-separated list of stages (`option`: where it was given), every name known."""
    names = [name.strip() for name in listed.split(",") if name.strip()]
    if unknown := [name for name in names if name not in STAGES]:
        raise UserError(f"unknown stage(s) {', '.join(unknown)} in {option}; stages are: {', '.join(STAGES)}")
    return names


def resume_command(failed: str, stages: list[str], only: str | None, stage_args: list[str]) -> str:
    """The command that re-runs the failed stage and the stages after it that this run was to run: `--only`
    those stages when the run chose its stages with --only (--from would add stages it never asked for),
    else `--from` the failed stage. After --force, two commands: the failed stage without it (--force would
    delete the checkpoint it resumes from), then the stages after it with it."""

    def command(start: str, args: list[str]) -> str:
        selection = f"--only {','.join(stages[stages.index(start) :])}" if only else f"--from {start}"
        return f"bash run_all.sh {selection} {shlex.join(args)}".rstrip()

    if "--force" not in stage_args:
        return command(failed, stage_args)
    resume = f"bash run_all.sh --only {failed} {shlex.join(arg for arg in stage_args if arg != '--force')}".rstrip()
    after = stages[stages.index(failed) + 1 :]
    return f"{resume}, then {command(after[0], stage_args)}" if after else resume


def record_pipeline_total(run, seconds: float | None) -> None:
    """`timing_s.pipeline_total`: the wall-clock seconds of an invocation that ran every stage of the pipeline
    (process start-ups included); None removes it, as after an invocation that re-ran only some stages, whose
    total would describe neither that run nor the stage timings beside it."""
    if seconds is not None:
        run.update_summary({"timing_s": {"pipeline_total": round(seconds, 2)}})
        return
    summary = run.read_summary()
    if "pipeline_total" in summary.get("timing_s", {}):
        del summary["timing_s"]["pipeline_total"]
        write_json_atomic(run.summary_path, summary)


def stage_command(stage: str, stage_args: list[str], launch: str) -> list[str]:
    """The command that starts one stage under `launch` (RLHF_LAUNCH, e.g. "accelerate launch --config_file
    configs/accelerate/ddp.yaml", `rlhf.pipeline.launch.launcher_command`)."""
    return [*launcher_command(launch), str(REPO_ROOT / STAGES[stage].script), *stage_args]


def run_stage_process(stage: str, stage_args: list[str], launch: str) -> tuple[int, str | None]:
    """Run one stage in its own process (`rlhf.pipeline.stage_process`), or under `launch` when it is set and the
    stage has work to share out (not `StageSpec.one_process`); -> (exit code, its one-line error when a
    launcher's report of the failure would have buried it, `rlhf.pipeline.launch.run_launched`; None when the
    stage said it itself)."""
    if launch and not STAGES[stage].one_process:
        return run_launched(stage_command(stage, stage_args, launch))
    return run_stage_script(REPO_ROOT / STAGES[stage].script, stage_args), None


def data_sizes(cfg, run, stages: list[str]) -> dict[str, int]:
    """What each chosen stage will train on, counted from the data stage's files as the stage counts it: SFT's
    demonstrations, the reward model's and DPO's training pairs (when their source is written: collected pairs
    only once the collect stage has run; DPO's capped by dpo.max_train_pairs), and the online stages' distinct
    training prompts."""
    data = run.stage("data")
    if not (data / "train.jsonl").is_file():  # no training split written: each stage says so itself
        return {}
    sizes = {"sft": len(read_demonstrations(data, "train", cfg.data.sft_path is not None))}
    for stage in PAIR_READERS:
        if (source := getattr(cfg, stage).pairs) == "dataset" or run.is_complete("collect", cfg):
            sizes[stage] = len(run.training_pairs(source))
    if "dpo" in sizes and cfg.dpo.max_train_pairs is not None:
        sizes["dpo"] = min(sizes["dpo"], cfg.dpo.max_train_pairs)
    prompts = len(unique_prompts(read_jsonl(data / "train.jsonl")))
    sizes |= dict.fromkeys(ONLINE_STAGES, prompts)
    return {stage: n for stage, n in sizes.items() if stage in stages}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """run_all.sh's arguments: the stages to run, and the arguments every stage script takes (given to each)."""
    parser = argparse.ArgumentParser(
        prog="bash run_all.sh",
        description="Run the RLHF pipeline's stages in order, each as its own process. A stage that already "
        "completed for this config is skipped, so after a change only the stages it reaches run again.",
        epilog=f"Stages, in order: {', '.join(STAGES)} (collect runs when reward.pairs or dpo.pairs reads its pairs, "
        "judge_rm when data.judge_fraction > 0, or either when named). "
        f"{KEYS_HELP} RLHF_LAUNCH='accelerate launch ...' starts each stage under a launcher (docs/scaling.md).",
    )
    parser.add_argument("--only", metavar="STAGE,...", help="run only these stages (comma-separated)")
    parser.add_argument("--from", dest="start", metavar="STAGE", help="run this stage and every later one")
    add_run_arguments(parser)
    return parser.parse_intermixed_args(argv)  # overrides may come before and after the flags


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)  # before torch loads (below): --help and a mistyped flag answer at once
    preload()  # the libraries every stage imports, once, before any other work (rlhf.pipeline.stage_process)
    from rlhf.models.modeling import check_context_from_config
    from rlhf.rollout.engines import check_engine

    if args.only and args.start:
        raise UserError("give --only or --from, not both")
    stage_args = [*(["--force"] if args.force else []), *run_arguments(args)]  # what each stage script gets
    # Validate the config once, before any stage starts: a typo fails here, not an hour in.
    cfg, run, force = parse_stage_args("pipeline", stage_args)
    check_context_from_config(cfg.model, cfg.data)  # the model's positions, before the data stage runs
    stages = select_stages(args.only, args.start, collect_needed(cfg), judge_needed(cfg), preset_stages=cfg.run.stages)
    # each chosen stage's config rules, every broken one named at once; a stage that will be skipped needs none
    check_stages(cfg, [stage for stage in stages if force or not run.is_complete(stage, cfg)])
    if samplers := [stage for stage in stages if "rollout" in STAGES[stage].sections]:
        check_engine(cfg.rollout, samplers[0])  # rollout.engine=vllm where vLLM is not installed: now, not at RAFT
    launch = os.environ.get("RLHF_LAUNCH", "")
    world_size = launched_processes(launch) if launch else 1
    check_batch_splits(cfg, stages, world_size)  # from the config alone
    # Every input the chosen stages need must be complete or among them: name all that are not, at once.
    if unbuilt := run.unfinished(stages, cfg, will_run=stages):
        listed = args.only or (cfg.run.stages if not args.start else None)  # a list of stages, not a start
        selection = (
            f"--only {','.join(stage for stage in STAGES if stage in unbuilt or stage in stages)}"
            if listed
            else f"--from {unbuilt[0]}"
        )
        chosen = f"--only {args.only}" if args.only else f"--from {args.start}" if args.start else "run.stages"
        raise run.unfinished_error(
            unbuilt,
            cfg,
            f"bash run_all.sh {selection} {shlex.join(arg for arg in stage_args if arg != '--force')}",
            skipped=f", and {chosen} does not run {'it' if len(unbuilt) == 1 else 'them'}",
        )
    if run.is_complete("data", cfg):  # the data is there: what each stage trains on must fit its batches too
        check_batch_splits(cfg, stages, world_size, data_sizes(cfg, run, stages))
    print(f"[pipeline] stages: {', '.join(stages)} -> {run.root}")
    pipeline_start = time.perf_counter()
    ran = []
    for stage in stages:
        if run.is_complete(stage, cfg) and not force:  # what the stage itself would decide, without its start-up
            print(already_complete_line(stage, run))
            continue
        started = time.perf_counter()
        try:
            returncode, error = run_stage_process(stage, stage_args, launch)
        except Interrupted as stop:  # Ctrl-C or SIGTERM: the stage keeps its last checkpoint
            say(
                f"[pipeline] stopped by {stop} in stage '{stage}'; resume with: "
                + resume_command(stage, stages, args.only, stage_args)
            )
            sys.exit(stop.exit_code)
        if returncode != 0:
            returncode = 2 if error else returncode  # the stage's own exit code, which the launcher replaced
            if error:
                print(error, file=sys.stderr)
            print(
                f"[pipeline] stage '{stage}' failed (exit {returncode}); fix it and resume with: "
                + resume_command(stage, stages, args.only, stage_args),
                file=sys.stderr,
            )
            sys.exit(returncode)
        ran.append(stage)
        print(f"[pipeline] {stage} done in {time.perf_counter() - started:.1f}s")
        if stage == "data":  # every later stage's batches against the data just written, all at once, before any runs
            check_batch_splits(cfg, stages, world_size, data_sizes(cfg, run, stages))
    total = time.perf_counter() - pipeline_start
    if not ran:
        print(f"[pipeline] every stage was already complete for this config; results in {run.summary_path}")
        return
    whole = not (args.only or args.start) and ran == stages
    record_pipeline_total(run, total if whole else None)
    print(
        f"[pipeline] {'finished' if whole else 'ran ' + ', '.join(ran)} in {total:.0f}s; results in {run.summary_path}"
    )
