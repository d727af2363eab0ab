"""rlhf.pipeline (what run_all.sh runs) in-process, with the stage processes faked: which stages start, what a
run that skipped every stage leaves in timing_s, the command a failure tells the user to resume with, and the
checks made before any stage starts. (tests/test_pipeline_e2e.py runs the real stages.)"""

from __future__ import annotations

import shlex
import subprocess

import pytest

from rlhf import pipeline
from rlhf.config import load_config, preset_path
from rlhf.errors import UserError
from rlhf.run import STAGE_SCRIPTS, STAGES, RunDir


class FakeStages:
    """subprocess.run for the pipeline's stage processes: records the stages started; `fail` exits 1."""

    def __init__(self, fail: str | None = None):
        self.started: list[str] = []
        self.fail = fail

    def __call__(self, command: list[str]) -> subprocess.CompletedProcess:
        stage = next(stage for stage, script in STAGE_SCRIPTS.items() if command[1].endswith(script))
        self.started.append(stage)
        return subprocess.CompletedProcess(command, 1 if stage == self.fail else 0)


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.delenv("RLHF_LAUNCH", raising=False)

    def install(fail: str | None = None) -> FakeStages:
        stages = FakeStages(fail)
        monkeypatch.setattr(subprocess, "run", stages)
        return stages

    return install


def test_a_run_that_skips_every_stage_starts_none_and_keeps_the_total(tmp_path, fake, capsys):
    args = ["--preset", "tiny", "--output-dir", str(tmp_path)]
    first = fake()
    pipeline.main(args)
    assert first.started == [stage for stage in STAGES if stage != "collect"]  # no stage reads collected pairs
    run = RunDir(tmp_path)
    assert run.read_summary()["timing_s"]["pipeline_total"] >= 0

    cfg = load_config(preset_path("tiny"))
    for stage in STAGES:
        run.mark_complete(stage, cfg, {})
    run.update_summary({"timing_s": {"pipeline_total": 244.0}})  # the run that did the work
    again = fake()
    capsys.readouterr()
    pipeline.main(args)
    assert again.started == []  # every stage complete: none of their processes starts (41 s of start-ups before)
    out = capsys.readouterr().out
    assert f"[sft] already complete for this config in {tmp_path / 'sft'}; skipping (--force re-runs it)" in out
    assert "every stage was already complete for this config" in out
    assert run.read_summary()["timing_s"]["pipeline_total"] == 244.0

    # Re-running only some stages: the old total describes a run these stage timings no longer are.
    run.clear_complete("eval")
    run.clear_complete("report")
    partial = fake()
    pipeline.main(args)
    assert partial.started == ["eval", "report"]
    assert "pipeline_total" not in run.read_summary()["timing_s"]


def resume_args(stderr: str) -> list[str]:
    """The arguments of the `bash run_all.sh ...` command a failure message ends with."""
    command = stderr.strip().splitlines()[-1].split("resume with: ", 1)[1]
    assert command.startswith("bash run_all.sh ")
    return shlex.split(command)[2:]


def test_the_resume_command_after_a_failure_re_runs_the_failed_stage(tmp_path, fake, capsys):
    out = str(tmp_path)
    # collect named in --only (no stage reads its pairs): "--from collect" used to resolve to reward..report
    failing = fake(fail="collect")
    with pytest.raises(SystemExit) as exit_info:
        pipeline.main(["--only", "data,sft,collect", "--preset", "tiny", "--output-dir", out])
    assert exit_info.value.code == 1 and failing.started == ["data", "sft", "collect"]
    args = resume_args(capsys.readouterr().err)
    assert args == ["--only", "collect", "--preset", "tiny", "--output-dir", out]
    rerun = fake()
    pipeline.main(args)
    assert rerun.started == ["collect"]

    # a whole run that trains on collected pairs: --from the failed stage, which then runs first
    failing = fake(fail="collect")
    with pytest.raises(SystemExit):
        pipeline.main(["--preset", "tiny", "--output-dir", out, "reward.pairs=collected"])
    args = resume_args(capsys.readouterr().err)
    assert args[:2] == ["--from", "collect"] and args[-1] == "reward.pairs=collected"
    rerun = fake()
    pipeline.main(args)
    assert rerun.started[:2] == ["collect", "reward"]
    assert pipeline.select_stages(None, "collect", with_collect=False)[:2] == ["collect", "reward"]


def test_the_model_context_is_checked_before_any_stage_starts(tmp_path, fake):
    """gpt2-hh's data limits need 512 + 256 + 1 positions: a 512-position model used to fail at SFT, after data."""
    started = fake()
    overrides = [
        "model.init=random",
        "model.name_or_path=null",
        "model.model_type=gpt2",
        "model.config_overrides={n_layer: 1, n_embd: 32, n_head: 2, n_positions: 512}",
        "tokenizer.train_from_data=true",
    ]
    with pytest.raises(UserError) as error:
        pipeline.main(["--preset", "gpt2-hh", "--output-dir", str(tmp_path), *overrides])
    assert str(error.value) == (
        "data.max_prompt_tokens=512 + data.max_response_tokens=256 + 1 (EOS) = 769 tokens exceeds the model's 512 "
        "positions; lower them (and re-run the data stage) or set model.config_overrides.n_positions=769"
    )
    assert started.started == [] and not (tmp_path / "data").exists()
    # the data stage run on its own checks it too, before it reads any data
    from bad_inputs.helpers import stage_module

    with pytest.raises(UserError, match="exceeds the model's 512 positions"):
        stage_module("part1_reward/analyze_data.py").main(
            ["--preset", "gpt2-hh", "--output-dir", str(tmp_path), *overrides]
        )
    assert not (tmp_path / "data" / "train.jsonl").exists()
