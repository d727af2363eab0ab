"""Each stage's config rules and size plan (`STAGE_RULES`, `STAGE_PLANS`, by the stages of `rlhf.core.stages`): what
its settings must satisfy, and how its batches split over the processes, checked before anything loads, one line
each naming the keys to change.

The rules are functions of the config alone, in a module that imports no torch (tests/test_commands.py holds it to
that), so that
- a stage script checks its own before its heavy imports (`rlhf.stage.cli.answer_early`: under a second) and
  again as it starts (`rlhf.stage.cli.start_stage`);
- `bash run_all.sh` checks those of every chosen stage at start-up, all at once (`check_stages`), not each one when
  its stage starts, after the stages before it have run.
A reward spec's functions are imported here (`rlhf.rollout.reward_spec`): a user's module that imports torch takes
that long. The size plans load torch where they run; `bash run_all.sh` checks them for the launcher's processes, and
again against the data once the data stage has written it (`check_batch_splits`). The model's context length needs
its config file and stays with its stage (`rlhf.models.modeling.check_context_from_config`).

Rules every stage shares (positive counts, shares, the pair sources, LoRA, the rollout engine) are checked as the
config loads (`rlhf.stage.config.validate`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rlhf.core.errors import UserError, raise_all
from rlhf.judges import OpenAIJudge
from rlhf.models.sources import check_model_source
from rlhf.rollout.reward_spec import load_reward_spec
from rlhf.stage.config import check_whole_groups, require_positive
from rlhf.stage.schema import Config, DPOLossConfig, GRPOConfig, OnlineDPOConfig, PPOConfig, RAFTConfig, RLConfig

# The choices of keys whose implementations live in modules that load torch; tests/test_rules.py checks that they
# name the same ones.
DPO_LOSS_TYPES = ("sigmoid", "ipo", "cdpo")  # dpo.loss_type, online_dpo.loss_type: rlhf.core.losses.DPO_LOSSES
GRPO_LOSS_NORMALIZATIONS = ("sequence", "token")  # grpo.loss_normalization: rlhf.core.losses.GRPO_NORMALIZERS
GRPO_BASELINES = ("group_mean", "leave_one_out")  # grpo.baseline: rlhf.core.ops.group_advantages
GRPO_RATIO_LEVELS = ("token", "sequence")  # grpo.ratio_level: rlhf.core.losses.GRPO_RATIO_LEVELS
ONLINE_DPO_JUDGES = ("reward", "simulated", "openai")  # online_dpo.judge
ONLINE_DPO_REFERENCES = ("sft", "iteration")  # online_dpo.reference
EVAL_JUDGES = ("gold", "reward", "independent", "openai")  # eval.judges
# eval.benchmarks, and the file each reads (../shared/data/README.md)
EVAL_BENCHMARKS = {"ifeval": "IFEval's input_data.jsonl", "xstest": "XSTest's xstest_prompts.csv"}


# ----------------------------------------------------------------------------- data and SFT


def check_model_sources(cfg: Config) -> None:
    """The local tokenizer and model folders (or GGUF file) exist."""
    check_model_source("tokenizer.name_or_path", cfg.tokenizer.name_or_path)
    check_model_source("model.name_or_path", cfg.model.name_or_path)


def check_data_config(cfg: Config) -> None:
    if cfg.data.chat_template and cfg.tokenizer.train_from_data:
        raise UserError("data.chat_template needs a pretrained tokenizer; set tokenizer.train_from_data=false")
    check_model_sources(cfg)
    spec = cfg.data.instructions
    if spec.n_train < 0 or spec.n_val < 0:
        raise UserError(f"data.instructions.n_train and n_val must be >= 0, got {spec.n_train} and {spec.n_val}")
    if spec.n_train and not 0 < spec.val_fraction < 1:
        raise UserError(f"data.instructions.val_fraction must be in (0, 1), got {spec.val_fraction}")


# ----------------------------------------------------------------------------- reward models and collected pairs


def check_reward_config(cfg: Config) -> None:
    reward = cfg.reward
    if not 0 <= reward.label_smoothing < 0.5:
        raise UserError(f"reward.label_smoothing must be in [0, 0.5), got {reward.label_smoothing}")
    if reward.length_heuristic and (reward.label_smoothing or reward.margin):
        raise UserError(
            "reward.length_heuristic replaces the Bradley-Terry likelihood that reward.margin and "
            "reward.label_smoothing modify; set those to 0, or reward.length_heuristic=false"
        )
    if reward.length_heuristic_lr <= 0:
        raise UserError(f"reward.length_heuristic_lr must be > 0, got {reward.length_heuristic_lr}")
    if reward.logprob_distill_coef < 0:
        raise UserError(f"reward.logprob_distill_coef must be >= 0, got {reward.logprob_distill_coef}")
    if cfg.model.lora.for_stage("reward").enabled and reward.pooling != "last":
        raise UserError(
            "model.lora.enabled on the reward stage (model.lora.stages) needs reward.pooling=last (LoRA keeps only a "
            "last-token score head)"
        )


def check_judge_rm_config(cfg: Config) -> None:
    """The independent judge's reward model, trained as the reward model is (section `reward`)."""
    check_reward_config(cfg)
    if not cfg.data.judge_fraction:
        raise UserError(
            "judge_rm trains on the pairs data.judge_fraction holds out, and it is 0; set data.judge_fraction "
            "(e.g. 0.3) and re-run the data stage"
        )


