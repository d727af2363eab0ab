"""LoRA and 2 processes with run.mixed_precision=bf16 on CPU, as tests/test_bf16_e2e.py checks every stage on one
process: the reward, PPO and DPO stages on one bf16 data + full SFT run, once with adapters (full SFT, then LoRA) and
once under `torch.distributed.run` with 2 gloo processes, each stage under tests/dtype_probe.py."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import REPO, read_summary, run_script
from dtype_probe import PROBE_DIR_ENV, half_precision_results, load_records, non_bf16_forwards
from peft import PeftModel
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

pytestmark = pytest.mark.slow

BASE_OVERRIDES = [
    "run.mixed_precision=bf16",
    "run.log_every=1",
    "data.embedded.n_train_pairs=800",
    "data.embedded.n_test_pairs=100",
    "sft.max_steps=12",
    "sft.gold_eval_prompts=16",
    "sft.num_samples=2",
    "reward.max_steps=6",
    "reward.micro_batch_size=8",  # 16 pairs per step: 8 on each of 2 processes
    "ppo.total_episodes=96",
    "ppo.batch_size=32",
    "ppo.save_every=1",
    "ppo.eval_prompts=8",
    "dpo.max_train_pairs=64",
    "dpo.micro_batch_size=16",
    "dpo.eval_prompts=8",
]
# Full SFT, then adapters on the later stages (LoRA rates ~10x full fine-tuning's); DPO's reference is the policy
# with its adapters disabled, scoring each batch.
LORA_OVERRIDES = [
    *BASE_OVERRIDES,
    "model.lora.enabled=true",
    "model.lora.stages=reward,ppo,dpo",
    "reward.lr=3e-3",
    "ppo.lr=1e-3",
    "dpo.lr=6e-4",
    "dpo.precompute_ref=false",
]
STAGES = ("reward", "ppo", "dpo")
TWO_PROCESSES = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29537"]


@pytest.fixture(scope="module")
def bf16_sft(tmp_path_factory):
    """data -> full SFT in bf16, the input of both runs below."""
    output_dir = tmp_path_factory.mktemp("bf16_sft")
    for script in ("part1_reward/analyze_data.py", "part1_reward/train_sft.py"):
        run_script(script, output_dir, *BASE_OVERRIDES, env={"OMP_NUM_THREADS": "1"})
    return output_dir


def run_stages(sft_run, root, overrides: list[str], launcher: list[str]):
    """reward, ppo and dpo through the pipeline on a copy of `sft_run`, each stage under the dtype probe."""
    run = root / "run"
    shutil.copytree(sft_run, run)
    env = {
        **os.environ,
        "RLHF_LAUNCH": shlex.join([*launcher, str(REPO / "tests" / "dtype_probe.py")]),
        PROBE_DIR_ENV: str(root / "probes"),
        "OMP_NUM_THREADS": "1",
    }
    command = [sys.executable, "-m", "rlhf.pipeline", "--preset", "tiny", "--output-dir", str(run), "--only"]
    result = subprocess.run(
        [*command, ",".join(STAGES), *overrides], capture_output=True, text=True, cwd=REPO, env=env, timeout=900
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return run, load_records(root / "probes")


@pytest.fixture(scope="module")
def lora_run(bf16_sft, tmp_path_factory):
    return run_stages(bf16_sft, tmp_path_factory.mktemp("bf16_lora"), LORA_OVERRIDES, [sys.executable])


@pytest.fixture(scope="module")
def ddp_run(bf16_sft, tmp_path_factory):
    return run_stages(bf16_sft, tmp_path_factory.mktemp("bf16_ddp"), BASE_OVERRIDES, TWO_PROCESSES)


def safetensors_dtypes(path) -> set[str]:
    with safe_open(str(path), "pt") as f:
        return {f.get_slice(key).get_dtype() for key in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)


def assert_bf16_forwards_and_float32_results(records: dict, processes: int) -> None:
    assert set(records) == set(STAGES)
    for stage in STAGES:
        assert len(records[stage]) == processes, stage
        for record in records[stage]:
            assert record["linear"].get("bfloat16 autocast=True", 0) > 0, stage
            assert non_bf16_forwards(record) == {}, stage
            assert half_precision_results(record) == {}, stage


def first_ppo_kl(run) -> float:
    rows = [json.loads(line) for line in (run / "ppo" / "metrics.jsonl").read_text().splitlines()]
    return next(row["ppo/objective/kl"] for row in rows if row["step"] == 1)


def test_lora_stages_run_in_bf16_with_float32_results(lora_run):
    run, records = lora_run
    assert_bf16_forwards_and_float32_results(records, processes=1)
    assert first_ppo_kl(run) == 0.0  # the reference is the policy with its adapters disabled
    assert read_summary(run)["dpo"]["reference"] == "on_the_fly"


def test_lora_adapters_and_merged_models_are_float32_and_load_in_plain_transformers(lora_run):
    run, _ = lora_run
    ids = torch.randint(2, 200, (2, 10), generator=torch.Generator().manual_seed(0))
    for stage in STAGES:
        assert safetensors_dtypes(run / stage / "adapter" / "adapter_model.safetensors") == {"F32"}, stage
        assert safetensors_dtypes(run / stage / "model" / "model.safetensors") == {"F32"}, stage
        loader = AutoModelForSequenceClassification if stage == "reward" else AutoModelForCausalLM
        merged = loader.from_pretrained(run / stage / "model", use_safetensors=True)
        base = loader.from_pretrained(
            run / "sft" / "model", use_safetensors=True, **({"num_labels": 1} if stage == "reward" else {})
        )
        assert {p.dtype for p in merged.parameters()} == {torch.float32}, stage
        if stage == "reward":
            continue  # its merged weights fold in the reward offset (tests/test_lora_e2e.py)
        adapted = PeftModel.from_pretrained(base, run / stage / "adapter")
        with torch.no_grad():
            expected = merged(input_ids=ids).logits
            assert (adapted(input_ids=ids).logits - expected).abs().max() <= 1e-4, stage
            with adapted.disable_adapter():
                assert (adapted(input_ids=ids).logits - expected).abs().max() > 1e-4, stage  # the adapters trained


def test_killed_lora_ppo_resumes_to_the_uninterrupted_runs_weights(lora_run, tmp_path):
    run, _ = lora_run
    killed = tmp_path / "killed"
    for name in ("data", "sft", "reward"):
        shutil.copytree(run / name, killed / name)
    shutil.copy(run / "summary.json", killed / "summary.json")
    script = "part2_ppo_grpo/train_ppo.py"
    crashed = run_script(
        script, killed, *LORA_OVERRIDES, env={"OMP_NUM_THREADS": "1", "RLHF_FAULT": "kill@checkpoint:2"}, check=False
    )
    assert crashed.returncode == -9, crashed.stdout[-2000:] + crashed.stderr[-2000:]
    resumed = run_script(script, killed, *LORA_OVERRIDES, env={"OMP_NUM_THREADS": "1"})
    assert "resumed from iteration 1" in resumed.stdout + resumed.stderr
    for name in ("model/model.safetensors", "adapter/adapter_model.safetensors"):
        expected, actual = load_file(run / "ppo" / name), load_file(killed / "ppo" / name)
        assert actual.keys() == expected.keys()
        assert [key for key in expected if not torch.equal(actual[key], expected[key])] == [], name


def test_two_processes_run_in_bf16_with_float32_results(ddp_run):
    run, records = ddp_run
    assert_bf16_forwards_and_float32_results(records, processes=2)
    assert first_ppo_kl(run) == 0.0
    for stage in STAGES:
        assert safetensors_dtypes(run / stage / "model" / "model.safetensors") == {"F32"}, stage
    policy = AutoModelForCausalLM.from_pretrained(run / "dpo" / "model", use_safetensors=True)
    assert {p.dtype for p in policy.parameters()} == {torch.float32}
    rows = [json.loads(line) for line in (run / "ppo" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "ppo/objective/kl" in row] == [1, 2, 3]  # written by rank 0 alone
