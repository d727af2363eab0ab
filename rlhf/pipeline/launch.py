"""Stages under a launcher (RLHF_LAUNCH, `rlhf.pipeline.driver`): its command, how many processes it starts, and
a stage that fails under it reported as the stage's own one line.

    RLHF_LAUNCH="accelerate launch --config_file configs/accelerate/ddp.yaml --num_processes 2" bash run_all.sh

- The launcher's first word is looked up beside this interpreter first (the virtual environment's bin folder,
  where `pip install accelerate` put `accelerate` and `torchrun`, on PATH or not), then on PATH.
- Before any stage runs, the launcher starts rlhf/pipeline/launch_probe.py, which says how many processes it started,
  and every chosen stage's batch arithmetic is checked for that many (`rlhf.methods.rules.check_batch_splits`): a
  batch that does not split is one line at start-up, not an error when its stage starts.
- A stage's one-line error is also written to the file RLHF_ERROR_FILE names (`rlhf.stage.cli.run_stage`); once it
  is there, the pipeline stops passing on the launched stage's stderr (what follows is the launcher's report of
  the failed process, some 40 lines of traceback) and prints that line instead, as a stage run without a
  launcher would have.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from rlhf.core.errors import UserError
from rlhf.stage.cli import ERROR_FILE_ENV

PROBE = Path(__file__).resolve().parent / "launch_probe.py"


def launcher_command(launch: str) -> list[str]:
    """RLHF_LAUNCH split as a shell would, its first word resolved: beside this interpreter, else on PATH."""
    words = shlex.split(launch)
    if not words or os.sep in words[0]:
        return words
    beside = Path(sys.executable).parent / words[0]
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside), *words[1:]]
    if shutil.which(words[0]) is None:
        raise UserError(
            f"RLHF_LAUNCH starts with '{words[0]}', which is neither in {beside.parent} nor on PATH; install it "
            f"into this environment ({sys.executable} -m pip install accelerate), or give its full path"
        )
    return words


def launched_processes(launch: str) -> int:
    """How many processes RLHF_LAUNCH starts: the launcher runs rlhf/pipeline/launch_probe.py, whose first process
    prints the world size."""
    result = subprocess.run([*launcher_command(launch), str(PROBE)], capture_output=True, text=True)
    printed = result.stdout.split()
    if result.returncode or not printed or not printed[-1].isdigit():
        said = (result.stderr.strip().splitlines() or ["it printed nothing"])[-1].strip()
        raise UserError(
            f"RLHF_LAUNCH='{launch}' did not start (exit {result.returncode}): {said}; fix the launcher's "
            "arguments, or unset RLHF_LAUNCH to run each stage as one process"
        )
    return int(printed[-1])


def stderr_pipe() -> tuple[int, int]:
    """(read end, write end) for a launched stage's stderr: a pseudo-terminal the size of ours when stderr is a
    terminal, so progress bars draw as they would on it; else a pipe."""
    if not sys.stderr.isatty():
        return os.pipe()
    import fcntl
    import pty
    import termios

    read_end, write_end = pty.openpty()
    size = fcntl.ioctl(sys.stderr.fileno(), termios.TIOCGWINSZ, bytes(8))
    fcntl.ioctl(write_end, termios.TIOCSWINSZ, size)
    return read_end, write_end


def run_launched(command: list[str]) -> tuple[int, str | None]:
    """Run a stage under its launcher, passing its stderr on as it comes until one of its processes has
    written its one-line error; -> (exit code, that line or None).

    A stop signal that this process receives (`rlhf.stage.signals.Interrupted`) reaches the launcher, which passes it on
    to the stage's processes (torch's elastic agent does, for SIGTERM); they save their checkpoint and exit, and
    then it is raised here too. Ctrl-C is not passed on: the terminal sent it to every process of the job already.
    A second signal while waiting kills the launcher."""
    from rlhf.stage.signals import Interrupted

    with tempfile.TemporaryDirectory(prefix="rlhf-stage-") as folder:
        error_file = Path(folder) / "error"
        read_end, write_end = stderr_pipe()
        with subprocess.Popen(command, stderr=write_end, env={**os.environ, ERROR_FILE_ENV: str(error_file)}) as stage:
            os.close(write_end)

            def pass_on_until_exit() -> None:
                while chunk := read_chunk(read_end):
                    if not error_file.exists():
                        sys.stderr.buffer.write(chunk)
                        sys.stderr.flush()
                stage.wait()

            try:
                try:
                    pass_on_until_exit()
                except Interrupted as stop:
                    if stop.signum != signal.SIGINT:
                        stage.send_signal(stop.signum)
                    pass_on_until_exit()
                    raise
            except BaseException:  # not a stop that the stage saw through: as subprocess.run does
                if stage.poll() is None:
                    stage.kill()
                raise
            finally:
                os.close(read_end)
        lines = error_file.read_text().splitlines() if error_file.exists() else []
        return stage.returncode, lines[0] if lines else None


def read_chunk(fd: int) -> bytes:
    """What the launched processes wrote since the last read; b"" once all have closed it."""
    try:
        return os.read(fd, 65536)
    except OSError:  # a pseudo-terminal whose writers have all closed (EIO)
        return b""
