"""The command-line contract shared by every stage script.

    python <stage script> [--preset NAME | --config FILE] [--output-dir DIR] [--force] [section.key=value ...]

Errors a user can cause (bad keys, types, files, missing upstream stages, an output folder it
cannot write) surface as one line on stderr and exit code 2, before any model is loaded. SIGTERM
and Ctrl-C save a checkpoint and exit 143 and 130 (`rlhf.stage.signals`); CUDA running out of memory
is one line naming the micro-batch key to lower.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from rlhf.core.errors import UserError
from rlhf.core.stages import STAGES
from rlhf.stage.config import dump_yaml, load_config, preset_path
from rlhf.stage.run import STAGE_SCRIPTS, RunDir, config_inputs, write_text_atomic
from rlhf.stage.schema import Config
from rlhf.stage.signals import Interrupted, graceful_stops

REPO_ROOT = Path(__file__).resolve().parents[2]
ERROR_FILE_ENV = "RLHF_ERROR_FILE"  # a launched stage writes its one-line error here (rlhf.pipeline.launch)
KEYS_HELP = (
    "Every config key, with a comment, is in rlhf/stage/schema.py (the presets in configs/); docs/configuration.md "
    "lists them and explains the main ones."
)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments every stage script and run_all.sh take: the config, the run folder, --force, overrides."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--preset", help="configs/NAME.yaml (default: tiny)")
    source.add_argument("--config", help="any YAML config file, e.g. a stage folder's config.yaml")
    parser.add_argument("--output-dir", help="run folder (default: outputs/<preset>)")
    parser.add_argument("--force", action="store_true", help="re-run even if the stage completed for this config")
    parser.add_argument(
        "overrides", nargs="*", metavar="section.key=value", help="override any config key, e.g. sft.lr=3e-4"
    )


CALLER_DIR_ENV = "RLHF_CALLER_DIR"  # set by run_all.sh, which runs from the repository: the folder it was typed in
PATH_KEYS = ("data.path", "data.sft_path", "model.name_or_path", "tokenizer.name_or_path", "collect.reward_model")


def caller_path(value: str, must_exist: bool = False) -> str:
    """A relative path as the folder the command was typed in means it: absolute when that folder is not the
    repository root (whence run_all.sh runs every stage). `must_exist`: only when it exists there (a config value
    that may also be a Hub id)."""
    caller = Path(os.environ.get(CALLER_DIR_ENV) or Path.cwd()).resolve()
    path = Path(value).expanduser()
    if path.is_absolute() or caller == REPO_ROOT or (must_exist and not (caller / path).exists()):
        return value
    return str((caller / path).resolve())


def run_arguments(args: argparse.Namespace) -> list[str]:
    """The parsed run arguments as a command line, without --force, for each stage of a pipeline run and the
    commands an error suggests: relative paths (--config, --output-dir, local `PATH_KEYS` values) made absolute,
    as the folder the command was typed in means them (`caller_path`)."""

    def override(item: str) -> str:
        key, sep, value = item.partition("=")
        return f"{key}={caller_path(value, must_exist=True)}" if sep and key.strip() in PATH_KEYS else item

    return [
        *(["--preset", args.preset] if args.preset else []),
        *(["--config", caller_path(args.config)] if args.config else []),
        *(["--output-dir", caller_path(args.output_dir)] if args.output_dir else []),
        *map(override, args.overrides),
    ]


def run_folder_of(config_file: Path) -> Path | None:
    """The run folder a stage's saved config sits in (`<run>/<stage>/config.yaml` -> `<run>`), whatever
    `run.output_dir` it holds (the folder it was written in, before the run was copied or moved); None for any other
    config file."""
    if config_file.name == "config.yaml" and config_file.parent.name in STAGE_SCRIPTS:
        return config_file.resolve().parent.parent
    return None


def parse_stage_args(stage: str, argv: list[str] | None = None) -> tuple[Config, RunDir, bool]:
    script = STAGE_SCRIPTS.get(stage)
    parser = argparse.ArgumentParser(
        prog=f"python {script}" if script else f"{stage} stage",
        description=f"Run the '{stage}' stage of the RLHF pipeline.",
        epilog=KEYS_HELP,
    )
    add_run_arguments(parser)
    args = parser.parse_args(argv)
    args = parser.parse_args([*(["--force"] if args.force else []), *run_arguments(args)])  # paths as typed
    name = args.preset or (None if args.config else "tiny")
    cfg = load_config(preset_path(name) if name else args.config, args.overrides)
    if args.output_dir:
        cfg.run.output_dir = args.output_dir
    elif args.config and (folder := run_folder_of(Path(args.config))) is not None:
        cfg.run.output_dir = str(folder)  # a stage's saved config, read in a copy of its run, writes into the copy
    if cfg.run.output_dir is None:
        cfg.run.output_dir = str(REPO_ROOT / "outputs" / (name or Path(args.config).stem))
    return cfg, RunDir(cfg.run.output_dir, preset=name, args=run_arguments(args)), args.force


def default_openmp_wait() -> None:
    """run_all.sh's OpenMP setting for a stage script started by hand: GOMP_SPINCOUNT=1000 (an idle thread spins
    1,000 times, not libgomp's 300,000, before it sleeps: 1.68x instead of 2.94x beside another torch job, and no
    slower alone; docs/performance.md, "Threads") unless OMP_WAIT_POLICY or GOMP_SPINCOUNT is set. libgomp reads it
    when torch loads it, so this runs before torch is imported, or not at all."""
    if "torch" not in sys.modules and not (os.environ.get("OMP_WAIT_POLICY") or os.environ.get("GOMP_SPINCOUNT")):
        os.environ["GOMP_SPINCOUNT"] = "1000"


def answer_early(stage: str, rules: Callable[[Config], object] | None = None) -> None:
    """What a stage script calls first when run as a program, before its imports load torch and transformers
    (seconds): `--help` and a mistyped flag (argparse), a config that does not load (an unknown key, a bad value,
    the YAML) and one that breaks the stage's `rules` (`rlhf.methods.rules`, which import no torch) answer at once,
    the error in one line, exit 2. The stage parses its command line again as it starts (`start_stage`). It sets
    run_all.sh's OpenMP default first (`default_openmp_wait`)."""
    default_openmp_wait()
    try:
        cfg, run, force = parse_stage_args(stage, sys.argv[1:])
        if rules is not None and (force or not run.is_complete(stage, cfg)):  # a finished stage is only skipped
            rules(cfg)
    except UserError as exc:
        fail(f"error: {exc}")


