"""What a benchmarked step spends its time on, measured the same way on both sides of bench/vs_trl.py:
the token positions the model computes (padding included), and torch.profiler's operator times.

Both are switched on for the timed steps only (`StepProfile.start` after warm-up). The profiler's
own overhead makes the profiled run slower; compare its shares, not its seconds, with the timings.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

# Operator families, by torch.profiler event name: where a transformer step's CPU time goes.
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
ATTENTION_MARKERS = ("scaled_dot_product", "softmax")


def input_embeddings(model: torch.nn.Module) -> torch.nn.Module:
    """The token embedding of the outermost Hugging Face model inside `model` (wrappers included)."""
    for module in model.modules():
        if isinstance(module, PreTrainedModel):
            return module.get_input_embeddings()
    raise ValueError(f"{type(model).__name__} holds no Hugging Face model")


def family(op: str) -> str:
    if op in MATMUL_OPS:
        return "matmul"
    if any(marker in op for marker in ATTENTION_MARKERS):
        return "attention"
    if op.startswith("aten::_foreach") or "adam" in op.lower():
        return "optimizer"
    return "other"


class StepProfile:
    """Counts token positions through `model`'s embedding (with a model: offline stages; generation
    would count each decoding step) and, with `operators`, records operator times, between
    `start()` and `stop()`; `summary()` -> a JSON-able dict."""

    def __init__(self, model: torch.nn.Module | None, operators: bool):
        self.positions = 0
        self.active = False
        if model is not None:
            input_embeddings(model).register_forward_pre_hook(self._count)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profiler = torch.profiler.profile(activities=activities) if operators else None

    def _count(self, module, args) -> None:
        if self.active:
            self.positions += args[0].numel()  # (B, T) ids: every position the model computes

    def start(self) -> None:
        self.active = True
        if self.profiler is not None:
            self.profiler.start()

    def stop(self) -> None:
        """Idempotent: a trainer's end-of-training callback and the caller may both stop it."""
        if self.active and self.profiler is not None:
            self.profiler.stop()
        self.active = False

    def summary(self, top: int = 12) -> dict:
        result: dict = {"positions": self.positions} if self.positions else {}
        if self.profiler is None:
            return result
        events = [e for e in self.profiler.key_averages() if e.self_cpu_time_total > 0]
        total = sum(e.self_cpu_time_total for e in events)
        families: dict[str, float] = {}
        for event in events:
            families[family(event.key)] = families.get(family(event.key), 0.0) + event.self_cpu_time_total
        ranked = sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]
        result["operator_cpu_s"] = total / 1e6
        if torch.cuda.is_available():  # GPU kernel time: far below the wall time, the step waits on the CPU
            result["kernel_gpu_s"] = sum(e.self_device_time_total for e in self.profiler.key_averages()) / 1e6
        result["families_share"] = {name: seconds / total for name, seconds in sorted(families.items())}
        result["top_ops_share"] = {e.key: e.self_cpu_time_total / total for e in ranked}
        result["top_ops_calls"] = {e.key: e.count for e in ranked}
        return result
