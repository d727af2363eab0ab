"""Every stage of the tiny preset with run.mixed_precision=bf16 on CPU: the precision path of the GPU presets, run
through `python -m rlhf.pipeline` at small budgets, each stage under tests/dtype_probe.py (the launcher records the
dtype of every linear layer's output and of every result of the math library and the model helpers).

It checks that each stage completes; that every forward pass runs in bf16 under autocast while the log-probs,
values, advantages, rewards, KL and losses computed from them are float32; that a policy's KL to its identical
reference starts at 0; that published models are float32 and load in plain transformers; and that a stage killed
with SIGKILL resumes to the same final weights as the uninterrupted bf16 run. LoRA and 2 processes in bf16:
tests/test_bf16_lora_ddp_e2e.py."""

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
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from rlhf.core.stages import STAGES
from rlhf.pipeline.driver import select_stages
from rlhf.stage.config import load_config, preset_path
from rlhf.stage.run import STAGE_SCRIPTS, RunDir, collect_needed, judge_needed

pytestmark = pytest.mark.slow

# The fewest steps that cross every boundary the probe checks (minutes on a CPU whose bf16 is emulated, as CI's
# may be); collect runs because dpo.pairs=both reads its pairs. SFT saves every 2 steps (the resume test kills it
# writing its second checkpoint); PPO, 3 iterations with a checkpoint after each and a held-out evaluation before
# the first (of the SFT policy: KL 0 to itself).
BF16_OVERRIDES = [
    "run.mixed_precision=bf16",
    "run.log_every=1",
    "data.embedded.n_train_pairs=400",
    "data.embedded.n_test_pairs=50",
    "sft.max_steps=6",
    "sft.save_every=2",
    "sft.batch_size=16",
    "sft.micro_batch_size=16",
    "sft.gold_eval_prompts=8",
    "sft.num_samples=2",
    "collect.prompts=16",
    "collect.max_new_tokens=8",
    "reward.max_steps=4",
    "ppo.total_episodes=48",
    "ppo.batch_size=16",
    "ppo.micro_batch_size=8",
    "ppo.forward_batch_size=16",
    "ppo.save_every=1",
    "ppo.eval_every=3",
    "ppo.eval_prompts=8",
    "ppo.max_new_tokens=12",
    "grpo.total_episodes=16",
    "grpo.batch_size=16",
    "grpo.micro_batch_size=8",
    "grpo.forward_batch_size=16",
    "grpo.eval_prompts=8",
    "grpo.max_new_tokens=12",
    "raft.rounds=1",
    "raft.prompts_per_round=8",
    "raft.batch_size=8",
    "raft.micro_batch_size=8",
    "raft.eval_prompts=8",
    "raft.max_new_tokens=12",
    "dpo.pairs=both",
    "dpo.max_train_pairs=32",
    "dpo.batch_size=16",
    "dpo.micro_batch_size=16",
    "dpo.eval_prompts=8",
    "online_dpo.total_episodes=16",
    "online_dpo.batch_size=16",
    "online_dpo.eval_prompts=8",
    "online_dpo.max_new_tokens=12",
    "eval.num_prompts=8",
    "eval.max_new_tokens=12",
    "eval.best_of_n=2",
    "eval.best_of_n_prompts=4",
    "eval.batch_size=8",
    "eval.suite_prompts=2",
]
BF16_CONFIG = load_config(preset_path("tiny"), BF16_OVERRIDES)
# The stages the pipeline runs on this config: judge_rm is the reward stage's code, run only on held-out judge pairs.
PIPELINE_STAGES = select_stages(None, None, collect_needed(BF16_CONFIG), judge_needed(BF16_CONFIG))
MODEL_STAGES = [stage for stage in PIPELINE_STAGES if stage not in ("data", "report")]
POLICY_STAGES = ("sft", "ppo", "grpo", "raft", "dpo", "online_dpo")
# The boundaries each stage must have crossed (so the float32 check below saw them), besides token/pair log-probs.
BOUNDARIES = {
    "sft": ("rlhf.models.modeling.token_logprobs", "rlhf.core.losses.sft_loss"),
    "collect": (),
    "reward": (
        "rlhf.models.modeling.SharedPromptPairRewards.forward",
        "rlhf.models.modeling.shared_prompt_response_logprobs",  # the SFT policy's log-probs, the distillation targets
        "rlhf.core.losses.length_heuristic_bt_loss",
        "rlhf.core.losses.logprob_distillation_loss",
    ),
    "ppo": (
        "rlhf.models.modeling.PolicyAndValue.forward",
        "rlhf.models.modeling.ValueModel.forward",
        "rlhf.models.modeling.token_logprobs",
        "rlhf.models.modeling.reward_scores",
        "rlhf.core.ops.kl_k1",
        "rlhf.core.ops.gae_advantages",
        "rlhf.core.ops.masked_whiten",
        "rlhf.core.losses.ppo_policy_loss",
        "rlhf.core.losses.ppo_value_loss",
    ),
    "grpo": (
        "rlhf.models.modeling.reward_scores",
        "rlhf.core.ops.group_advantages",
        "rlhf.core.ops.kl_k3",
        "rlhf.core.losses.grpo_loss",
    ),
    "raft": ("rlhf.models.modeling.reward_scores", "rlhf.core.losses.sft_loss"),
    "dpo": ("rlhf.models.modeling.shared_prompt_response_logprobs", "rlhf.core.losses.length_heuristic_dpo_loss"),
    "online_dpo": (
        "rlhf.models.modeling.reward_scores",
        "rlhf.models.modeling.shared_prompt_response_logprobs",
        "rlhf.core.losses.dpo_loss",
    ),
    "eval": ("rlhf.models.modeling.token_logprobs", "rlhf.models.modeling.reward_scores", "rlhf.core.ops.kl_k1"),
}