def main_process() -> bool:
    """Whether this is the process that writes files and prints (launchers set RANK; none: the only one)."""
    return int(os.environ.get("RANK", "0")) == 0


def start_stage(
    stage: str,
    argv: list[str] | None = None,
    requires: tuple[str, ...] = (),
    check: Callable[[Config], object] | None = None,
) -> tuple[Config, RunDir] | None:
    """Parse the command line; None (after saying so) when the stage already completed for this config,
    and at once on every process but the main one for a stage with nothing to share out (`StageSpec.one_process`:
    data, report), which a launcher may start several times.

    `check` (config-only rules) must pass, and then the input stages in `requires` (and those the
    config adds, `rlhf.stage.run.config_inputs`, e.g. `collect` for reward.pairs=collected) must be complete
    for this config, before the stage's own completion marker is cleared: a mistyped re-run fails
    in one line and leaves the finished stage as it was. The stage folder then gets the resolved
    config.yaml (a later error names the keys a changed config differs in by it).
    """
    if STAGES[stage].one_process and not main_process():
        return None
    cfg, run, force = parse_stage_args(stage, argv)
    if run.is_complete(stage, cfg) and not force:
        if main_process():
            print(already_complete_line(stage, run))
        return None
    if check is not None:
        check(cfg)
    run.require((*requires, *config_inputs(stage, cfg)), cfg, then=stage)
    check_writable(run.stage(stage))
    if main_process():
        hold_stage_lock(run, stage)
    if main_process() and (replaced := run.replaced_line(stage, cfg)):
        print(replaced)  # a result made with other settings (a stage run by hand) is never replaced unannounced
    run.clear_complete(stage)
    if force:
        shutil.rmtree(run.checkpoint_dir(stage), ignore_errors=True)
    run.stage(stage).mkdir(parents=True, exist_ok=True)
    if main_process():  # one process writes it
        write_text_atomic(run.stage(stage) / "config.yaml", dump_yaml(cfg))
    quiet_loading_bars()
    return cfg, run


_HELD_LOCKS: dict[Path, object] = {}  # lock file -> its open handle: each lock lasts as long as this process


def hold_stage_lock(run: RunDir, stage: str) -> None:
    """One process at a time runs `stage` in a run folder: a second one (another terminal, the same command with
    other settings) stops at start-up, in one line, before it writes anything, rather than mixing its config,
    checkpoints and model with the first's. An advisory lock on `<run>/.<stage>.lock` (flock), released by the
    operating system when the process ends however it ends; not taken where flock does not exist (Windows)."""
    try:
        import fcntl
    except ImportError:
        return
    path = (run.root / f".{stage}.lock").resolve()
    if path in _HELD_LOCKS:  # this process holds it already (a stage started twice in one process, as tests do)
        return
    run.root.mkdir(parents=True, exist_ok=True)
    handle = open(path, "a+")  # noqa: SIM115 (held open until the process exits)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise UserError(
            f"stage '{stage}' is already running in {run.root} ({holder}); wait for it to finish, or give this run "
            "its own --output-dir"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}")
    handle.flush()
    _HELD_LOCKS[path] = handle


