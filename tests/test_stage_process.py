"""rlhf.pipeline.stage_process: a stage script run forked from a process that imported its libraries behaves as it
does in a fresh interpreter (exit codes, errors, argv, output, stop signals), and the fork is used only where it is
safe."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from rlhf.pipeline import stage_process

REPO = Path(__file__).resolve().parent.parent
FORKING = stage_process.fork_supported()

# Runs each fake stage through run_stage_script from a process that preloaded first, as rlhf.pipeline.driver does, and
# prints one JSON line: how it ran them and what each returned.
DRIVER = """
import json, os, sys, tempfile
from rlhf.pipeline.stage_process import can_fork, preload, run_stage_script
preload()
mode = "fork" if can_fork() else "fresh"
mine = tempfile.TemporaryDirectory()  # the driver's: a stage's exit must not remove it
codes = {name: run_stage_script(name, ["--flag", "value"], output=name + ".log") for name in sys.argv[1:]}
print(json.dumps({"mode": mode, "codes": codes, "driver_folder_kept": os.path.isdir(mine.name)}))
"""

STAGES = {
    "ok.py": """
        import json, sys
        seen = {"argv": sys.argv[1:], "name": __name__, "path0": sys.path[0], "torch": "torch" in sys.modules}
        print(json.dumps(seen))
        print("to stderr", file=sys.stderr)
    """,
    "exit3.py": "import sys; sys.exit(3)",
    "tempdir.py": """
        import tempfile
        folder = tempfile.TemporaryDirectory()  # not cleaned up by the script: its exit removes it
        open("tempdir.txt", "w").write(folder.name)
    """,
    "message.py": "import sys; sys.exit('error: a one-line message')",
    "raises.py": "raise ValueError('not caught')",
    "killed.py": """
        import os, signal
        print("written before the kill")
        os.kill(os.getpid(), signal.SIGKILL)
    """,
}


def run_driver(folder: Path, fork: bool) -> dict:
    for name, source in STAGES.items():
        (folder / name).write_text(textwrap.dedent(source))
    env = {**os.environ, "RLHF_FORK_STAGES": "1" if fork else "0", "PYTHONPATH": str(REPO)}
    ran = subprocess.run(
        [sys.executable, "-c", DRIVER, *STAGES], cwd=folder, env=env, capture_output=True, text=True, timeout=300
    )
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout.splitlines()[-1])


@pytest.mark.slow  # a stage process (seconds): out of the unit run
@pytest.mark.parametrize("fork", [True, False], ids=["forked", "fresh-interpreter"])
def test_a_stage_runs_as_python_script_would(tmp_path, fork):
    result = run_driver(tmp_path, fork)
    assert result["mode"] == ("fork" if fork and FORKING else "fresh")
    assert result["codes"] == {
        "ok.py": 0,
        "exit3.py": 3,
        "tempdir.py": 0,
        "message.py": 1,
        "raises.py": 1,
        "killed.py": -9,
    }
    # each process does its own exit work: the stage's temporary folder is gone, the driver's kept
    assert result["driver_folder_kept"] and not Path((tmp_path / "tempdir.txt").read_text()).exists()
    lines = (tmp_path / "ok.py.log").read_text().splitlines()
    seen = json.loads(lines[0])
    assert seen["argv"] == ["--flag", "value"] and seen["name"] == "__main__"
    assert seen["path0"] == str(tmp_path)  # the script's folder first on sys.path, as `python script` puts it
    assert seen["torch"] == (result["mode"] == "fork")  # forked: the libraries were imported already
    assert lines[1] == "to stderr"  # stdout and stderr both in the log
    assert (tmp_path / "message.py.log").read_text().strip() == "error: a one-line message"
    assert "ValueError: not caught" in (tmp_path / "raises.py.log").read_text()
    assert (tmp_path / "killed.py.log").read_text().strip() == "written before the kill"  # unbuffered


# A stage that records the stop signals it gets (a second one would make a real stage exit without saving).
SIGNAL_STAGE = """
import os, signal, sys, time
received = []
for signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(signum, lambda signum, frame: received.append(signal.Signals(signum).name))
open("ready", "w").close()
deadline = time.time() + 60
while not received and time.time() < deadline:
    time.sleep(0.02)
time.sleep(0.5)  # a second signal would come now
open("received", "w").write(" ".join(received))
sys.exit(128 + signal.Signals[received[0]].value)
"""

# Runs the stage as rlhf.pipeline.driver does, under graceful_stops.
SIGNAL_DRIVER = """
import sys
from rlhf.stage.signals import Interrupted, graceful_stops
from rlhf.pipeline.stage_process import preload, run_stage_script
preload()
try:
    with graceful_stops():
        print("exit", run_stage_script("stage.py", []))
