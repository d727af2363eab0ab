"""Atomic checkpoints: a round trip restores everything, a half-written folder is never loaded."""

import json
import random

import torch

from rlhf.models.checkpoint import load_training_state, publish_dir, resolve_complete, save_training_state


def make():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    return model, optimizer, scheduler


def take_step(model, optimizer, scheduler):
    model(torch.randn(5, 3)).pow(2).mean().backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()


def test_round_trip_restores_weights_optimizer_scheduler_and_rng(tmp_path):
    model, optimizer, scheduler = make()
    take_step(model, optimizer, scheduler)
    save_training_state(tmp_path / "ckpt", model, optimizer, scheduler, {"step": 1})
    expected_next = (torch.rand(1).item(), random.random())

    restored, optimizer2, scheduler2 = make()
    state = load_training_state(tmp_path / "ckpt", restored, optimizer2, scheduler2)
    assert state == {"step": 1}
    assert (torch.rand(1).item(), random.random()) == expected_next
    for a, b in zip(model.parameters(), restored.parameters()):
        assert torch.equal(a, b)
    assert scheduler2.get_last_lr() == scheduler.get_last_lr()
    take_step(model, optimizer, scheduler)
    torch.manual_seed(5)
    take_step(restored, optimizer2, scheduler2)
    # Same optimizer moments + same inputs -> identical next step.
    torch.manual_seed(5)
    model2, opt_b, sch_b = make()
    load_training_state(tmp_path / "ckpt", model2, opt_b, sch_b)
    torch.manual_seed(5)
    take_step(model2, opt_b, sch_b)
    for a, b in zip(restored.parameters(), model2.parameters()):
        assert torch.equal(a, b)


def test_missing_checkpoint_returns_none(tmp_path):
    model, optimizer, scheduler = make()
    assert load_training_state(tmp_path / "none", model, optimizer, scheduler) is None


def test_half_written_folder_is_never_loaded(tmp_path):
    final = tmp_path / "ckpt"
    (tmp_path / "ckpt.tmp").mkdir()
    (tmp_path / "ckpt.tmp" / "model.safetensors").write_bytes(b"garbage")
    assert resolve_complete(final, "state.json") is None


def test_crash_between_renames_falls_back_to_the_previous_folder(tmp_path):
    old = tmp_path / "ckpt.old"
    old.mkdir()
    (old / "state.json").write_text(json.dumps({"step": 3}))
    assert resolve_complete(tmp_path / "ckpt", "state.json") == old


def test_publish_replaces_the_previous_folder(tmp_path):
    final, tmp = tmp_path / "out", tmp_path / "out.tmp"
    final.mkdir()
    (final / "a").write_text("old")
    tmp.mkdir()
    (tmp / "a").write_text("new")
    publish_dir(tmp, final)
    assert (final / "a").read_text() == "new"
    assert not tmp.exists() and not (tmp_path / "out.old").exists()