def check_collect_config(cfg: Config) -> None:
    c = cfg.collect
    if c.samples_per_prompt < 2:
        raise UserError(f"collect.samples_per_prompt={c.samples_per_prompt} must be at least 2 to form a pair")
    if c.temperature <= 0:
        raise UserError(f"collect.temperature={c.temperature} must be > 0, or the K samples of a prompt are identical")
    if c.max_new_tokens > cfg.data.max_response_tokens:
        raise UserError(
            f"collect.max_new_tokens={c.max_new_tokens} exceeds data.max_response_tokens="
            f"{cfg.data.max_response_tokens}; every longer pair would be dropped, so lower it"
        )
    if c.annotator == "simulated" and cfg.data.path != "embedded":
        raise UserError(
            "collect.annotator=simulated labels only the embedded task's prompts (data.path=embedded); "
            "use collect.annotator=openai or collect.annotator=reward"
        )
    if c.annotator == "reward":
        if not c.reward_model:
            raise UserError("collect.annotator=reward needs collect.reward_model=FOLDER (a reward model's folder)")
        if not (Path(c.reward_model) / "config.json").is_file():
            raise UserError(
                f"collect.reward_model={c.reward_model} is not a model folder (no config.json); give a folder "
                "written by the reward stage, e.g. outputs/<run>/reward/model"
            )
    if c.annotator == "openai" and not (judge := OpenAIJudge(cfg.judge)).available():
        raise UserError(
            f"collect.annotator=openai {judge.unavailable_reason}; export it (and OPENAI_BASE_URL or judge.base_url "
            "for another server), or use collect.annotator=simulated"
        )


# ----------------------------------------------------------------------------- the online stages


def check_rl_config(stage: str, rcfg: RLConfig | RAFTConfig) -> None:
    """Rules every online stage shares: eval_every >= 0, and a reward spec that parses and imports."""
    if rcfg.eval_every < 0:
        raise UserError(f"{stage}.eval_every={rcfg.eval_every} must be >= 0 (0: only the final evaluation)")
    load_reward_spec(rcfg.reward, f"{stage}.reward")


def check_ppo_config(pcfg: PPOConfig) -> None:
    check_rl_config("ppo", pcfg)
    if pcfg.value_model not in ("separate", "shared"):
        raise UserError(f"ppo.value_model must be 'separate' or 'shared', got '{pcfg.value_model}'")
    if pcfg.kl_coef < 0:
        raise UserError(f"ppo.kl_coef={pcfg.kl_coef} must be >= 0")
    if pcfg.kl_target is not None and (pcfg.kl_target <= 0 or pcfg.kl_horizon < 1):
        raise UserError(
            f"ppo.kl_target={pcfg.kl_target} must be > 0 and ppo.kl_horizon={pcfg.kl_horizon} >= 1 "
            "(or kl_target=null for a fixed beta)"
        )
    if not 0 <= pcfg.gamma <= 1 or not 0 <= pcfg.lam <= 1:
        raise UserError(f"ppo.gamma={pcfg.gamma} and ppo.lam={pcfg.lam} must lie in [0, 1]")