except Interrupted as stop:
    print("interrupted", stop)
"""


def stop_a_driver(tmp_path, driver_code: str, how: str, env: dict) -> None:
    """Start `driver_code` (which runs SIGNAL_STAGE and prints how it ended) as a terminal's foreground job, stop it
    `how` once the stage is up, and check that the stage got that signal exactly once and the driver stopped."""
    (tmp_path / "stage.py").write_text(SIGNAL_STAGE)
    driver = subprocess.Popen(
        [sys.executable, "-c", driver_code],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    deadline = time.time() + 120
    while not (tmp_path / "ready").exists():
        assert driver.poll() is None and time.time() < deadline, "the stage did not start"
        time.sleep(0.02)
    if how.startswith("SIGTERM"):
        driver.send_signal(signal.SIGTERM)
        expected = "SIGTERM"
    else:
        os.killpg(driver.pid, signal.SIGINT)  # what a terminal does on Ctrl-C
        expected = "SIGINT"
    stdout, _ = driver.communicate(timeout=60)
    assert (tmp_path / "received").read_text() == expected  # once: not also passed on by the driver
    assert stdout.strip() == f"interrupted {expected}"


STOPS = ["SIGTERM to the driver", "Ctrl-C to the process group"]


@pytest.mark.slow  # a stage process (seconds): out of the unit run
@pytest.mark.parametrize("fork", [True, False], ids=["forked", "fresh-interpreter"])
@pytest.mark.parametrize("how", STOPS)
def test_a_stop_signal_reaches_the_stage_once_and_stops_the_driver(tmp_path, fork, how):
    stop_a_driver(tmp_path, SIGNAL_DRIVER, how, {"RLHF_FORK_STAGES": "1" if fork else "0"})


def test_no_fork_from_a_process_that_started_threads(monkeypatch):
    """A thread started after the preload (torch's OpenMP pool, a test runner's) makes the stages start fresh; one
    that stopped since (OpenBLAS stops its pool before each fork) does not."""
    if not FORKING:
        pytest.skip("forking stages is not supported here (rlhf.pipeline.stage_process.fork_supported)")
    now = stage_process.threads()
    monkeypatch.setattr(threading, "active_count", lambda: 1)  # the test runner's own Python threads aside
    monkeypatch.setattr(stage_process, "_threads_after_preload", now)
    assert stage_process.can_fork()
    monkeypatch.setattr(stage_process, "_threads_after_preload", now | {"a thread that has stopped"})
    assert stage_process.can_fork()
    monkeypatch.setattr(stage_process, "_threads_after_preload", frozenset(sorted(now)[:-1]))  # one started since
    assert not stage_process.can_fork()
    monkeypatch.setattr(stage_process, "_threads_after_preload", None)  # never preloaded
    assert not stage_process.can_fork()
    monkeypatch.setattr(stage_process, "_threads_after_preload", now)
    monkeypatch.setattr(threading, "active_count", lambda: 2)  # a Python thread
    assert not stage_process.can_fork()


def test_forking_is_off_where_it_is_unsafe_or_turned_off(monkeypatch):
    monkeypatch.setenv("RLHF_FORK_STAGES", "0")
    assert not stage_process.fork_supported()
    monkeypatch.delenv("RLHF_FORK_STAGES")
    monkeypatch.setattr(sys, "platform", "darwin")
    assert not stage_process.fork_supported()
    monkeypatch.setattr(sys, "platform", "linux")
    import torch

    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)  # a CUDA build: CUDA does not survive a fork
    assert not stage_process.fork_supported()


def test_the_tests_fork_their_stage_scripts_unless_a_library_may_have_read_the_environment_at_import():
    import forked

    if not FORKING:
        pytest.skip("forking stages is not supported here (rlhf.pipeline.stage_process.fork_supported)")
    # against the environment the forkserver started with (a test before this one may have started it under its
    # own monkeypatched variables), so the answer does not depend on which tests ran first in this worker
    reference = forked._server_environment or os.environ
    same = {**reference, "PYTEST_CURRENT_TEST": "another test (call)", "PYTHONUNBUFFERED": "1"}
    assert forked.forkable({**same, "RLHF_FAULT": "kill@checkpoint:2", "OPENAI_API_KEY": "sk-test"})
    assert not forked.forkable({**same, "HF_HUB_OFFLINE": "0" if same.get("HF_HUB_OFFLINE") == "1" else "1"})
    assert not forked.forkable({key: value for key, value in same.items() if key != "PATH"})
