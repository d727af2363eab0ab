"""Graceful stops: SIGTERM and Ctrl-C (SIGINT) save a resumable checkpoint before a stage exits.

`rlhf.stage.cli.run_stage` installs the handlers for the stage's lifetime (`graceful_stops`). Inside a
training loop (from `defer_stops()`, called where the loop resumes, to the loop's last step) a
signal only records a request: the loop finishes its current optimizer step or iteration, writes
its checkpoint there (`checkpoint_due` is then true) and `stop_if_requested` raises `Interrupted`,
which `run_stage` turns into one line and exit code 128 + the signal's number (130 for SIGINT, 143
for SIGTERM, the shell's convention). Outside a loop (start-up, model loading, the final evaluation,
publishing) there is nothing newer than the last checkpoint to save, so a signal interrupts at
once; so does a second signal inside a loop, for a user who will not wait. A repeat of the first
signal within ECHO_S of it is not a second one but the same stop delivered twice, and is ignored: a
signal sent to a whole process group (`kill -TERM -<pgid>`, a batch scheduler stopping a job) reaches a
stage under the pipeline directly and again from the pipeline, which passes on what it gets.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HANDLED = (signal.SIGINT, signal.SIGTERM)

_deferring = False  # inside a training loop: a signal waits for the next checkpoint
_requested: int | None = None  # the signal that asked for a stop, not yet acted on
_requested_at = 0.0  # when it came (time.monotonic)
ECHO_S = 1.0  # seconds in which a repeat of that signal is the same stop, delivered twice


class Interrupted(Exception):
    """A stage stopped by a signal; `checkpoint` is the folder saved on the way out (None: none saved now)."""

    def __init__(self, signum: int, checkpoint: Path | None = None):
        self.signum = signum
        self.checkpoint = checkpoint
        super().__init__(signal.Signals(signum).name)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _handle(signum: int, frame) -> None:
    global _requested, _requested_at
    if _deferring and _requested is None:
        _requested, _requested_at = signum, time.monotonic()
        print(
            f"{signal.Signals(signum).name} received: saving a checkpoint at the end of this step, then exiting "
            "(send it again, a second or more later, to exit at once)",
            file=sys.stderr,
            flush=True,
        )
        return
    if _deferring and signum == _requested and time.monotonic() - _requested_at < ECHO_S:
        return  # the same stop again (a group-wide signal the pipeline passed on too), not a user who will not wait
    raise Interrupted(signum)


@contextmanager
def graceful_stops() -> Iterator[None]:
    """Handle SIGINT and SIGTERM as described above while the block runs (main thread only), then
    restore the previous handlers and forget any request."""
    global _deferring, _requested
    previous = {signum: signal.signal(signum, _handle) for signum in HANDLED}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _deferring, _requested = False, None


def defer_stops() -> None:
    """The training loop starts: from now on a signal waits for the next checkpoint."""
    global _deferring
    _deferring = True


def checkpoint_due(accelerator, save_every: int, step: int, total: int) -> bool:
    """Whether the loop writes its checkpoint after `step` (of `total`): every `save_every` steps
    before the last (0: never), or now when any process was asked to stop. After the last step
    no stop is deferred any more. Every process must call it at the same step (it reduces)."""
    global _deferring, _requested
    import torch  # here, not at the top: run_stage (rlhf.stage.cli) imports this module before any argument is parsed

    requested = torch.tensor(float(_requested is not None), device=accelerator.device)
    if accelerator.reduce(requested, reduction="max").item() > 0:
        _requested = _requested or signal.SIGTERM  # stop with the others even if this process got no signal
        return True
    if step >= total:
        _deferring = False
    return bool(save_every) and step % save_every == 0 and step < total


def stop_if_requested(checkpoint: Path) -> None:
    """After a checkpoint is written to `checkpoint`: exit through `Interrupted` when a stop was requested."""
    if _requested is not None:
        raise Interrupted(_requested, checkpoint)