def quiet_loading_bars() -> None:
    """Hide transformers' "Loading weights" bar, drawn for every model a stage loads (three to six per stage,
    leaving cursor-up codes in log files); the Hub's download bars stay as they were on the main process, and
    are hidden on the others (under a launcher, one process draws progress bars)."""
    import huggingface_hub.utils as hub
    from transformers.utils import logging

    downloads = not hub.are_progress_bars_disabled()
    logging.disable_progress_bar()
    if downloads and main_process():
        hub.enable_progress_bars()


def forced(argv: list[str]) -> bool:
    """Whether the command line asked for --force (argparse also accepts a prefix of it, e.g. --fo)."""
    return any(arg.startswith("--f") and "--force".startswith(arg) for arg in argv)


def already_complete_line(stage: str, run: RunDir) -> str:
    return f"[{stage}] already complete for this config in {run.stage(stage)}; skipping (--force re-runs it)"


def check_writable(folder: Path) -> None:
    """Fail at start-up, in one line, when the stage could not write its outputs (a read-only or
    foreign folder), rather than after training, at its first checkpoint."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise UserError(
            f"cannot write to the output folder {folder} ({exc.strerror or exc}); "
            "pass a writable --output-dir, or make that folder writable"
        ) from None


def out_of_memory_advice(stage: str | None) -> str:
    """The one-line error for CUDA running out of memory: which keys to lower in this stage's config section (the
    section of the stage it trains as: judge_rm's are reward's)."""
    spec = STAGES.get(stage) if stage else None
    if spec is None or spec.forward_batch_key is None:
        return "CUDA out of memory; lower eval.batch_size, or run on a GPU with more memory"
    section = spec.trains_as or spec.name
    forward = f"{section}.{spec.forward_batch_key}"
    if spec.trains_as is None:  # it samples and scores, and trains nothing (collect)
        return f"{stage}: CUDA out of memory; lower {forward}, or run on a GPU with more memory"
    return (
        f"{stage}: CUDA out of memory; halve {section}.micro_batch_size (gradient accumulation keeps "
        f"{section}.batch_size, which must stay a multiple of it), or {forward} if it ran out while "
        "sampling or evaluating"
    )


def is_cuda_out_of_memory(exc: BaseException) -> bool:
    """torch.cuda.OutOfMemoryError, without importing torch here: `--help` and usage mistakes answer before
    torch loads (seconds), and an error raised before anything imported torch cannot be torch's."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(exc, torch.cuda.OutOfMemoryError)


def script_stage(main: Callable) -> str | None:
    """The stage whose script defines `main` (None for other entry points)."""
    script = Path(main.__code__.co_filename).resolve()
    return next((stage for stage, path in STAGE_SCRIPTS.items() if REPO_ROOT / path == script), None)


def say(line: str) -> None:
    """One line on stderr, on a line of its own: the progress bars still open (the stage is ending)
    are closed first, each ending its line, instead of leaving the cursor mid-bar."""
    for bar in list(getattr(tqdm, "_instances", ())):  # tqdm keeps its open bars here
        bar.close()
    print(line, file=sys.stderr)


def fail(line: str) -> None:
    """A stage's one-line error, exit 2: said by the main process only (under a launcher every process usually
    fails alike), and written by each to the pipeline's RLHF_ERROR_FILE when it started the stage
    (`rlhf.pipeline.launch`)."""
    if path := os.environ.get(ERROR_FILE_ENV):
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
    if main_process():
        say(line)
    sys.exit(2)


def run_stage(main: Callable[[list[str] | None], None]) -> None:
    """Entry point wrapper: one-line errors, exit 2 (`fail`); SIGTERM and Ctrl-C save a checkpoint and exit
    143 and 130 (`rlhf.stage.signals`)."""
    start = time.perf_counter()
    try:
        with graceful_stops():
            main(sys.argv[1:])
    except UserError as exc:
        fail(f"error: {exc}")
    except Interrupted as stop:
        saved = f"checkpoint saved in {stop.checkpoint}; " if stop.checkpoint else ""
        # --force deletes the checkpoint and starts over: the command that resumes is the same one without it
        again = "the same command without --force (which starts over)" if forced(sys.argv[1:]) else "the same command"
        if main_process():
            say(
                f"stopped by {stop} after {time.perf_counter() - start:.0f}s; {saved}"
                f"re-run {again} to resume from the last checkpoint"
            )
        sys.exit(stop.exit_code)
    except Exception as exc:  # after Interrupted, an Exception too
        if not is_cuda_out_of_memory(exc):
            raise
        fail(f"error: {out_of_memory_advice(script_stage(main))}")
