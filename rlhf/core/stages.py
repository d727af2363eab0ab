"""The stage registry: every stage of the pipeline, in order, as one `StageSpec`, from which the rest of the
library reads what it needs to know of a stage: the script that runs it, the config sections it reads, the stages
it reads from, what it publishes (its summary.json section, the keys of its training-table row, its curves) and how
the report names it and draws its curves. Adding a stage is one entry here, plus its config rules and size plan
(`rlhf.methods.rules.STAGE_RULES`, `STAGE_PLANS`); tests/test_stage_registry.py holds the two to each other.

Torch-free and config-free (names and strings only), so every layer can read it. What depends on a config stays
with its layer: the inputs a setting adds (`rlhf.stage.run.stage_inputs`), the judge section read only where the
LLM judge is asked (`rlhf.stage.run.stage_sections`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StageSpec:
    """One stage: its script, what it reads, what it trains and publishes, and how the report shows it."""

    name: str  # its folder in the run folder, its section of timing_s, its prefix of metric keys
    script: str  # the stage script, from the repository root
    sections: tuple[str, ...]  # the config sections it reads beyond run.seed (`rlhf.stage.run.stage_sections`)
    inputs: tuple[str, ...] = ()  # the stages whose outputs it cannot run without; a config may add some
    optional_inputs: tuple[str, ...] = ()  # stages whose outputs it reads when they completed, and runs without
    # the stage whose settings it trains with (model.lora.stages included): itself, or the one it is trained as;
    # None for a stage that trains no weights
    trains_as: str | None = None
    policy: bool = False  # it trains a policy, one of the models the evaluation compares
    method: bool = False  # an alignment method: run.method_seed seeds it, eval evaluates it once complete
    # it samples its own training data from prompts (`rlhf.online`), scored by its reward spec, the reward model by
    # default; its size is the number of training prompts, its length iterations (RAFT: rounds)
    online: bool = False
    reads_pairs: bool = False  # its `pairs` setting may read the collect stage's pairs
    published_as: str | None = None  # its section of summary.json where that is not its name
    # the key of its no-grad batches (sampling, scoring, evaluation), in the section of the stage it trains as,
    # that out-of-memory advice names beside that section's micro_batch_size (`rlhf.stage.cli.out_of_memory_advice`);
    # None: a stage whose advice is eval.batch_size
    forward_batch_key: str | None = None
    label: str | None = None  # its name in the report; None: its stage name (its timing row after the labelled ones)
    x_axis: str = "optimizer step"  # what its row of the report's training curves is drawn against
    curves: tuple[str, ...] = ()  # the metric keys of its own curves.png
    eval_curves: tuple[str, ...] = ()  # drawn in it too when <stage>.eval_every > 0
    report_curves: tuple[str, ...] = ()  # its row of the report's training-curves figure
    # its row of the report's training table: (summary key, label, decimals); `val` marks a number the stage
    # measured itself on validation prompts (<stage>.eval_prompts, SFT's sft.gold_eval_prompts), not the Headline's
    results: tuple[tuple[str, str, int], ...] = ()
    # nothing to share out over processes (data, report): the pipeline starts it as one process even under
    # RLHF_LAUNCH, and where a launcher starts it several times, every process but the first stops at once
    one_process: bool = False

    @property
    def summary_section(self) -> str:
        """Its section of summary.json."""
        return self.published_as or self.name


# The held-out numbers every online stage publishes, in its training-table row.
ONLINE_RESULTS = (
    ("eval_prompts", "val prompts", 0),
    ("reward_mean", "val RM reward", 3),
    ("sft_reward_mean", "val SFT RM reward", 3),
    ("kl_to_ref", "val KL to ref", 3),
    ("gold_score_mean", "val gold score", 3),
    ("gold_win_rate_vs_sft", "val gold win rate vs SFT", 3),
)

_SPECS = (
    StageSpec(
        name="data",
        script="part1_reward/analyze_data.py",
        sections=("data", "tokenizer", "model"),
        label="data",
        one_process=True,
    ),
    StageSpec(
        name="sft",
        script="part1_reward/train_sft.py",
        sections=("model", "sft"),
        inputs=("data",),
        trains_as="sft",
        policy=True,
        forward_batch_key="eval_batch_size",
        label="SFT",
        curves=("sft/train/loss", "sft/val/loss", "sft/train/lr", "sft/train/grad_norm"),
        report_curves=("sft/train/loss", "sft/val/loss"),
        results=(
            ("val_loss", "val loss", 3),
            ("val_perplexity", "val perplexity", 2),
            ("gold_good_rate", "val gold good-rate", 3),
            ("gold_score_mean", "val gold score", 3),
        ),
    ),
    StageSpec(
        name="collect",
        script="part1_reward/collect_pairs.py",
        sections=("collect", "judge", "rollout"),  # the judge section configures the openai annotator
        inputs=("data", "sft"),
        forward_batch_key="batch_size",
    ),
    StageSpec(
        name="reward",
        script="part1_reward/train_reward.py",
        sections=("reward",),
        inputs=("data", "sft"),  # and collect when reward.pairs reads collected pairs
        trains_as="reward",
        reads_pairs=True,
        published_as="reward_model",
        forward_batch_key="eval_batch_size",
        label="reward model",
        curves=(
            "reward/train/loss",
            "reward/train/accuracy",
            "reward/val/accuracy",
            "reward/train/margin_mean",
            "reward/train/lr",
        ),
        report_curves=("reward/train/loss", "reward/train/accuracy", "reward/val/accuracy"),
        results=(
            ("val_accuracy", "val accuracy", 3),
            ("test_accuracy", "test accuracy", 3),
            ("test_gold_accuracy", "test accuracy vs gold", 3),
        ),
    ),
    StageSpec(  # the independent judge's reward model; an input of eval when data.judge_fraction > 0
        name="judge_rm",
        script="part4_eval/train_judge_rm.py",
        sections=("reward",),  # trained as the reward model is, on data/judge.jsonl
        inputs=("data", "sft"),
        trains_as="reward",
        published_as="judge_reward_model",
        forward_batch_key="eval_batch_size",
        curves=(
            "judge_rm/train/loss",
            "judge_rm/train/accuracy",
            "judge_rm/val/accuracy",
            "judge_rm/train/margin_mean",
            "judge_rm/train/lr",
        ),
    ),
    StageSpec(
        name="ppo",
        script="part2_ppo_grpo/train_ppo.py",
        sections=("ppo", "rollout"),
        inputs=("data", "sft", "reward"),
        trains_as="ppo",
        policy=True,
        method=True,
        online=True,
        forward_batch_key="forward_batch_size",
        label="PPO",
        x_axis="iteration",
        curves=(
            "ppo/objective/scores",
            "ppo/gold/score_mean",
            "ppo/objective/rlhf_reward",
            "ppo/objective/kl",
            "ppo/objective/entropy",
            "ppo/responses/length_mean",
            "ppo/responses/eos_rate",
            "ppo/policy/clipfrac",
            "ppo/policy/approxkl",
            "ppo/val/explained_variance",
            "ppo/val/loss",
            "ppo/objective/kl_coef",
            "ppo/responses/length_score_corr",
            "ppo/rollout/mismatch_kl",
        ),
        eval_curves=("ppo/eval/reward_mean", "ppo/eval/gold_score_mean", "ppo/eval/kl_to_ref"),
        report_curves=(
            "ppo/objective/scores",
            "ppo/objective/kl",
            "ppo/objective/rlhf_reward",
            "ppo/responses/length_mean",
        ),
        results=(
            ("episodes", "episodes", 0),
            *ONLINE_RESULTS,
            ("final_kl_coef", "final β", 3),
            ("time_per_sample_ms", "ms per sample", 1),
        ),
    ),
    StageSpec(
        name="grpo",
        script="part2_ppo_grpo/train_grpo.py",
        sections=("grpo", "rollout"),
        inputs=("data", "sft", "reward"),
        trains_as="grpo",
        policy=True,
        method=True,
        online=True,
        forward_batch_key="forward_batch_size",
        label="GRPO",
        x_axis="iteration",
        curves=(
            "grpo/objective/scores",
            "grpo/gold/score_mean",
            "grpo/objective/kl",
            "grpo/objective/entropy",
            "grpo/objective/zero_std_groups",
            "grpo/responses/length_mean",
            "grpo/responses/eos_rate",
            "grpo/policy/clipfrac",
            "grpo/policy/approxkl",
            "grpo/policy/k3_kl",
            "grpo/responses/length_score_corr",
            "grpo/rollout/mismatch_kl",
            "grpo/train/loss",
            "grpo/train/grad_norm",
        ),
        eval_curves=("grpo/eval/reward_mean", "grpo/eval/gold_score_mean", "grpo/eval/kl_to_ref"),
        report_curves=(
            "grpo/objective/scores",
            "grpo/objective/kl",
            "grpo/objective/zero_std_groups",
            "grpo/responses/length_mean",
        ),
        results=(
            ("episodes", "episodes", 0),
            ("group_size", "group size G", 0),
            *ONLINE_RESULTS,
            ("train_zero_std_groups", "zero-std groups", 3),
            ("time_per_sample_ms", "ms per sample", 1),
        ),
    ),
    StageSpec(
        name="raft",
        script="part2_ppo_grpo/train_raft.py",
        sections=("raft", "rollout"),
        inputs=("data", "sft", "reward"),
        trains_as="raft",
        policy=True,
        method=True,
        online=True,
        forward_batch_key="eval_batch_size",
        label="RAFT",
        x_axis="round",
        curves=(
            "raft/objective/scores",
            "raft/selected/score_mean",
            "raft/gold/score_mean",
            "raft/selected/gold_score_mean",
            "raft/objective/tied_prompts",
            "raft/responses/length_mean",
            "raft/selected/length_mean",
            "raft/responses/eos_rate",
            "raft/responses/length_score_corr",
            "raft/train/loss",
            "raft/train/grad_norm",
        ),
        eval_curves=("raft/eval/reward_mean", "raft/eval/gold_score_mean", "raft/eval/kl_to_ref"),
        report_curves=(
            "raft/objective/scores",
            "raft/selected/score_mean",
            "raft/train/loss",
            "raft/responses/length_mean",
        ),
        results=(
            ("episodes", "episodes", 0),
            ("samples_per_prompt", "samples per prompt N", 0),
            ("top_k", "kept per prompt", 0),
            *ONLINE_RESULTS,
            ("time_per_sample_ms", "ms per sample", 1),
        ),
    ),
    StageSpec(
        name="dpo",
        script="part3_dpo/train_dpo.py",
        sections=("dpo",),
        # runs after reward in the chain, but never reads the reward model; collect as reward does
        inputs=("data", "sft"),
        trains_as="dpo",
        policy=True,
        method=True,
        reads_pairs=True,
        forward_batch_key="eval_batch_size",
        label="DPO",
        curves=(
            "dpo/train/loss",
            "dpo/train/rewards/accuracies",
            "dpo/train/rewards/margins",
            "dpo/train/rewards/chosen",
            "dpo/train/rewards/rejected",
            "dpo/val/rewards/accuracies",
            "dpo/train/logps/chosen",
            "dpo/train/logps/rejected",
            "dpo/eval/gold_score_mean",
            "dpo/eval/gold_win_rate_vs_sft",
            "dpo/train/grad_norm",
            "dpo/train/lr",
        ),
        report_curves=(
            "dpo/train/loss",
            "dpo/train/rewards/accuracies",
            "dpo/val/rewards/accuracies",
            "dpo/train/rewards/margins",
        ),
        results=(
            ("loss_type", "loss", 0),
            ("beta", "β", 3),
            ("train_loss", "final train loss", 3),
            ("val_accuracy", "val implicit-reward accuracy", 3),
            ("test_accuracy", "test implicit-reward accuracy", 3),
            ("eval_prompts", "val prompts", 0),
            ("gold_score_mean", "val gold score", 3),
            ("gold_win_rate_vs_sft", "val gold win rate vs SFT", 3),
        ),
    ),
    StageSpec(
        name="online_dpo",
        script="part3_dpo/train_online_dpo.py",
        sections=("online_dpo", "judge", "rollout"),  # the judge section configures online_dpo.judge=openai
        inputs=("data", "sft", "reward"),
        trains_as="online_dpo",
        policy=True,
        method=True,
        online=True,
        forward_batch_key="forward_batch_size",
        label="online DPO",
        x_axis="iteration",
        curves=(
            "online_dpo/objective/scores",
            "online_dpo/gold/score_mean",
            "online_dpo/pairs/kept_rate",
            "online_dpo/pairs/score_margin",
            "online_dpo/train/loss",
            "online_dpo/train/rewards/accuracies",
            "online_dpo/train/rewards/margins",
            "online_dpo/responses/length_mean",
            "online_dpo/responses/eos_rate",
            "online_dpo/train/grad_norm",
        ),
        eval_curves=("online_dpo/eval/reward_mean", "online_dpo/eval/gold_score_mean", "online_dpo/eval/kl_to_ref"),
        report_curves=(
            "online_dpo/objective/scores",
            "online_dpo/train/loss",
            "online_dpo/train/rewards/margins",
            "online_dpo/responses/length_mean",
        ),
        results=(
            ("episodes", "episodes", 0),
            ("judge", "judge", 0),
            ("reference", "reference", 0),
            ("pairs_kept_rate", "pairs kept", 3),
            *ONLINE_RESULTS,
            ("time_per_sample_ms", "ms per sample", 1),
        ),
    ),
    StageSpec(
        name="eval",
        script="part4_eval/evaluate.py",
        sections=("eval", "judge", "rollout"),
        inputs=("data", "sft", "reward"),  # and judge_rm when data.judge_fraction > 0
        optional_inputs=("ppo", "grpo", "raft", "dpo", "online_dpo"),  # evaluates whichever policies completed
        label="evaluation",
    ),
    StageSpec(
        name="report",
        script="part4_eval/make_report.py",
        sections=(),  # reads no config section: only the run folder's files
        inputs=("eval",),  # eval's fingerprint covers every earlier stage
        label="report",
        one_process=True,
    ),
)

STAGES: dict[str, StageSpec] = {spec.name: spec for spec in _SPECS}  # in pipeline order

TRAINED_STAGES = tuple(name for name, spec in STAGES.items() if spec.trains_as == name)  # trained with own settings
POLICY_STAGES = tuple(name for name, spec in STAGES.items() if spec.policy)
METHOD_STAGES = tuple(name for name, spec in STAGES.items() if spec.method)
ONLINE_STAGES = tuple(name for name, spec in STAGES.items() if spec.online)
PAIR_READERS = tuple(name for name, spec in STAGES.items() if spec.reads_pairs)
