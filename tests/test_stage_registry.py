"""The stage registry (rlhf/core/stages.py): each stage described once, every list of stages derived from it. The
expected values below are written out by hand, as the code hard-coded them before the registry, so a registry entry
that drifts from them fails here."""

import ast
import dataclasses
import re

import pytest
from conftest import REPO

from rlhf.core.stages import (
    METHOD_STAGES,
    ONLINE_STAGES,
    PAIR_READERS,
    POLICY_STAGES,
    STAGES,
    TRAINED_STAGES,
)
from rlhf.stage.schema import Config

ORDER = ("data", "sft", "collect", "reward", "judge_rm", "ppo", "grpo", "raft", "dpo", "online_dpo", "eval", "report")
METHODS = ("ppo", "grpo", "raft", "dpo", "online_dpo")


def test_the_stages_run_in_this_order_each_under_its_own_name():
    assert tuple(STAGES) == ORDER
    assert all(spec.name == name for name, spec in STAGES.items())


def test_every_script_exists():
    assert all((REPO / spec.script).is_file() for spec in STAGES.values())
    assert len({spec.script for spec in STAGES.values()}) == len(STAGES)


def test_every_section_named_is_a_config_section():
    sections = {field.name for field in dataclasses.fields(Config)}
    assert all(set(spec.sections) <= sections for spec in STAGES.values())
    trainers = [spec for spec in STAGES.values() if spec.trains_as]
    assert all(spec.trains_as in sections and spec.trains_as in spec.sections for spec in trainers)


def test_a_stage_reads_only_the_stages_before_it():
    for position, (name, spec) in enumerate(STAGES.items()):
        assert set(spec.inputs) | set(spec.optional_inputs) <= set(ORDER[:position]), name
        assert not set(spec.inputs) & set(spec.optional_inputs), name
        assert spec.trains_as in (None, name) or spec.trains_as in ORDER[:position], name


def test_the_derived_lists_are_those_the_code_hard_coded():
    assert TRAINED_STAGES == ("sft", "reward", "ppo", "grpo", "raft", "dpo", "online_dpo")
    assert POLICY_STAGES == ("sft", "ppo", "grpo", "raft", "dpo", "online_dpo")
    assert METHOD_STAGES == METHODS
    assert ONLINE_STAGES == ("ppo", "grpo", "raft", "online_dpo")
    assert PAIR_READERS == ("reward", "dpo")
    assert {name: spec.optional_inputs for name, spec in STAGES.items() if spec.optional_inputs} == {"eval": METHODS}
    assert {name: spec.trains_as for name, spec in STAGES.items() if spec.trains_as not in (None, name)} == {
        "judge_rm": "reward"
    }
    assert {name: spec.summary_section for name, spec in STAGES.items() if spec.summary_section != name} == {
        "reward": "reward_model",
        "judge_rm": "judge_reward_model",
    }
    assert {name: spec.x_axis for name, spec in STAGES.items() if spec.x_axis != "optimizer step"} == {
        "ppo": "iteration",
        "grpo": "iteration",
        "raft": "round",
        "online_dpo": "iteration",
    }


def test_the_run_folder_reads_what_the_code_hard_coded():
    from rlhf.stage.run import STAGE_SCRIPTS, fixed_inputs

    assert {name: spec.sections for name, spec in STAGES.items()} == {
        "data": ("data", "tokenizer", "model"),
        "sft": ("model", "sft"),
        "collect": ("collect", "judge", "rollout"),
        "reward": ("reward",),
        "judge_rm": ("reward",),
        "ppo": ("ppo", "rollout"),
        "grpo": ("grpo", "rollout"),
        "raft": ("raft", "rollout"),
        "dpo": ("dpo",),
        "online_dpo": ("online_dpo", "judge", "rollout"),
        "eval": ("eval", "judge", "rollout"),
        "report": (),
    }
    assert {name: fixed_inputs(name) for name in STAGES} == {
        "data": (),
        "sft": ("data",),
        "collect": ("data", "sft"),
        "reward": ("data", "sft"),
        "judge_rm": ("data", "sft"),
        "ppo": ("data", "sft", "reward"),
        "grpo": ("data", "sft", "reward"),
        "raft": ("data", "sft", "reward"),
        "dpo": ("data", "sft"),
        "online_dpo": ("data", "sft", "reward"),
        "eval": ("data", "sft", "reward", *METHODS),
        "report": ("eval",),
    }
    assert STAGE_SCRIPTS == {
        "data": "part1_reward/analyze_data.py",
        "sft": "part1_reward/train_sft.py",
        "collect": "part1_reward/collect_pairs.py",
        "reward": "part1_reward/train_reward.py",
        "judge_rm": "part4_eval/train_judge_rm.py",
        "ppo": "part2_ppo_grpo/train_ppo.py",
        "grpo": "part2_ppo_grpo/train_grpo.py",
        "raft": "part2_ppo_grpo/train_raft.py",
        "dpo": "part3_dpo/train_dpo.py",
        "online_dpo": "part3_dpo/train_online_dpo.py",
        "eval": "part4_eval/evaluate.py",
        "report": "part4_eval/make_report.py",
    }


