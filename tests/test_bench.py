"""The benchmark harness runs one timed step of every stage on the tiny preset (never a timed test:
it checks that the harness works and reports what it should, not how fast)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO, TINY_TEST_OVERRIDES

from bench.run import STAGES, UNITS


@pytest.mark.slow
def test_harness_runs_one_step_of_every_stage(tiny_run, tmp_path):
    command = [sys.executable, str(REPO / "bench" / "run.py"), "--preset", "tiny", "--run", str(tiny_run)]
    command += ["--steps", "1", "--warmup", "1", "--out", str(tmp_path), *TINY_TEST_OVERRIDES]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    [path] = tmp_path.glob("*.json")
    results = json.loads(path.read_text())
    assert list(results["stages"]) == list(STAGES)
    for stage, entry in results["stages"].items():
        rates = entry["rates"]
        assert rates[f"{UNITS[stage]}_per_s"] > 0
        assert rates["peak_memory_mb"] > 0
        assert entry["raw"]["steps"] == 1
        assert entry["raw"]["total_s"] >= entry["raw"]["timed_s"] > 0
        if stage in ("ppo", "grpo"):  # the time split into the RL phases
            assert {f"{p}_s_per_step" for p in ("generate", "score", "train")} <= set(rates)
            assert rates["generated_tokens_per_s"] > 0
        else:
            assert rates["tokens_per_s"] > 0
    table = path.with_suffix(".md").read_text()
    assert all(f"| {stage} |" in table for stage in STAGES)
