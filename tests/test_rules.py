"""rlhf.methods.rules names the choices of keys whose implementations live in modules that load torch; here they are
held to those implementations, so a choice added to one and not the other fails."""

from rlhf.core.losses import DPO_LOSSES, GRPO_NORMALIZERS
from rlhf.core.losses import GRPO_RATIO_LEVELS as IMPLEMENTED_RATIO_LEVELS
from rlhf.methods.rules import DPO_LOSS_TYPES, EVAL_JUDGES, GRPO_LOSS_NORMALIZATIONS, GRPO_RATIO_LEVELS
from rlhf.report.contract import JUDGES as REPORTED_JUDGES


def test_the_rules_accept_exactly_the_losses_the_code_implements():
    assert set(DPO_LOSS_TYPES) == set(DPO_LOSSES)
    assert set(GRPO_LOSS_NORMALIZATIONS) == set(GRPO_NORMALIZERS)
    assert set(GRPO_RATIO_LEVELS) == set(IMPLEMENTED_RATIO_LEVELS)


def test_every_judge_eval_accepts_is_one_the_report_describes():
    assert set(EVAL_JUDGES) == set(REPORTED_JUDGES)