def check_grpo_config(gcfg: GRPOConfig) -> None:
    check_rl_config("grpo", gcfg)
    leave_one_out = gcfg.baseline == "leave_one_out"
    if gcfg.group_size < 1 or ((gcfg.scale_rewards or leave_one_out) and gcfg.group_size < 2):
        raise UserError(f"grpo.group_size={gcfg.group_size} must be at least 2 (a group needs a spread of rewards)")
    check_whole_groups("grpo", gcfg.batch_size, gcfg.group_size)
    for key, choices in (
        ("loss_normalization", GRPO_LOSS_NORMALIZATIONS),
        ("baseline", GRPO_BASELINES),
        ("ratio_level", GRPO_RATIO_LEVELS),
    ):
        if getattr(gcfg, key) not in choices:
            raise UserError(f"grpo.{key} must be one of {', '.join(sorted(choices))}, got '{getattr(gcfg, key)}'")
    if gcfg.kl_coef < 0:
        raise UserError(f"grpo.kl_coef={gcfg.kl_coef} must be >= 0 (0: no KL term and no reference model)")


def check_raft_config(rcfg: RAFTConfig) -> None:
    for key in ("rounds", "prompts_per_round", "samples_per_prompt", "top_k", "max_new_tokens", "eval_batch_size"):
        if getattr(rcfg, key) < 1:
            raise UserError(f"raft.{key}={getattr(rcfg, key)} must be at least 1")
    if rcfg.top_k >= rcfg.samples_per_prompt:
        raise UserError(
            f"raft.top_k={rcfg.top_k} must be less than raft.samples_per_prompt={rcfg.samples_per_prompt}: "
            "keeping every sample of a prompt ignores their scores; lower top_k or sample more"
        )
    if rcfg.temperature <= 0:
        raise UserError(
            f"raft.temperature={rcfg.temperature} must be > 0: greedy decoding samples the same response N times"
        )
    check_rl_config("raft", rcfg)


# ----------------------------------------------------------------------------- the DPO family


def check_dpo_loss(section: str, node: DPOLossConfig) -> None:
    """The loss settings `dpo` and `online_dpo` share (DPOLossConfig: the same keys in both sections)."""
    loss_type, label_smoothing, length_heuristic = node.loss_type, node.label_smoothing, node.length_heuristic
    if loss_type not in DPO_LOSS_TYPES:
        raise UserError(f"{section}.loss_type='{loss_type}' is not one of: {', '.join(DPO_LOSS_TYPES)}")
    if node.beta <= 0:
        raise UserError(f"{section}.beta must be > 0, got {node.beta}")
    if not 0 <= label_smoothing < 0.5:
        raise UserError(f"{section}.label_smoothing must be in [0, 0.5), got {label_smoothing}")
    if label_smoothing and loss_type != "cdpo":
        raise UserError(
            f"{section}.label_smoothing={label_smoothing} is only used by {section}.loss_type=cdpo; "
            "set one or the other"
        )
    if not 0 <= length_heuristic < 1:
        raise UserError(f"{section}.length_heuristic must be in [0, 1), got {length_heuristic}")
    if length_heuristic and loss_type != "sigmoid":
        raise UserError(f"{section}.length_heuristic is a rater model for {section}.loss_type=sigmoid, not {loss_type}")
    if node.rpo_alpha < 0:
        raise UserError(f"{section}.rpo_alpha must be >= 0 (0: plain DPO), got {node.rpo_alpha}")


def check_dpo_config(cfg: Config) -> None:
    d = cfg.dpo
    check_dpo_loss("dpo", d)
    if d.max_train_pairs is not None and d.max_train_pairs < d.batch_size:
        raise UserError(
            f"dpo.max_train_pairs={d.max_train_pairs} is fewer than one batch (dpo.batch_size={d.batch_size})"
        )
    if d.eval_prompts < 0:
        raise UserError(f"dpo.eval_prompts={d.eval_prompts} must be >= 0 (0: no held-out samples)")


