"""Launching stages on many processes: the shipped accelerate configs load, and RLHF_LAUNCH is split
into the command that runs each stage (the multi-process runs themselves: test_distributed.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
from conftest import REPO
from test_stage_process import STOPS, stop_a_driver

from rlhf.core.errors import UserError
from rlhf.pipeline.driver import stage_command
from rlhf.pipeline.launch import launcher_command

BIN = Path(sys.executable).parent

CONFIGS = {
    "ddp.yaml": "MULTI_GPU",
    "fsdp.yaml": "FSDP",
    "deepspeed_zero2.yaml": "DEEPSPEED",
    "deepspeed_zero3.yaml": "DEEPSPEED",
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_accelerate_configs_load_with_accelerates_own_loader(name):
    config = load_config_from_file(str(REPO / "configs" / "accelerate" / name))
    assert isinstance(config, ClusterConfig)
    assert config.distributed_type.value == CONFIGS[name]
    assert config.num_processes == 2 and config.mixed_precision == "no"
    if name.startswith("deepspeed"):
        assert config.deepspeed_config["zero_stage"] == int(name[-6])
    if name == "fsdp.yaml":
        assert config.fsdp_config["fsdp_version"] == 2


def test_accelerate_config_folder_holds_exactly_the_documented_files():
    assert sorted(p.name for p in (REPO / "configs" / "accelerate").iterdir()) == sorted(CONFIGS)
    scaling = (REPO / "docs" / "scaling.md").read_text()
    assert "configs/accelerate/" in scaling and all(f"`{name}`" in scaling for name in CONFIGS)


def test_rlhf_launch_is_split_like_a_shell():
    script = str(REPO / "part2_ppo_grpo" / "train_ppo.py")
    args = ["--preset", "tiny", "ppo.lr=1e-5"]
    launch = "accelerate launch --config_file 'configs/accelerate/my ddp.yaml' --num_processes 8"
    assert stage_command("ppo", args, launch) == [
        str(BIN / "accelerate"),  # the launcher beside this interpreter, on PATH or not
        "launch",
        "--config_file",
        "configs/accelerate/my ddp.yaml",
        "--num_processes",
        "8",
        script,
        *args,
    ]
    assert stage_command("ppo", args, "torchrun --nproc_per_node 2")[:3] == [
        str(BIN / "torchrun"),
        "--nproc_per_node",
        "2",
    ]
    assert stage_command("ppo", args, "/bin/env python")[:2] == ["/bin/env", "python"]  # a path is used as it is


def test_the_stages_with_nothing_to_share_out_start_without_the_launcher(monkeypatch, tmp_path):
    """Data and report run as one process under RLHF_LAUNCH (their other processes would only stop at once); every
    other stage under the launcher. Started by a launcher anyway, a later process of theirs stops before reading
    its arguments."""
    from rlhf.core.stages import STAGES
    from rlhf.pipeline import driver
    from rlhf.stage.cli import start_stage

    assert [stage for stage, spec in STAGES.items() if spec.one_process] == ["data", "report"]
    started = []

    def launched(command):
        started.append(("launched", command[-1]))
        return 0, None

    monkeypatch.setattr(driver, "run_launched", launched)
    monkeypatch.setattr(driver, "run_stage_script", lambda script, args: started.append(("alone", script.name)) or 0)
    for stage in ("data", "sft", "eval", "report"):
        driver.run_stage_process(stage, ["x"], "accelerate launch --num_processes 2")
    assert started == [("alone", "analyze_data.py"), ("launched", "x"), ("launched", "x"), ("alone", "make_report.py")]

    monkeypatch.setenv("RANK", "1")
    assert start_stage("report", ["--output-dir", str(tmp_path / "no such run"), "no.such_key=1"]) is None
    with pytest.raises(UserError, match=r"unknown config key 'no\.such_key'"):  # a stage with work to share reads
        start_stage("sft", ["--output-dir", str(tmp_path), "no.such_key=1"])  # its arguments on every process


def test_a_launcher_found_nowhere_is_one_line_naming_the_fix(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(UserError, match=r"^RLHF_LAUNCH starts with 'acelerate', which is neither in .* nor on PATH"):
        launcher_command("acelerate launch --num_processes 2")


def pipeline(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlhf.pipeline", "--preset", "tiny", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
        timeout=300,
    )


@pytest.mark.slow  # a stage process (seconds): out of the unit run
def test_a_batch_that_does_not_split_over_the_launchs_processes_is_one_line_before_any_stage(tmp_path):
    """The launcher says how many processes it starts (2 here); 32 per process does not split into micro-batches
    of 12. Nothing runs: one line, exit 2, as without a launcher."""
    launch = {"RLHF_LAUNCH": "accelerate launch --config_file configs/accelerate/ddp.yaml --num_processes 2"}
    result = pipeline(launch, "--output-dir", str(tmp_path / "run"), "dpo.batch_size=64", "dpo.micro_batch_size=12")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "error: dpo: a batch of 32 per process (dpo.batch_size=64 / 2) is not divisible by dpo.micro_batch_size=12; "
        "set dpo.micro_batch_size to a divisor of 32, or change the number of processes"
    ]
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # a stage process (seconds): out of the unit run
def test_grpo_micro_batches_of_part_of_a_group_are_one_line_before_any_stage(tmp_path):
    """grpo.pack_groups packs whole groups: a micro-batch of 2 rollouts with G = 4 fails when the pipeline
    starts, not when GRPO's turn comes after SFT and the reward model."""
    result = pipeline({"RLHF_LAUNCH": ""}, "--output-dir", str(tmp_path / "run"), "grpo.micro_batch_size=2")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "error: grpo.pack_groups needs whole groups of grpo.group_size=4 in each micro-batch (2 rollouts) and "
        "minibatch (64 per process); change grpo.micro_batch_size or grpo.num_minibatches, or set "
        "grpo.pack_groups=false"
    ]
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_stage_failing_under_a_launcher_is_its_own_line_and_exit_2_not_the_launchers_traceback(tmp_path):
    launch = {"RLHF_LAUNCH": "accelerate launch --config_file configs/accelerate/ddp.yaml --num_processes 2"}
    result = pipeline(launch, "--output-dir", str(tmp_path / "run"), "--only", "data", "data.path=nowhere.jsonl")
    alone = pipeline(
        {"RLHF_LAUNCH": ""}, "--output-dir", str(tmp_path / "alone"), "--only", "data", "data.path=nowhere.jsonl"
    )
    assert result.returncode == alone.returncode == 2
    lines, alone_lines = result.stderr.splitlines(), alone.stderr.splitlines()
    assert len(lines) == len(alone_lines) == 2 and lines[0] == alone_lines[0] and lines[0].startswith("error: ")
    assert lines[1].startswith("[pipeline] stage 'data' failed (exit 2); fix it and resume with: bash run_all.sh")


