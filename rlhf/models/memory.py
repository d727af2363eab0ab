"""Memory a stage used: the peak the device reports, and what the loaded models and optimizer state hold."""

from __future__ import annotations

import resource

import torch
from torch import Tensor


def peak_memory_mb(device: torch.device) -> tuple[float, str]:
    """(peak MB, what it measures): CUDA max allocated on GPU, else the process's max RSS (Linux kB)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20, "cuda_max_memory_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "cpu_max_rss"


def state_memory_mb(modules: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer]) -> float:
    """MB held by the weights of every loaded role plus optimizer state: the part of memory that
    a critic adds or removes, independent of the interpreter's baseline (what max RSS mixes in)."""
    seen, total = set(), 0
    tensors = [p for m in modules for p in m.parameters()]
    tensors += [
        v for opt in optimizers for state in opt.state.values() for v in state.values() if isinstance(v, Tensor)
    ]
    for tensor in tensors:
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            total += tensor.numel() * tensor.element_size()
    return total / 2**20
