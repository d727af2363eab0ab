"""One logging path: every metric goes to JSONL, TensorBoard and the progress bar through `log()`.

Keys follow `stage/group/name`, e.g. `sft/train/loss`, `reward/val/accuracy`,
`ppo/policy/clipfrac`; docs/metrics.md lists them all. metrics.jsonl keeps the full key;
TensorBoard gets one run per stage (`<run>/tensorboard/<stage>/`) and the key without its stage
(`objective/kl`), so the same quantity of two stages (PPO's and GRPO's KL) shares one chart, as in TRL.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

from tqdm.auto import tqdm

from rlhf.stage.config import dump_yaml
from rlhf.stage.run import write_text_atomic
from rlhf.stage.schema import Config


def tensorboard_tag(key: str) -> str:
    """A metric's TensorBoard tag: its `stage/group/name` key without the stage, which is the TensorBoard run."""
    return key.split("/", 1)[1]


class MetricLogger:
    """Main-process metric sink. On other processes every call is a no-op.

    A training stage calls `resume(step)` once it knows where it starts, so that `metrics.jsonl`,
    TensorBoard and `history` (what the curves are drawn from) describe this one run.
    """

    def __init__(self, stage: str, stage_dir: Path, tensorboard_dir: Path, cfg: Config, enabled: bool = True):
        self.stage = stage
        self.enabled = enabled
        self.history: list[dict] = []
        self._writer = None
        self._bar: tqdm | None = None
        self._start = time.perf_counter()
        self.resumed_s = 0.0  # after a resume: the earlier attempt's seconds up to its checkpoint (`resume`)
        if not enabled:
            return
        from torch.utils.tensorboard import SummaryWriter

        stage_dir.mkdir(parents=True, exist_ok=True)
        (stage_dir / "config.yaml").write_text(dump_yaml(cfg))
        self._jsonl_path = stage_dir / "metrics.jsonl"
        # kept open for the logger's lifetime (appended to per row, closed in close())
        self._jsonl = open(self._jsonl_path, "a", encoding="utf-8")  # noqa: SIM115
        self._tensorboard = (SummaryWriter, str(tensorboard_dir), "```\n" + dump_yaml(cfg) + "\n```")
        self._open_writer(purge_step=None)

    def _open_writer(self, purge_step: int | None) -> None:
        if self._writer is not None:
            self._writer.close()
        writer_class, log_dir, config_text = self._tensorboard
        self._writer = writer_class(log_dir, purge_step=purge_step)
        self._writer.add_text("config", config_text)

    def resume(self, step: int) -> None:
        """This run starts after `step`: the checkpoint it resumed from, 0 for a fresh start.

        Rows logged after `step` by an earlier attempt (all rows, on a fresh start: a re-run with
        --force or a new config) are dropped from metrics.jsonl and TensorBoard; the rows kept
        become `history`, so a resumed run's curves still show its first part. The last kept row's `time_s`
        is the earlier attempts' time up to the checkpoint: `time_s` goes on from it, and `elapsed` adds it.
        """
        if not self.enabled:
            return
        self._jsonl.close()
        lines = self._jsonl_path.read_text(encoding="utf-8").splitlines() if step > 0 else []
        kept = [row for row in (json.loads(line) for line in lines if line.strip()) if row["step"] <= step]
        write_text_atomic(self._jsonl_path, "".join(json.dumps(row) + "\n" for row in kept))
        self._jsonl = open(self._jsonl_path, "a", encoding="utf-8")  # noqa: SIM115 -- logger handle, kept open
        self.history = kept
        self._start += self.resumed_s  # back to this attempt's own start, if resume is called twice
        self.resumed_s = float(kept[-1].get("time_s", 0.0)) if kept else 0.0
        self._start -= self.resumed_s
        self._open_writer(purge_step=step + 1 if step > 0 else 0)

    def elapsed(self, since: float) -> float:
        """Seconds of the stage's work since `since` (a perf_counter reading in this process), with what earlier
        attempts spent up to the checkpoint this one resumed from: the stage's time, not only its last part's."""
        return round(time.perf_counter() - since + self.resumed_s, 2)

    def progress(self, total: int, initial: int = 0, desc: str | None = None) -> None:
        if self.enabled:
            # In a log file (no TTY) redraw rarely, so logs stay readable.
            self._bar = tqdm(
                total=total,
                initial=initial,
                desc=desc or self.stage,
                dynamic_ncols=True,
                mininterval=0.1 if sys.stderr.isatty() else 30.0,
            )

    def advance(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def log(self, step: int, metrics: dict[str, float], postfix: tuple[str, ...] = ()) -> None:
        """Record `metrics` (full `stage/group/name` keys) at `step`; `postfix` keys go on the bar."""
        if not self.enabled:
            return
        clean = {key: float(value) for key, value in metrics.items()}
        for key in clean:
            if key.count("/") < 2 or not key.startswith(f"{self.stage}/"):
                raise ValueError(f"metric key '{key}' does not follow '{self.stage}/group/name'")
        row = {"step": step, "time_s": round(time.perf_counter() - self._start, 3), **clean}
        self.history.append(row)
        self._jsonl.write(json.dumps(row) + "\n")
        self._jsonl.flush()
        for key, value in clean.items():
            if math.isfinite(value):
                self._writer.add_scalar(tensorboard_tag(key), value, step)
        if self._bar is not None and postfix:
            self._bar.set_postfix({key.rsplit("/", 1)[-1]: f"{clean[key]:.4g}" for key in postfix if key in clean})

    def close(self) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        self._jsonl.close()
        self._writer.close()