# Runs the stage as rlhf.pipeline.driver does under RLHF_LAUNCH, with plain Python as the launcher.
LAUNCHED_SIGNAL_DRIVER = """
import sys
from rlhf.pipeline.launch import run_launched
from rlhf.stage.signals import Interrupted, graceful_stops
try:
    with graceful_stops():
        print("exit", run_launched([sys.executable, "stage.py"]))
except Interrupted as stop:
    print("interrupted", stop)
"""


@pytest.mark.parametrize("how", STOPS)
def test_a_stop_signal_reaches_a_launched_stage_once_and_stops_the_pipeline(tmp_path, how):
    """The launched stage gets the signal once, so it saves its checkpoint and exits, where it used to be killed;
    torch's elastic agent passes a SIGTERM it gets on to its processes (docs/reliability.md)."""
    stop_a_driver(tmp_path, LAUNCHED_SIGNAL_DRIVER, how, {})


def test_every_stage_whose_batches_do_not_fit_is_named_at_once():
    """Before, the first stage's problem stopped the run; fixing it showed the next one, one start at a time."""
    from rlhf.methods.rules import check_batch_splits
    from rlhf.stage.config import load_config, preset_path
    from rlhf.stage.run import STAGES

    cfg = load_config(preset_path("tiny"), ["sft.batch_size=33", "ppo.batch_size=60", "raft.prompts_per_round=5"])
    with pytest.raises(UserError) as error:
        check_batch_splits(cfg, list(STAGES), 2)
    message = str(error.value)
    assert message.startswith("3 batch settings do not fit: sft.batch_size=33 is not divisible") and "\n" not in message
    assert message.count(" | ") == 2 and "ppo.micro_batch_size=16" in message and "raft.prompts_per_round=5" in message
    check_batch_splits(cfg, ["grpo", "dpo"], 2)  # the stages not chosen are not checked
