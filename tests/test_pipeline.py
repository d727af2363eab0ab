"""rlhf.pipeline.driver (what run_all.sh runs) in-process, with the stage processes faked: which stages start, what a
run that skipped every stage leaves in timing_s, the command a failure tells the user to resume with, and the
checks made before any stage starts. (tests/test_distributed.py runs the real stages: the whole pipeline.)"""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from rlhf.core.errors import UserError
from rlhf.data import write_jsonl
from rlhf.pipeline import driver as pipeline
from rlhf.stage.cli import parse_stage_args
from rlhf.stage.config import load_config, preset_path
from rlhf.stage.run import STAGE_SCRIPTS, STAGES, RunDir
from rlhf.stage.signals import Interrupted


class FakeStages:
    """`run_stage_script` for the pipeline's stage processes: records the stages started and marks each complete
    for its config, as the stage would; `fail` exits 1."""

    def __init__(self, fail: str | None = None):
        self.started: list[str] = []
        self.fail = fail

    def __call__(self, script: Path, args: list[str]) -> int:
        stage = next(stage for stage, name in STAGE_SCRIPTS.items() if str(script).endswith(name))
        self.started.append(stage)
        if stage == self.fail:
            return 1
        cfg, run, _ = parse_stage_args(stage, args)
        run.mark_complete(stage, cfg, {})
        return 0


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.delenv("RLHF_LAUNCH", raising=False)

    def install(fail: str | None = None) -> FakeStages:
        stages = FakeStages(fail)
        monkeypatch.setattr(pipeline, "run_stage_script", stages)
        return stages

    return install


def test_a_small_dataset_names_every_stage_it_is_too_small_for_right_after_the_data_stage(tmp_path, fake, monkeypatch):
    """A dataset with 40 training prompts is too small for two of tiny's online stages (PPO takes 64 prompts an
    iteration, RAFT 128 a round): both are named in one line as soon as the data stage has written it, before SFT
    starts; at the next start-up, before any stage."""
    stages = fake()
    rows = [{"prompt": f"Human: question {i}?", "chosen": "yes", "rejected": "no"} for i in range(40)]

    def data_then_fake(script: Path, args: list[str]) -> int:
        if str(script).endswith(STAGE_SCRIPTS["data"]):
            (tmp_path / "data").mkdir(parents=True, exist_ok=True)
            write_jsonl(tmp_path / "data" / "train.jsonl", rows)
        return stages(script, args)

    monkeypatch.setattr(pipeline, "run_stage_script", data_then_fake)
    args = ["--preset", "tiny", "--output-dir", str(tmp_path)]
    with pytest.raises(UserError) as error:
        pipeline.main(args)
    message = str(error.value)
    assert message.startswith("2 batch settings do not fit: ") and "\n" not in message
    assert "ppo: 40 training prompts are fewer than the 64 needed" in message
    assert "raft: 40 training prompts are fewer than raft.prompts_per_round=128" in message
    assert stages.started == ["data"]
    with pytest.raises(UserError, match=r"^2 batch settings do not fit: ppo: 40 training prompts"):
        pipeline.main(args)  # the data is there now: before any stage starts
    assert stages.started == ["data"]
    pipeline.main([*args, "--only", "data,sft,reward,grpo"])  # the stages it is large enough for run
    assert stages.started == ["data", "sft", "reward", "grpo"]


def test_the_config_rules_of_every_chosen_stage_are_named_at_once_before_any_stage_starts(tmp_path, fake):
    """grpo.batch_size=63 (not whole groups of 4) and dpo.beta=0 each failed only when its stage started, after the
    stages before it had run: now both in one line, before the data stage. A stage not chosen is not held to them."""
    stages = fake()
    args = ["--preset", "tiny", "--output-dir", str(tmp_path), "grpo.batch_size=63", "dpo.beta=0"]
    with pytest.raises(UserError) as error:
        pipeline.main(args)
    message = str(error.value)
    assert message.startswith("2 settings are not valid: ") and "\n" not in message
    assert "grpo.batch_size=63 must be divisible by grpo.group_size=4" in message and "dpo.beta must be > 0" in message
    assert stages.started == []
    pipeline.main([*args, "--only", "data,sft"])
    assert stages.started == ["data", "sft"]


