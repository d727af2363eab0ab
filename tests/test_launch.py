"""Launching stages on many processes: the shipped accelerate configs load, and RLHF_LAUNCH is split
into the command that runs each stage (the multi-process runs themselves: test_distributed.py)."""

import sys

import pytest
from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
from conftest import REPO

from rlhf.pipeline import stage_command

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


def test_rlhf_launch_is_split_like_a_shell_and_defaults_to_this_interpreter():
    script = str(REPO / "part2_ppo_grpo" / "train_ppo.py")
    args = ["--preset", "tiny", "ppo.lr=1e-5"]
    assert stage_command("ppo", args, "") == [sys.executable, script, *args]
    launch = "accelerate launch --config_file 'configs/accelerate/my ddp.yaml' --num_processes 8"
    assert stage_command("ppo", args, launch) == [
        "accelerate",
        "launch",
        "--config_file",
        "configs/accelerate/my ddp.yaml",
        "--num_processes",
        "8",
        script,
        *args,
    ]
    assert stage_command("ppo", args, "torchrun --nproc_per_node 2")[:3] == ["torchrun", "--nproc_per_node", "2"]