def probe_launcher() -> str:
    """RLHF_LAUNCH for the pipeline: each stage under the dtype probe."""
    return shlex.join([sys.executable, str(REPO / "tests" / "dtype_probe.py")])


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("bf16")
    env = {**os.environ, "RLHF_LAUNCH": probe_launcher(), PROBE_DIR_ENV: str(root / "probes"), "OMP_NUM_THREADS": "1"}
    env.pop("OPENAI_API_KEY", None)
    command = [sys.executable, "-m", "rlhf.pipeline", "--preset", "tiny", "--output-dir", str(root / "run")]
    # A guard against a hang, not a speed check: CI's CPU once ran this run's bf16 steps 9x slower than here.
    result = subprocess.run(
        [*command, *BF16_OVERRIDES], capture_output=True, text=True, cwd=REPO, env=env, timeout=2400
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return root / "run", load_records(root / "probes")


def metrics(run, stage: str) -> list[dict]:
    return [json.loads(line) for line in (run / stage / "metrics.jsonl").read_text().splitlines()]


def safetensors_dtypes(path) -> set[str]:
    with safe_open(str(path), "pt") as f:
        return {f.get_slice(key).get_dtype() for key in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)


def test_every_stage_completes_in_bf16(bf16_run):
    run, records = bf16_run
    incomplete = [stage for stage in PIPELINE_STAGES if not RunDir(run).is_complete(stage, BF16_CONFIG)]
    assert incomplete == []  # the fingerprints cover bf16
    # every stage ran under the probe, but the two the pipeline starts without RLHF_LAUNCH (nothing to share out)
    launched = [stage for stage in PIPELINE_STAGES if not STAGES[stage].one_process]
    assert set(records) == set(launched) and all(len(processes) == 1 for processes in records.values())
    evaluation = read_summary(run)["eval"]
    assert set(evaluation["models"]) == {"sft", "ppo", "grpo", "raft", "dpo", "online_dpo", "best_of_2"}
    assert (run / "report.md").stat().st_size > 1000


def test_every_forward_pass_runs_in_bf16_under_autocast(bf16_run):
    _, records = bf16_run
    for stage in MODEL_STAGES:
        (record,) = records[stage]
        assert record["linear"].get("bfloat16 autocast=True", 0) > 0, stage
        assert non_bf16_forwards(record) == {}, stage


def test_log_probs_values_rewards_kl_and_losses_are_float32(bf16_run):
    _, records = bf16_run
    for stage in MODEL_STAGES:
        (record,) = records[stage]
        assert half_precision_results(record) == {}, stage
        missing = [name for name in BOUNDARIES[stage] if not record["calls"].get(name, {}).get("out")]
        assert missing == [], stage
    # The critic's values come out of PolicyAndValue in float32 beside its bf16 logits.
    assert set(records["ppo"][0]["calls"]["rlhf.models.modeling.PolicyAndValue.forward"]["out"]) == {
        "0:bfloat16",
        "1:float32",
    }


def test_a_policy_starts_where_its_identical_reference_is(bf16_run):
    """The policy is prepared by accelerate (bf16 logits returned as float32), its reference is not (bf16 logits):
    both must give the same log-probs at the sampling temperature, in training and in held-out evaluation; and DPO's
    reference log-probs (cached, or scored on the fly in other batches) match the policy's own before any update."""
    run, _ = bf16_run
    for stage in ("dpo", "online_dpo"):
        start = next(row for row in metrics(run, stage) if f"{stage}/train/rewards/chosen" in row)
        assert start["step"] == 1, stage
        assert abs(start[f"{stage}/train/rewards/chosen"]) < 1e-4, stage
        assert abs(start[f"{stage}/train/rewards/rejected"]) < 1e-4, stage
    ppo_start = {row["step"]: row for row in metrics(run, "ppo")}
    assert ppo_start[0]["ppo/eval/kl_to_ref"] == 0.0  # held-out evaluation of the SFT policy before training
    assert ppo_start[1]["ppo/objective/kl"] == 0.0  # the first rollouts, sampled before any update
    grpo_start = metrics(run, "grpo")[0]
    assert grpo_start["step"] == 1 and grpo_start["grpo/policy/k3_kl"] < 1e-6
    assert read_summary(run)["eval"]["models"]["sft"]["kl_to_ref"] == 0.0


def test_published_models_are_float32_and_load_in_plain_transformers(bf16_run):
    run, _ = bf16_run
    for stage in (*POLICY_STAGES, "reward"):
        folder = run / stage / "model"
        assert safetensors_dtypes(folder / "model.safetensors") == {"F32"}, stage
        assert json.loads((folder / "config.json").read_text())["dtype"] == "float32", stage
        loader = AutoModelForSequenceClassification if stage == "reward" else AutoModelForCausalLM
        model = loader.from_pretrained(folder, use_safetensors=True)
        assert {p.dtype for p in model.parameters()} == {torch.float32}, stage
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([[5, 6, 7]])).logits
        assert logits.dtype == torch.float32 and torch.isfinite(logits).all(), stage