def check_online_dpo_config(ocfg: OnlineDPOConfig) -> None:
    """The rules of the `online_dpo` section alone."""
    check_rl_config("online_dpo", ocfg)
    require_positive(
        ocfg, ["batch_size", "micro_batch_size", "forward_batch_size", "epochs", "total_episodes"], "online_dpo"
    )
    check_dpo_loss("online_dpo", ocfg)
    if ocfg.judge not in ONLINE_DPO_JUDGES:
        raise UserError(f"online_dpo.judge='{ocfg.judge}' is not one of: {', '.join(ONLINE_DPO_JUDGES)}")
    if ocfg.reference not in ONLINE_DPO_REFERENCES:
        raise UserError(f"online_dpo.reference='{ocfg.reference}' is not one of: {', '.join(ONLINE_DPO_REFERENCES)}")
    if ocfg.samples_per_prompt < 2:
        raise UserError(f"online_dpo.samples_per_prompt={ocfg.samples_per_prompt} must be at least 2 to form a pair")
    if ocfg.micro_batch_tokens is not None:
        raise UserError(
            f"online_dpo.micro_batch_tokens={ocfg.micro_batch_tokens}: online DPO has no token budget (its "
            "micro_batch_size counts pairs); remove it and set online_dpo.micro_batch_size"
        )
    if ocfg.judge != "reward" and ocfg.samples_per_prompt != 2:
        raise UserError(
            f"online_dpo.judge={ocfg.judge} compares two responses; set online_dpo.samples_per_prompt=2 "
            "(or online_dpo.judge=reward to rank more)"
        )
    if ocfg.temperature <= 0:
        raise UserError(f"online_dpo.temperature={ocfg.temperature} must be > 0, or a prompt's samples are identical")


def check_online_dpo_stage(cfg: Config) -> None:
    check_online_dpo_config(cfg.online_dpo)
    if cfg.online_dpo.judge == "simulated" and cfg.data.path != "embedded":
        raise UserError(
            "online_dpo.judge=simulated labels only the embedded task's prompts (data.path=embedded); "
            "use online_dpo.judge=reward or online_dpo.judge=openai"
        )
    if cfg.online_dpo.judge == "openai" and not (judge := OpenAIJudge(cfg.judge)).available():
        raise UserError(
            f"online_dpo.judge=openai {judge.unavailable_reason}; export it (and OPENAI_BASE_URL or judge.base_url "
            "for another server), or use online_dpo.judge=reward"
        )


# ----------------------------------------------------------------------------- evaluation


def requested_judges(cfg: Config) -> list[str]:
    """eval.judges as a list, every name known."""
    requested = [name.strip() for name in cfg.eval.judges.split(",") if name.strip()]
    if unknown := set(requested) - set(EVAL_JUDGES):
        raise UserError(
            f"eval.judges has unknown judge(s) {', '.join(sorted(unknown))}; choose from {', '.join(EVAL_JUDGES)}"
        )
    return requested


def requested_benchmarks(cfg: Config) -> list[str]:
    """eval.benchmarks as a list, every name known and its file present (rlhf/benchmarks/)."""
    from rlhf.benchmarks import locate

    requested = [name.strip() for name in cfg.eval.benchmarks.split(",") if name.strip()]
    if unknown := set(requested) - set(EVAL_BENCHMARKS):
        raise UserError(
            f"eval.benchmarks has unknown benchmark(s) {', '.join(sorted(unknown))}; "
            f"choose from {', '.join(EVAL_BENCHMARKS)}"
        )
    for name in requested:
        path = getattr(cfg.eval, f"{name}_path")
        if not locate(path).is_file():
            raise UserError(f"eval.{name}_path={path} is not a file; point it at {EVAL_BENCHMARKS[name]}")
    if cfg.eval.benchmark_max_new_tokens < 1:
        raise UserError(f"eval.benchmark_max_new_tokens={cfg.eval.benchmark_max_new_tokens} must be >= 1")
    if cfg.eval.benchmark_prompts is not None and cfg.eval.benchmark_prompts < 1:
        raise UserError(f"eval.benchmark_prompts={cfg.eval.benchmark_prompts} must be >= 1, or null for all")
    return requested


def check_eval_config(cfg: Config) -> None:
    requested_judges(cfg)
    requested_benchmarks(cfg)


