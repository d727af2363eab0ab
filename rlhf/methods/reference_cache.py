"""DPO's reference log-probs cached on disk (`dpo.precompute_ref`): keyed per split by everything they depend on
(the reference's weights, the exact token ids, truncation, averaging), so a stale split is never read."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from rlhf.core.batching import EncodedPair


def weights_sha256(model_dir: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(model_dir.glob("*.safetensors")):
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 24), b""):
                digest.update(block)
    return digest.hexdigest()


def ref_cache_fingerprints(
    sft_weights: str, pairs: dict[str, list[EncodedPair]], truncation: tuple, average: bool
) -> dict[str, str]:
    """Per split, everything its cached numbers depend on: the reference weights, the exact token ids,
    truncation and averaging. Per split, so changing dpo.max_train_pairs keeps val and test."""
    fingerprints = {}
    for split, split_pairs in pairs.items():
        digest = hashlib.sha256(f"v1|{sft_weights}|{truncation}|average={average}|{split}:{len(split_pairs)}".encode())
        for pair in split_pairs:
            digest.update(repr((pair.prompt_ids, pair.chosen_ids, pair.rejected_ids)).encode())
        fingerprints[split] = digest.hexdigest()[:16]
    return fingerprints


def load_ref_cache(path: Path, fingerprints: dict[str, str]) -> dict[str, torch.Tensor]:
    """The cached (N, 2) reference log-probs of each split whose fingerprint matches; stale splits never load."""
    if not path.is_file():
        return {}
    with safe_open(str(path), framework="pt") as handle:
        stored = handle.metadata() or {}
        return {
            split: handle.get_tensor(split)
            for split in handle.keys()  # noqa: SIM118 -- safe_open handles are not iterable; .keys() is required
            if split in fingerprints and stored.get(split) == fingerprints[split]
        }


def save_ref_cache(path: Path, fingerprints: dict[str, str], logps: dict[str, torch.Tensor]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    save_file({k: v.contiguous() for k, v in logps.items()}, str(tmp), metadata={k: fingerprints[k] for k in logps})
    os.replace(tmp, path)  # a reader sees the old complete file or the new one, never half of one