def test_a_run_that_skips_every_stage_starts_none_and_keeps_the_total(tmp_path, fake, capsys):
    args = ["--preset", "tiny", "--output-dir", str(tmp_path)]
    first = fake()
    pipeline.main(args)
    # no stage reads collected pairs, and data.judge_fraction holds no pairs out for an independent judge
    assert first.started == [stage for stage in STAGES if stage not in ("collect", "judge_rm")]
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
    out = str(tmp_path / "collected")  # a new run folder: the one above holds a complete collect stage
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


def test_inputs_the_chosen_stages_need_are_named_before_any_stage_starts(tmp_path, fake):
    """`run_all.sh --from ppo` on an empty folder failed in ppo and said `resume with: bash run_all.sh --from ppo`."""
    out = str(tmp_path)
    started = fake()
    with pytest.raises(UserError) as error:
        pipeline.main(["--from", "ppo", "--preset", "tiny", "--output-dir", out])
    assert str(error.value) == (
        f"stages 'data', 'sft', 'reward' have not completed in {out}, and --from ppo does not run them; "
        f"build them with: bash run_all.sh --from data --preset tiny --output-dir {out}"
    )
    with pytest.raises(UserError) as error:
        pipeline.main(["--only", "grpo,eval", "--preset", "tiny", "--output-dir", out, "grpo.lr=1e-4"])
    assert str(error.value).endswith(
        f"build them with: bash run_all.sh --only data,sft,reward,grpo,eval --preset tiny --output-dir {out} "
        "grpo.lr=1e-4"
    )
    assert started.started == []


def test_a_preset_stage_list_is_what_a_plain_run_runs_and_what_from_starts_within(tmp_path, fake):
    """run.stages (smollm2-ifeval trains RAFT alone): `bash run_all.sh` runs those stages, --from starts within
    them, --only overrides them; a list that leaves out an input, or names no stage, is refused before any runs."""
    out = str(tmp_path)
    listed = "run.stages=data,sft,reward,raft,eval"
    started = fake()
    pipeline.main(["--preset", "tiny", "--output-dir", out, listed])
    assert started.started == ["data", "sft", "reward", "raft", "eval"]
    again = fake()
    pipeline.main(["--from", "raft", "--force", "--preset", "tiny", "--output-dir", out, listed])
    assert again.started == ["raft", "eval"]
    with pytest.raises(UserError) as error:
        pipeline.main(["--preset", "tiny", "--output-dir", str(tmp_path / "new"), "run.stages=data,raft"])
    assert str(error.value) == (
        f"stages 'sft', 'reward' have not completed in {tmp_path / 'new'}, and run.stages does not run them; build "
        f"them with: bash run_all.sh --only data,sft,reward,raft --preset tiny --output-dir {tmp_path / 'new'} "
        "run.stages=data,raft"
    )
    with pytest.raises(UserError, match=r"^unknown stage\(s\) rafts in run.stages; stages are: data, sft,"):
        pipeline.main(["--preset", "tiny", "--output-dir", out, "run.stages=data,rafts"])


@pytest.mark.slow  # reads SmolLM2's GGUF file for its context size (seconds): out of the unit run
def test_a_preset_that_samples_with_vllm_where_it_is_not_installed_stops_before_any_stage(tmp_path, fake, monkeypatch):
    """smollm2-ifeval samples with vLLM: in an environment without it, the run stops at start-up, not at RAFT."""
    monkeypatch.setattr("rlhf.rollout.engines.vllm_installed", lambda: False)
    started = fake()
    with pytest.raises(UserError, match=r"^raft: rollout.engine=vllm but vLLM is not installed here; .*RLHF_VLLM=1"):
        pipeline.main(["--preset", "smollm2-ifeval", "--output-dir", str(tmp_path)])
    assert started.started == []