# ----------------------------------------------------------------------------- size plans
# A training stage's batch arithmetic on `world_size` processes, from the config alone (`size` None) or also
# against what it trains on (`size`: its examples, the online stages' distinct training prompts): the checks it
# repeats at start-up. The planners load torch, so each is imported where it runs.


def plan_offline(section: str) -> Callable[[Config, int, int | None], object]:
    """SFT, the reward models, DPO: how a `section.batch_size` batch splits, and with their size the plan of
    their steps."""

    def plan(cfg: Config, world_size: int, size: int | None) -> object:
        from rlhf.models.training import plan_steps, split_batch

        tcfg = getattr(cfg, section)
        return split_batch(section, tcfg, world_size) if size is None else plan_steps(section, tcfg, size, world_size)

    return plan


def plan_ppo(cfg: Config, world_size: int, n_prompts: int | None) -> object:
    from rlhf.methods.plan import plan_rl

    return plan_rl("ppo", cfg.ppo, world_size, n_prompts)


def plan_grpo(cfg: Config, world_size: int, n_prompts: int | None) -> object:
    from rlhf.methods.plan import check_group_packing, plan_rl

    plan = plan_rl("grpo", cfg.grpo, world_size, n_prompts, cfg.grpo.group_size)
    check_group_packing(plan, cfg.grpo)
    return plan


def plan_raft_stage(cfg: Config, world_size: int, n_prompts: int | None) -> object:
    from rlhf.methods.raft import plan_raft

    return plan_raft(cfg.raft, world_size, n_prompts)


def plan_online_dpo_stage(cfg: Config, world_size: int, n_prompts: int | None) -> object:
    from rlhf.methods.online_dpo import plan_online_dpo

    return plan_online_dpo(cfg.online_dpo, world_size, n_prompts)


# ----------------------------------------------------------------------------- every stage
# Each stage's rules (every stage that reads a config section) and size plan (every stage that trains), by the
# names of `rlhf.core.stages.STAGES`; tests/test_stage_registry.py holds them to it.

STAGE_RULES: dict[str, Callable[[Config], object]] = {
    "data": check_data_config,
    "sft": check_model_sources,
    "collect": check_collect_config,
    "reward": check_reward_config,
    "ppo": lambda cfg: check_ppo_config(cfg.ppo),
    "grpo": lambda cfg: check_grpo_config(cfg.grpo),
    "raft": lambda cfg: check_raft_config(cfg.raft),
    "dpo": check_dpo_config,
    "online_dpo": check_online_dpo_stage,
    "judge_rm": check_judge_rm_config,
    "eval": check_eval_config,
}
STAGE_PLANS: dict[str, Callable[[Config, int, int | None], object]] = {
    "sft": plan_offline("sft"),
    "reward": plan_offline("reward"),
    "judge_rm": plan_offline("reward"),  # trained as the reward model is
    "ppo": plan_ppo,
    "grpo": plan_grpo,
    "raft": plan_raft_stage,
    "dpo": plan_offline("dpo"),
    "online_dpo": plan_online_dpo_stage,
}


def check_stages(cfg: Config, stages: list[str]) -> None:
    """The rules of every stage in `stages`: one UserError naming every broken one, all at once."""
    problems = []
    for stage in stages:
        try:
            STAGE_RULES.get(stage, lambda cfg: None)(cfg)
        except UserError as exc:
            problems.append(str(exc))
    raise_all(problems, "settings are not valid")


def check_batch_splits(cfg: Config, stages: list[str], world_size: int, sizes: dict[str, int] | None = None) -> None:
    """The size plan of every stage in `stages` on `world_size` processes: one UserError naming the keys of every
    stage whose batches do not fit, all at once, before any stage runs. From the config alone, or with `sizes` (what
    each stage trains on, `rlhf.pipeline.driver.data_sizes`, once the data stage has written it) also every check
    that needs the data."""
    sizes = sizes or {}
    problems = []
    for stage in stages:
        try:
            STAGE_PLANS.get(stage, lambda cfg, world_size, size: None)(cfg, world_size, sizes.get(stage))
        except UserError as exc:
            problems.append(str(exc))  # judge_rm repeats the reward stage's: said once (raise_all)
    raise_all(problems, "batch settings do not fit")
