"""Frozen roles (the reference policy, the reward model): set up once, checked unchanged at the end."""

from __future__ import annotations

import hashlib

import torch


def frozen(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """A role that is never trained: no gradients, eval mode, on the device, and no KV cache built
    by plain forward passes (generate() still uses one)."""
    model.requires_grad_(False).eval().to(device)
    model.config.use_cache = False
    return model


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 of every frozen parameter and buffer, to prove a frozen role was not changed. Trainable ones are left
    out: a LoRA model seen with its adapters disabled (rlhf.models.lora) is a frozen role whose adapters train."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict(keep_vars=True).items()):
        if tensor.requires_grad:
            continue
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def frozen_digests(roles: dict[str, torch.nn.Module | None]) -> dict[str, str]:
    """`weights_digest` of each frozen role by name; a role that is None (not loaded) is left out."""
    return {name: weights_digest(model) for name, model in roles.items() if model is not None}


def check_frozen(stage: str, roles: dict[str, torch.nn.Module | None], before: dict[str, str]) -> None:
    """Fail when a frozen role's weights no longer match the `frozen_digests` taken before training."""
    after = frozen_digests(roles)
    if after != before:
        raise RuntimeError(f"{stage}: a frozen role changed during training: {before} -> {after}")
