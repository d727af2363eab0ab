"""Run a stage script in its own process, as `python SCRIPT ARGS...` would, without paying for its imports each time.

A stage process spends about 3 s importing torch, transformers, peft, accelerate and matplotlib before it does
anything (bench/stage_start.py). Where it is safe, the process that starts the stages (`rlhf.pipeline.driver`,
part4_eval/seeds.py, the tests' forkserver) imports those libraries once (`preload`) and forks each stage from
itself; the child runs the script as `__main__` (`run_as_main`), so a stage starts in milliseconds and is still its
own process: its own memory, signals and exit code, and nothing of it outlives it.

Forking is safe here only from a process that has not started a thread: a child forked after torch's OpenMP pool
has run hangs at its first parallel operation, and CUDA cannot be used in a child whose parent touched it. So a
stage is forked only on Linux, with a CPU build of torch, from a single-threaded process; elsewhere (CUDA and ROCm
builds, macOS, where fork is unsafe, or RLHF_FORK_STAGES=0) it starts in a fresh interpreter, as before.
"""

from __future__ import annotations

import atexit
import importlib
import io
import logging
import os
import runpy
import signal
import subprocess
import sys
import threading
import traceback
import weakref
from pathlib import Path

# What every stage imports before it starts work (`python -X importtime part2_ppo_grpo/train_grpo.py ...`): the
# libraries, not rlhf itself, whose modules each script takes from its own checkout (its sys.path line).
PRELOAD = (
    "numpy",
    "torch",
    "torch.utils.tensorboard",
    "safetensors.torch",
    "tokenizers",
    "transformers",
    "transformers.activations",
    "transformers.masking_utils",
    "transformers.modeling_layers",
    "transformers.modeling_utils",
    "accelerate",
    "peft",
    "matplotlib",
    "matplotlib.figure",
    "tqdm.auto",
)


_threads_after_preload: frozenset[str] | None = None  # this process's threads (ids) once `preload` first ran


def preload() -> None:
    """Import `PRELOAD` into this process, for the stages forked from it to share, where forking is supported.
    Call it before any other work: the threads this process has then (numpy's OpenBLAS pool, which stops itself
    before a fork and starts again in the child) are the only ones a fork may leave behind (`can_fork`)."""
    global _threads_after_preload
    if not fork_supported():
        return
    for name in PRELOAD:
        importlib.import_module(name)
    if _threads_after_preload is None:
        _threads_after_preload = threads()


def fork_supported() -> bool:
    """Linux, a CPU build of torch, and RLHF_FORK_STAGES is not 0 (module docstring)."""
    if os.environ.get("RLHF_FORK_STAGES", "1") == "0" or sys.platform != "linux":
        return False
    import torch

    return not torch.backends.cuda.is_built() and torch.version.hip is None


def can_fork() -> bool:
    """Whether a stage may be forked from this process now: forking is supported, this process preloaded
    (`preload`), runs no Python thread but its main one, and has started no thread since the preload, as torch's
    OpenMP pool would be after its first parallel operation."""
    return (
        fork_supported()
        and _threads_after_preload is not None
        and threads() <= _threads_after_preload
        and threading.active_count() == 1
    )


def threads() -> frozenset[str]:
    """The ids of the threads this process runs (Linux)."""
    return frozenset(os.listdir("/proc/self/task"))


def run_as_main(script: str | Path, args: list[str]) -> int:
    """In a child forked to run it: run `script` as `python script args...` would, as `__main__`, with its argv, its
    folder first on sys.path, Python's default SIGINT and SIGTERM handling, and only its own exit work; -> its exit
    code (a message given to `sys.exit` and the traceback of an uncaught exception are printed, as the interpreter
    prints them)."""
    forget_parent_exit_work()
    sys.argv = [str(script), *args]
    sys.path[0] = str(Path(script).resolve().parent)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        runpy.run_path(str(script), run_name="__main__")
        code = 0
    except SystemExit as exit_:
        code = exit_code(exit_.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = 128 + signal.SIGINT
    except BaseException:  # an uncaught exception ends a process with its traceback and exit code 1
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()  # the exit work the stage registered (log handlers, its temporary folders)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    return code


def forget_parent_exit_work() -> None:
    """In a forked child: drop the exit work the parent had registered, which is the parent's to do (removing its
    temporary folders, releasing its locks), keeping what the child registers from now on. As multiprocessing
    clears its own finalizer registry in a forked child."""
    for finalizer in list(weakref.finalize._registry):
        finalizer.atexit = False
    atexit._clear()
    atexit.register(logging.shutdown)  # registered at import by the logging module, which the child shares
    atexit.register(weakref.finalize._exitfunc)  # registered once per process, at the first finalizer


def exit_code(code: object) -> int:
    """The exit status of `sys.exit(code)`: 0 for None, the number for an int, else 1 after printing it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def fork_stage(script: str | Path, args: list[str], output_fd: int | None = None) -> int:
    """Fork a child that runs `script` (`run_as_main`) with its stdout and stderr on file descriptor `output_fd`
    (None: this process's) and exits; -> the child's pid. The caller has checked `can_fork`."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: it never returns into the caller's code
        code = 1
        try:
            if output_fd is not None:
                redirect_output(output_fd, output_fd)
            code = run_as_main(script, args)
        finally:
            os._exit(code)
    return pid


def redirect_output(stdout_fd: int, stderr_fd: int) -> None:
    """Point this process's stdout and stderr (file descriptors 1 and 2, and sys.stdout and sys.stderr) at these
    file descriptors, unbuffered as with PYTHONUNBUFFERED=1: a log shows each line as it is written, and what a
    stage printed before it was killed is there."""
    for source, target in ((stdout_fd, 1), (stderr_fd, 2)):
        os.dup2(source, target)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", write_through=True)
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", write_through=True
    )


def run_stage_script(
    script: str | Path, args: list[str], output: str | Path | None = None, launcher: list[str] | None = None
) -> int:
    """Run a stage script to its end in its own process, or under `launcher` (e.g. `accelerate launch ...`,
    `rlhf.pipeline.launch.launcher_command`); -> its exit code (negative: the signal that killed it).

    Its stdout and stderr go to `output`, or to this process's. A stop signal that this process receives
    (`rlhf.stage.signals.Interrupted`) reaches the stage, which saves its checkpoint and exits; then it is raised here
    too. Ctrl-C is not passed on: the terminal sent it to the stage as well, and a second one would make the stage
    exit at once, without saving."""
    from rlhf.stage.signals import Interrupted

    preload()
    if output is not None:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
    with open(output or os.devnull, "w", encoding="utf-8") as log:
        if not launcher and can_fork():
            pid = fork_stage(script, args, log.fileno() if output is not None else None)
            wait = lambda: os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])  # noqa: E731
        else:
            stage = subprocess.Popen(
                [*(launcher or [sys.executable]), str(script), *args],
                **({"stdout": log, "stderr": subprocess.STDOUT} if output is not None else {}),
                env={**os.environ, "PYTHONUNBUFFERED": "1"} if output is not None else None,
            )
            pid, wait = stage.pid, stage.wait
        try:
            return wait()
        except Interrupted as stop:
            if stop.signum != signal.SIGINT:
                os.kill(pid, stop.signum)
            wait()
            raise