def test_the_report_names_what_the_code_hard_coded():
    from rlhf.report.contract import MODEL_ORDER, STAGE_LABELS, SUMMARY_SECTION
    from rlhf.report.format import model_label

    assert STAGE_LABELS == {
        "data": "data",
        "sft": "SFT",
        "reward": "reward model",
        "ppo": "PPO",
        "grpo": "GRPO",
        "raft": "RAFT",
        "dpo": "DPO",
        "online_dpo": "online DPO",
        "eval": "evaluation",
        "report": "report",
    }
    assert list(STAGE_LABELS) == [name for name in ORDER if name not in ("collect", "judge_rm")]  # the timing table
    assert MODEL_ORDER == ("base", "sft", "ppo", "grpo", "raft", "dpo", "online_dpo")
    assert SUMMARY_SECTION == {"reward": "reward_model"}
    labels = ["SFT", "PPO", "GRPO", "RAFT", "DPO", "online DPO", "base", "reward", "eval", "best-of-4"]
    assert [model_label(name) for name in (*MODEL_ORDER[1:], "base", "reward", "eval", "best_of_4")] == labels


def test_each_curve_is_one_its_stage_logs_and_the_report_draws_only_those():
    from rlhf.analysis.plots import REPORT_CURVE_KEYS

    for name, spec in STAGES.items():
        drawn = spec.curves + spec.eval_curves
        assert all(key.startswith(f"{name}/") for key in drawn), name
        assert len(set(drawn)) == len(drawn) and set(spec.report_curves) <= set(drawn), name
        assert bool(spec.eval_curves) == spec.online, name  # <stage>.eval_every is an online stage's setting
    assert list(REPORT_CURVE_KEYS) == list(TRAINED_STAGES)
    assert REPORT_CURVE_KEYS["ppo"] == [
        "ppo/objective/scores",
        "ppo/objective/kl",
        "ppo/objective/rlhf_reward",
        "ppo/responses/length_mean",
    ]


def test_every_trained_stage_has_a_training_table_row_and_curves():
    assert [name for name, spec in STAGES.items() if spec.results] == list(TRAINED_STAGES)
    assert [name for name, spec in STAGES.items() if spec.curves] == [*TRAINED_STAGES[:2], "judge_rm", *METHODS]


def test_every_stage_that_reads_the_config_has_rules_and_every_one_that_trains_a_size_plan():
    from rlhf.methods.rules import STAGE_PLANS, STAGE_RULES

    assert set(STAGE_RULES) == {name for name, spec in STAGES.items() if spec.sections}
    assert set(STAGE_PLANS) == {name for name, spec in STAGES.items() if spec.trains_as}
    assert set(STAGE_RULES) == set(ORDER) - {"report"}
    assert set(STAGE_PLANS) == {"sft", "reward", "judge_rm", *METHODS}


@pytest.mark.parametrize("stage", ["sft", "judge_rm", "ppo", "dpo"])
def test_a_size_plan_checks_the_batches_of_its_stage(stage):
    """Each plan checks its own section's batch (judge_rm's the reward section's: it trains as the reward model)."""
    from rlhf.core.errors import UserError
    from rlhf.methods.rules import STAGE_PLANS
    from rlhf.stage.config import load_config, preset_path

    section = STAGES[stage].trains_as
    cfg = load_config(preset_path("tiny"), [f"{section}.batch_size=33", f"{section}.micro_batch_size=1"])
    with pytest.raises(UserError, match=f"{section}.batch_size=33"):
        STAGE_PLANS[stage](cfg, 2, None)
    STAGE_PLANS[stage](cfg, 1, None)


def test_out_of_memory_advice_names_keys_that_exist():
    from rlhf.stage.cli import out_of_memory_advice
    from rlhf.stage.config import all_keys

    forward = {name: spec.forward_batch_key for name, spec in STAGES.items()}
    assert forward == {
        **dict.fromkeys(ORDER, "eval_batch_size"),
        **dict.fromkeys(("data", "eval", "report"), None),
        **dict.fromkeys(("ppo", "grpo", "online_dpo"), "forward_batch_size"),
        "collect": "batch_size",
    }
    assert "or grpo.forward_batch_size if" in out_of_memory_advice("grpo")
    assert "halve reward.micro_batch_size" in out_of_memory_advice("judge_rm")
    assert out_of_memory_advice("collect").startswith("collect: CUDA out of memory; lower collect.batch_size,")
    assert out_of_memory_advice("report") == out_of_memory_advice(None)
    keys = set(all_keys(Config()))
    for stage in STAGES:
        named = re.findall(r"\b([a-z_]+\.[a-z_]+)\b", out_of_memory_advice(stage))
        assert named and set(named) <= keys, (stage, set(named) - keys)


def test_the_faults_runner_tests_each_stage_trained_with_its_own_settings_and_eval():
    from rlhf.pipeline.faults import NO_CHECKPOINT_STAGES, STAGE_ORDER, UPSTREAM

    assert STAGE_ORDER == ("sft", "reward", "ppo", "grpo", "raft", "dpo", "online_dpo", "eval")
    assert UPSTREAM == ("data", "sft", "reward") and NO_CHECKPOINT_STAGES == ("eval",)


def test_the_model_card_describes_only_policies():
    from rlhf.report.model_card import CARD_SETTINGS, METHODS

    assert set(METHODS) == {"base", *POLICY_STAGES} and set(CARD_SETTINGS) == set(POLICY_STAGES)


def test_the_registry_imports_nothing_but_the_standard_library():
    """Every layer reads it, and run_all.sh and each stage script before torch loads."""
    tree = ast.parse((REPO / "rlhf" / "core" / "stages.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert imported == {"__future__", "dataclasses"}