def test_a_stale_input_of_the_chosen_stages_names_the_keys(tmp_path, fake):
    out = str(tmp_path)
    cfg = load_config(preset_path("tiny"), ["eval.num_prompts=50"])
    run = RunDir(tmp_path)
    for stage in ("data", "sft", "reward", "eval"):
        run.mark_complete(stage, cfg, {})
    started = fake()
    with pytest.raises(UserError) as error:
        pipeline.main(["--only", "report", "--output-dir", out])
    message = str(error.value)
    assert message.startswith(
        f"stage 'eval' was run with a different config in {out}, and --only report does not run it"
    )  # no eval/config.yaml here: it cannot name the keys
    assert message.endswith(f"redo it with this config: bash run_all.sh --only eval,report --output-dir {out}")
    pipeline.main(["--only", "report", "--output-dir", out, "eval.num_prompts=50"])  # the settings it ran with
    assert started.started == ["report"]


def test_after_force_the_resume_command_does_not_start_the_failed_stage_over(tmp_path, fake, capsys, monkeypatch):
    """--force deletes the checkpoint a stage resumes from: repeating it restarted an interrupted stage from 0."""
    out = str(tmp_path)
    failing = fake(fail="ppo")
    with pytest.raises(SystemExit):
        pipeline.main(["--force", "--preset", "tiny", "--output-dir", out])
    assert failing.started[-1] == "ppo"
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.endswith(
        f"resume with: bash run_all.sh --only ppo --preset tiny --output-dir {out}, "
        f"then bash run_all.sh --from grpo --force --preset tiny --output-dir {out}"
    )

    def interrupted(script, args):
        raise Interrupted(signal.SIGINT)  # Ctrl-C while the stage runs

    monkeypatch.setattr(pipeline, "run_stage_script", interrupted)
    with pytest.raises(SystemExit) as exit_info:
        pipeline.main(["--only", "ppo,eval", "--force", "--preset", "tiny", "--output-dir", out])
    assert exit_info.value.code == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"[pipeline] stopped by SIGINT in stage 'ppo'; resume with: bash run_all.sh --only ppo --preset tiny "
        f"--output-dir {out}, then bash run_all.sh --only eval --force --preset tiny --output-dir {out}"
    )


def test_help_lists_every_argument_and_answers_before_torch_loads(capsys):
    with pytest.raises(SystemExit) as exit_info:
        pipeline.parse_args(["--help"])
    text = capsys.readouterr().out
    assert exit_info.value.code == 0 and text.startswith("usage: bash run_all.sh")
    for item in ("--only", "--from", "--preset", "--config", "--output-dir", "--force", "section.key=value"):
        assert item in text
    assert "rlhf/stage/schema.py" in " ".join(text.split())  # where every key is
    # a mistyped flag is run_all.sh's usage error, not the "pipeline stage" parser's
    with pytest.raises(SystemExit) as exit_info:
        pipeline.parse_args(["--presett", "tiny"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "usage: bash run_all.sh" in err and "unrecognized arguments: --presett" in err
    # overrides may come before and after the flags, as before
    args = pipeline.parse_args(["sft.lr=1e-4", "--only", "sft", "reward.lr=2e-4"])
    assert args.only == "sft" and args.overrides == ["sft.lr=1e-4", "reward.lr=2e-4"]
    probe = (
        "import runpy, sys\nsys.argv = ['run_all.sh', '--help']\n"
        "try:\n    runpy.run_module('rlhf.pipeline', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "print('torch loaded' if 'torch' in sys.modules else 'no torch')"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, check=True)
    assert result.stdout.strip().endswith("no torch")
