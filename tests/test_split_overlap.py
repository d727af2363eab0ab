"""part4_eval/split_overlap.py: the evaluated prompts counted in another run's test split and in the run's own train
and val splits, by hand on two small run folders."""

from __future__ import annotations

import hashlib
import importlib.util
import json

import pytest
from conftest import REPO

from rlhf.core.errors import UserError


def script():
    spec = importlib.util.spec_from_file_location("split_overlap", REPO / "part4_eval" / "split_overlap.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def data_stage(root, splits: dict[str, list[str]]):
    """A run folder whose data stage completed, with the given prompts per split (two rows for a repeated one)."""
    (root / "data").mkdir(parents=True)
    (root / "data" / "complete.json").write_text("{}")
    for split, prompts in splits.items():
        rows = [{"prompt": p, "chosen": " yes.", "rejected": " no."} for p in prompts]
        (root / "data" / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return root


def test_overlap_counts_the_first_evaluated_prompts_by_hand(tmp_path, capsys):
    run = data_stage(
        tmp_path / "new",
        {"train": ["t1", "t2"], "val": ["v1"], "test": ["a", "b", "a", "t1", "v1", "c"]},
    )
    old = data_stage(tmp_path / "old", {"train": ["t1"], "val": ["v1"], "test": ["b", "c", "z"]})
    # eval's first 4 distinct test prompts: a, b, t1, v1 (c is the fifth): b in the old test, t1 in train, v1 in val
    assert script().overlap(run, old, 4) == {
        "evaluated_prompts": 4,
        "in_other_test": 1,
        "in_train": 1,
        "in_val": 1,
        "distinct_test_prompts": 5,
    }
    script().main([str(run), str(old), "--prompts", "5"])
    out = capsys.readouterr().out
    assert f"2 of the 5 evaluated prompts of {run} are in {old}'s test split" in out
    with pytest.raises(UserError, match="has no completed data stage"):
        script().overlap(tmp_path / "missing", old, 4)


def test_published_weights_are_compared_stage_by_stage(tmp_path, capsys):
    """Only stages with a model in both runs, in pipeline order; equal bytes are identical, one byte apart are not."""
    run = data_stage(tmp_path / "new", {"train": ["t1"], "val": ["v1"], "test": ["a"]})
    old = data_stage(tmp_path / "old", {"train": ["t1"], "val": ["v1"], "test": ["b"]})
    files = {("new", "sft"): b"same", ("old", "sft"): b"same", ("new", "ppo"): b"one", ("old", "ppo"): b"two"}
    files[("new", "dpo")] = b"only in one run"
    for (name, stage), content in files.items():
        (tmp_path / name / stage / "model").mkdir(parents=True)
        (tmp_path / name / stage / "model" / "model.safetensors").write_bytes(content)
    sha = {content: hashlib.sha256(content).hexdigest() for content in files.values()}
    assert script().same_weights(run, old) == {
        "sft": {"sha256": [sha[b"same"], sha[b"same"]], "identical": True},
        "ppo": {"sha256": [sha[b"one"], sha[b"two"]], "identical": False},
    }
    script().main([str(run), str(old), "--prompts", "1", "--out", str(tmp_path / "overlap.json")])
    assert "sft: model.safetensors byte-identical in both runs" in capsys.readouterr().out
    written = json.loads((tmp_path / "overlap.json").read_text())
    assert list(written["weights"]) == ["sft", "ppo"] and written["in_other_test"] == 0
