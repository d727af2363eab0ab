"""The one hook the stages carry for fault injection: `fault_point(name)`, a no-op unless the environment variable
RLHF_FAULT names that point. The runner that uses it (kill, resume, compare) is `rlhf.pipeline.faults`."""

from __future__ import annotations

import os
import signal

FAULT_ENV = "RLHF_FAULT"
_reached: dict[str, int] = {}  # fault point -> times reached in this process


def fault_point(name: str) -> None:
    """Test hook at a named point of the stage code; nothing happens unless RLHF_FAULT is set.

    RLHF_FAULT=<action>@<point>[:<n>] acts the n-th time (default 1) this process reaches `point`:
      kill  SIGKILL this process: a crash at exactly that point (points `checkpoint`, `publish`)
      oom   raise torch.cuda.OutOfMemoryError, as a GPU out of memory would (point `optimizer_step`)
    """
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    action, _, target = spec.partition("@")
    point, _, nth = target.partition(":")
    if point != name:
        return
    _reached[name] = _reached.get(name, 0) + 1
    if _reached[name] != int(nth or 1):
        return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "oom":
        import torch

        raise torch.cuda.OutOfMemoryError(f"CUDA out of memory (injected by {FAULT_ENV}={spec})")
    else:
        raise ValueError(f"{FAULT_ENV}={spec}: unknown action '{action}'; use kill or oom")