@pytest.mark.parametrize(
    ("stage", "inputs", "resumed_from"),
    [("sft", ("data",), "step 2"), ("ppo", ("data", "sft", "reward"), "iteration 1")],
)
def test_a_killed_bf16_stage_resumes_to_the_uninterrupted_runs_weights(bf16_run, tmp_path, stage, inputs, resumed_from):
    """SIGKILL halfway through writing the second checkpoint (RLHF_FAULT), then the same command again: it resumes
    from the first and ends bitwise where the pipeline's uninterrupted bf16 run of the stage ended."""
    run, _ = bf16_run
    killed = tmp_path / "killed"
    for name in inputs:
        shutil.copytree(run / name, killed / name)
    shutil.copy(run / "summary.json", killed / "summary.json")
    env = {"OMP_NUM_THREADS": "1", "RLHF_FAULT": "kill@checkpoint:2"}
    crashed = run_script(STAGE_SCRIPTS[stage], killed, *BF16_OVERRIDES, env=env, check=False)
    assert crashed.returncode == -9, crashed.stdout[-2000:] + crashed.stderr[-2000:]
    checkpoint = killed / stage / "checkpoint"
    assert safetensors_dtypes(checkpoint / "model.safetensors") == {"F32"}  # resumable state in float32 too
    moments = torch.load(checkpoint / "optimizer.pt", weights_only=True)["state"]
    assert {m[key].dtype for m in moments.values() for key in ("exp_avg", "exp_avg_sq")} == {torch.float32}

    resumed = run_script(STAGE_SCRIPTS[stage], killed, *BF16_OVERRIDES, env={"OMP_NUM_THREADS": "1"})
    assert f"resumed from {resumed_from}" in resumed.stdout + resumed.stderr
    expected = load_file(run / stage / "model" / "model.safetensors")
    actual = load_file(killed / stage / "model" / "model.safetensors")
    assert actual.keys() == expected.keys()
    assert [key for key in expected if not torch.equal(actual[key], expected[key])] == []
