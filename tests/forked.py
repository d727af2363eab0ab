"""Stage scripts in the tests, started as a user starts them but without paying for their imports each time.

Each test worker starts one multiprocessing forkserver that imports the libraries every stage imports
(`rlhf.pipeline.stage_process.PRELOAD`); a stage script is then a child forked from it, running as `__main__` with the
test's argv, working folder, environment and output files (`rlhf.pipeline.stage_process.run_as_main`). It is its own
process, with its own exit code and signals, as with `python script ...`; it only starts 3 s sooner. Where forking is
not supported (`rlhf.pipeline.stage_process.fork_supported`), or the test's environment differs from the forkserver's
in a variable a library may have read at import, the script starts in a fresh interpreter instead.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from rlhf.pipeline.stage_process import PRELOAD, fork_supported, redirect_output, run_as_main

# Variables read when they are used, not when a preloaded library is imported: a test may set them, and pytest
# sets PYTEST_CURRENT_TEST to each test's name. GOMP_SPINCOUNT is read when libgomp loads, but it changes only how
# idle threads wait, never what they compute; a stage script started in this process sets it (rlhf.stage.cli).
RUNTIME_VARIABLES = ("RLHF_", "OPENAI_", "PYTHONUNBUFFERED", "PYTEST_", "GOMP_SPINCOUNT")

_context = None
_server_environment: dict[str, str] = {}


def child(script: str, args: list[str], cwd: str, env: dict[str, str], stdout: str, stderr: str) -> None:
    """The forked stage: its environment, folder and output files, then the script (exits; never returns)."""
    code = 1
    try:
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        with open(stdout, "wb") as out, open(stderr, "wb") as err:
            redirect_output(out.fileno(), err.fileno())
        code = run_as_main(script, args)
    finally:
        os._exit(code)


def forkable(env: dict[str, str]) -> bool:
    """Whether a script with this environment may be forked from the forkserver (module docstring)."""
    if not fork_supported():
        return False
    reference = _server_environment or os.environ
    changed = {key for key in env.keys() | reference.keys() if env.get(key) != reference.get(key)}
    return all(key.startswith(RUNTIME_VARIABLES) for key in changed)


class Started:
    """A stage script started by `start`: Popen's pid, poll, wait, send_signal and returncode, and its output."""

    def __init__(self, command: list[str], cwd: Path, env: dict[str, str]):
        global _context
        self.folder = Path(tempfile.mkdtemp(prefix="stage-output-"))
        self.stdout_path, self.stderr_path = self.folder / "stdout", self.folder / "stderr"
        if forkable(env):
            if _context is None:
                _context = multiprocessing.get_context("forkserver")
                _context.set_forkserver_preload(list(PRELOAD))
                _server_environment.update(os.environ)
            target_args = (command[1], command[2:], str(cwd), env, str(self.stdout_path), str(self.stderr_path))
            self.process = _context.Process(target=child, args=target_args)
            self.process.start()
            self.popen = None
        else:
            with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
                self.popen = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=err)
        self.pid = self.popen.pid if self.popen else self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode if self.popen else self.process.exitcode

    def poll(self) -> int | None:
        return self.popen.poll() if self.popen else self.process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        if self.popen:
            return self.popen.wait(timeout)
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(self.process.name, timeout)
        return self.process.exitcode

    def send_signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def output(self) -> tuple[str, str]:
        """What it wrote to stdout and stderr, as text; the files are removed."""
        texts = tuple(p.read_text(encoding="utf-8", errors="replace") for p in (self.stdout_path, self.stderr_path))
        shutil.rmtree(self.folder, ignore_errors=True)
        return texts


def start(command: list[str], cwd: Path, env: dict[str, str]) -> Started:
    """Start `command` (`[sys.executable, script, *args]`) in `cwd` with environment `env`."""
    assert command[0] == sys.executable, command
    return Started(command, cwd, env)


def run(command: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """`subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)` for a stage
    script (`start`)."""
    stage = start(command, cwd, env)
    try:
        stage.wait(timeout)
    except subprocess.TimeoutExpired:
        stage.send_signal(signal.SIGKILL)
        stage.wait()
        raise
    finally:
        stdout, stderr = stage.output()
    return subprocess.CompletedProcess(command, stage.returncode, stdout, stderr)
