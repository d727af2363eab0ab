"""Checkpoints: resumable training state kept apart from the final Hugging Face artifact.

Both are written to a temporary folder and swapped in by rename, so a crash at any moment
leaves either the previous complete folder or the new complete one, never a half-written one
under the name that gets loaded. A write that fails (a full disk) removes its temporary folder and
stops the stage in one line, the previous folder intact. Weights are saved with safetensors; the
optimizer, scheduler and RNG states are loaded with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import errno
import json
import pickle
import random
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from rlhf.core.errors import UserError
from rlhf.models.sharding import load_training_state as restore_training_state
from rlhf.models.sharding import trainable_names, training_state
from rlhf.stage.fault_points import fault_point

STATE_FILE = "state.json"
WEIGHTS_FILE = "model.safetensors"
ADAPTER_DIR = "adapter"  # a LoRA stage's adapters, beside its merged model/


def publish_dir(tmp: Path, final: Path) -> None:
    """Atomically replace `final` with the fully written folder `tmp`.

    Order: final -> final.old, tmp -> final, delete final.old. If we die between the two
    renames, `resolve_complete` still finds final.old.
    """
    old = final.with_name(final.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        final.rename(old)
    fault_point("publish")
    tmp.rename(final)
    if old.exists():
        shutil.rmtree(old)


def tmp_name(final: Path) -> Path:
    return final.with_name(final.name + ".tmp")


def fresh_tmp(final: Path) -> Path:
    tmp = tmp_name(final)
    if tmp.exists():
        shutil.rmtree(tmp)  # left by a crash mid-write: never loaded, safe to discard
    tmp.mkdir(parents=True)
    return tmp


def resolve_complete(final: Path, marker: str) -> Path | None:
    """The complete folder to load (`final`, else `final.old`), judged by its marker file."""
    for candidate in (final, final.with_name(final.name + ".old")):
        if (candidate / marker).is_file():
            return candidate
    return None


@contextmanager
def written_atomically(final: Path) -> Iterator[Path]:
    """A fresh temporary folder to fill, published as `final` when the block ends. A failed write
    (torch and safetensors report a full disk as RuntimeError or SafetensorError, Python as OSError)
    removes the temporary folder, freeing what it took, and becomes a one-line UserError; the
    previous `final` is untouched."""
    tmp = tmp_name(final)
    try:
        fresh_tmp(final)
        yield tmp
        publish_dir(tmp, final)
    except (OSError, RuntimeError, SafetensorError) as exc:
        disk_full = getattr(exc, "errno", None) == errno.ENOSPC or shutil.disk_usage(final.parent).free < 2**20
        shutil.rmtree(tmp, ignore_errors=True)
        reason = "no space left on device" if disk_full else " ".join(str(exc).split())[:200]
        raise UserError(
            f"cannot write {final} ({reason}); the previous version is kept; free space on that disk "
            "(or pass another --output-dir) and re-run the same command to resume"
        ) from None


def save_pretrained_atomic(
    model: torch.nn.Module, tokenizer, final: Path, extra_json: dict[str, dict] | None = None
) -> None:
    """`save_pretrained` (safetensors) + tokenizer + extra JSON files, published atomically.

    `model` must be the unwrapped, uncompiled module so parameter names carry no wrapper prefix. A LoRA model
    (peft) is published twice: its adapters alone in the sibling folder `adapter/` (`PeftModel.from_pretrained(
    base, path)`, the base being the model the stage started from), then merged into its base weights in `final`,
    which plain transformers loads as before. The merge is in place (no second copy): the LoRA model is spent.
    """
    from peft import PeftModel

    if isinstance(model, PeftModel):
        with written_atomically(final.with_name(ADAPTER_DIR)) as tmp:
            model.save_pretrained(tmp, safe_serialization=True)
        model = model.merge_and_unload()
    with written_atomically(final) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        for name, payload in (extra_json or {}).items():
            (tmp / name).write_text(json.dumps(payload, indent=2))


def _rng_state() -> dict:
    # legacy global RNG on purpose: its state is saved so a resumed run continues the exact same numpy stream
    kind, keys, pos, has_gauss, gauss = np.random.get_state()  # noqa: NPY002
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": random.getstate(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
    }


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    # restore numpy's legacy global RNG for an exact resume (see _rng_state)
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))  # noqa: NPY002


def save_training_state(final: Path, model: torch.nn.Module, optimizer, scheduler, state: dict) -> None:
    """Resumable state: the trainable weights (all of them, or LoRA's adapters and heads: frozen ones are rebuilt
    from the stage's inputs), optimizer, scheduler, RNG and `state` (step, data position, ...). Every process calls
    it: the weights and optimizer state are gathered whole (`rlhf.models.sharding.training_state`, a collective when the
    model is sharded), and the main process writes them."""
    weights, optimizer_state = training_state(model, optimizer)
    if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
        return
    with written_atomically(final) as tmp:
        save_file(weights, str(tmp / WEIGHTS_FILE))
        torch.save(optimizer_state, tmp / "optimizer.pt")
        fault_point("checkpoint")  # halfway through the write
        if scheduler is not None:
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        torch.save(_rng_state(), tmp / "rng.pt")
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=2))  # written last: marks the folder complete


def _read_trainable(model: torch.nn.Module, path: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors, which must be exactly `model`'s trainable parameters by name, or a KeyError."""
    saved = load_file(str(path), device=str(next(model.parameters()).device))
    expected = set(trainable_names(model))
    if saved.keys() != expected:
        missing, unexpected = sorted(expected - saved.keys()), sorted(saved.keys() - expected)
        raise KeyError(f"missing {missing[:3]}, unexpected {unexpected[:3]}")
    return saved


def checkpoint_fingerprint(final: Path) -> str | None:
    """The config fingerprint a complete checkpoint was written for (None when there is none)."""
    folder = resolve_complete(final, STATE_FILE)
    return json.loads((folder / STATE_FILE).read_text()).get("fingerprint") if folder else None


def check_checkpoint_config(final: Path, fingerprint: str) -> None:
    """Every stage's one policy for a checkpoint written under another config: an error, not a silent restart
    over it. Read before any weights are: a checkpoint of another config may hold another architecture."""
    if checkpoint_fingerprint(final) not in (None, fingerprint):
        raise UserError(f"{final} belongs to a different config; delete it or pass --force to start over")


def load_training_state(final: Path, model: torch.nn.Module, optimizer, scheduler) -> dict | None:
    """Restore everything `save_training_state` wrote; None when there is no complete checkpoint, a
    one-line UserError when it cannot be restored (another architecture, a damaged file)."""
    folder = resolve_complete(final, STATE_FILE)
    if folder is None:
        return None
    try:
        weights = _read_trainable(model, folder / WEIGHTS_FILE)
        optimizer_state = torch.load(folder / "optimizer.pt", weights_only=True, map_location="cpu")
        restore_training_state(model, optimizer, weights, optimizer_state)
        if scheduler is not None:
            scheduler.load_state_dict(torch.load(folder / "scheduler.pt", weights_only=True))
        _set_rng_state(torch.load(folder / "rng.pt", weights_only=True))
    except (OSError, RuntimeError, ValueError, KeyError, SafetensorError, pickle.UnpicklingError) as exc:
        # another architecture (missing or mis-shaped weights) or a damaged file: never half a resume
        detail = " ".join(str(exc).split())[:200]
        raise UserError(
            f"cannot resume from {folder} ({type(exc).__name__}: {detail}); it does not fit this model or is "
            "damaged: delete it, or pass --force to start over"
        ) from None
    return json.loads((folder / STATE_FILE).read_text())
