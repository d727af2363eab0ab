"""Loading a config: the defaults of the schema (`rlhf.stage.schema`), then a YAML preset or file, then
`section.key=value` overrides, each value coerced to its field's type. Unknown keys, wrong types, counts below 1 and
numbers outside their natural range (`validate`) fail at start-up with one line naming the nearest valid key or the
fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import shlex
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from rlhf.core.errors import UserError
from rlhf.core.stages import PAIR_READERS, TRAINED_STAGES
from rlhf.data import DEMONSTRATION_FORMATS, PAIR_FORMATS
from rlhf.stage.schema import LORA_STAGES, Config, ModelConfig, RolloutConfig

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


def available_presets() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def preset_path(name: str) -> Path:
    path = CONFIG_DIR / f"{name}.yaml"
    if not path.is_file():
        raise UserError(f"unknown preset '{name}'; available presets: {', '.join(available_presets())}")
    return path


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> Config:
    """Defaults <- YAML file <- `section.key=value` overrides, validated against the dataclasses."""
    cfg = Config()
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise UserError(
                f"config file not found: {path}; give an existing YAML file, or --preset with one of: "
                f"{', '.join(available_presets())}"
            )
        try:
            tree = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise UserError(
                f"{path} is not valid YAML{where}: {what}; the mistake is there or just before it"
            ) from None
        if not isinstance(tree, dict):
            raise UserError(f"{path} must hold a mapping of sections, got {type(tree).__name__}")
        _merge(cfg, tree, source=str(path))
        defaults = {"model": f"model {cfg.model.name_or_path}", "data": f"data {cfg.data.path}"}
        if unnamed := [section for section in defaults if section not in tree]:
            raise UserError(
                f"{path} has no {' or '.join(repr(s) for s in unnamed)} section, so the run would take the default "
                f"{' and '.join(defaults[s] for s in unnamed)} (from the Hub); add the section, or start from a "
                "preset's file (configs/tiny.yaml) and change what you need"
            )
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UserError(f"bad override '{item}': expected section.key=value")
        set_key(cfg, key.strip(), raw)
    validate(cfg)
    return cfg


# Keys that count something (examples, tokens, steps, prompts), by section (dotted, as `all_keys` names it): below 1
# nothing could run, or a batch plan divides by zero. None: no cap.
_TRAIN_COUNT_KEYS = ("epochs", "max_steps", "batch_size", "micro_batch_size", "micro_batch_tokens", "eval_batch_size")
_RL_COUNT_KEYS = (  # RLConfig's, and OnlineConfig's max_new_tokens
    "total_episodes",
    "batch_size",
    "num_minibatches",
    "micro_batch_size",
    "micro_batch_tokens",
    "forward_batch_size",
    "epochs",
    "max_new_tokens",
)
COUNT_KEYS = {
    "run": ("log_every",),
    "data": ("max_prompt_tokens", "max_response_tokens", "max_train_pairs", "max_eval_pairs"),
    "data.embedded": ("n_train_pairs", "n_test_pairs"),
    "tokenizer": ("vocab_size",),
    "sft": (*_TRAIN_COUNT_KEYS, "rouge_prompts"),
    "reward": _TRAIN_COUNT_KEYS,
    "dpo": (*_TRAIN_COUNT_KEYS, "max_train_pairs"),
    "ppo": _RL_COUNT_KEYS,
    "grpo": _RL_COUNT_KEYS,
    "raft": (*_TRAIN_COUNT_KEYS, "max_new_tokens", "samples_per_prompt"),
    "online_dpo": (*_RL_COUNT_KEYS, "samples_per_prompt"),
    "collect": ("prompts", "samples_per_prompt", "pairs_per_prompt", "max_new_tokens", "batch_size"),
    "eval": ("num_prompts", "batch_size", "max_new_tokens", "best_of_n"),
}
# The natural range of every number named so, in any section (a learning rate below 0 would pass to the optimizer
# and fail an hour in): leaf name -> (low, low included, high, high included); None: unbounded. NaN fails every one.
# The judge's numbers (judge.validate) and rpo_alpha (its stages' rules) are checked where they are used.
RANGE_KEYS = {
    **dict.fromkeys(
        ("lr", "value_lr", "length_heuristic_lr", "adam_eps", "clip", "clip_high", "value_clip"),
        (0.0, False, None, False),
    ),
    **dict.fromkeys(
        (
            "weight_decay",
            "max_grad_norm",
            "kl_coef",
            "entropy_coef",
            "vf_coef",
            "temperature",
            "missing_eos_penalty",
            "logprob_distill_coef",
        ),
        (0.0, True, None, False),
    ),
    **dict.fromkeys(("warmup_ratio", "gamma", "lam"), (0.0, True, 1.0, True)),
    "top_p": (0.0, False, 1.0, True),
    "head_dropout": (0.0, True, 1.0, False),
}  # fmt: skip
PAIR_SOURCES = ("dataset", "collected", "both")  # reward.pairs and dpo.pairs
EVAL_BASELINES = ("sft", "reference")  # eval.baseline
ANNOTATORS = ("simulated", "openai", "reward")  # collect.annotator


def require_in_range(dotted: str, value: Any) -> None:
    """One-line UserError when `value`, the number at `dotted`, lies outside its leaf's RANGE_KEYS range (None passes:
    an optional setting left unset)."""
    low, low_in, high, high_in = RANGE_KEYS[dotted.rpartition(".")[2]]
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    above = value >= low if low_in else value > low
    below = high is None or (value <= high if high_in else value < high)
    if not (above and below):  # NaN fails both
        if high is None:
            bound = f">= {low:g}" if low_in else f"> {low:g}"
        else:
            bound = f"in {'[' if low_in else '('}{low:g}, {high:g}{']' if high_in else ')'}"
        raise UserError(f"{dotted}={value} must be {bound}; set {dotted} to a value in that range")


def require_positive(node: Any, keys: Iterable[str], prefix: str) -> None:
    """One-line UserError for the first of `keys` (fields of `node`) that is not positive: an int
    below 1 or a float not above 0. None passes (it means "no cap")."""
    for key in keys:
        value = getattr(node, key)
        if value is None or value > 0:
            continue
        bound = "at least 1" if isinstance(value, int) else "> 0"
        raise UserError(f"{prefix}.{key}={value} must be {bound}; set {prefix}.{key} to a positive number")


def check_whole_groups(stage: str, batch_size: int, group_size: int) -> None:
    """A rollout batch holds whole groups of `group_size` responses per prompt: grpo's rule
    (`rlhf.methods.rules`) and every RL stage's batch plan (`rlhf.methods.plan`)."""
    if batch_size % group_size:
        raise UserError(
            f"{stage}.batch_size={batch_size} must be divisible by {stage}.group_size={group_size} "
            f"(whole groups per batch); set {stage}.batch_size to a multiple of {group_size}"
        )


def validate(cfg: Config) -> None:
    """Rules every stage shares, checked once at load time: counts are positive, rates and coefficients lie in their
    natural ranges (RANGE_KEYS), shares lie in [0, 1], and the judge settings are usable. Stage-specific rules stay
    with their stages."""
    for dotted in all_keys(cfg):
        section, _, leaf = dotted.rpartition(".")
        counts = leaf in COUNT_KEYS.get(section, ())
        if counts or leaf in RANGE_KEYS:
            node = cfg
            for name in section.split("."):
                node = getattr(node, name)
            if counts:
                require_positive(node, [leaf], section)
            else:
                require_in_range(dotted, getattr(node, leaf))
    shares = {key: getattr(cfg.data, key) for key in ("val_fraction", "test_fraction", "judge_fraction")}
    for key, share in shares.items():
        if not 0 <= share < 1:
            raise UserError(
                f"data.{key} must be in [0, 1), got {share}; set a share of the prompts, e.g. data.{key}=0.1"
            )
    if sum(shares.values()) >= 1:
        raise UserError(
            "data.val_fraction + data.test_fraction + data.judge_fraction = "
            f"{sum(shares.values()):g} leaves no training prompts; lower them to a sum below 1"
        )
    for key in ("annotator_noise", "length_bias"):  # probabilities of the embedded task's annotator
        if not 0 <= (value := getattr(cfg.data.embedded, key)) <= 1:
            raise UserError(f"data.embedded.{key}={value} is a probability; set it in [0, 1]")
    for section in TRAINED_STAGES:
        node = getattr(cfg, section)
        if node.micro_batch_size > node.batch_size:
            raise UserError(
                f"{section}.micro_batch_size={node.micro_batch_size} is larger than {section}.batch_size="
                f"{node.batch_size}; set {section}.micro_batch_size to a divisor of {node.batch_size}"
            )
    if not 0 <= cfg.data.max_invalid_fraction <= 1:
        raise UserError(
            f"data.max_invalid_fraction={cfg.data.max_invalid_fraction} must lie in [0, 1]; "
            "0 stops at the first invalid row, 1 never stops"
        )
    if cfg.data.format not in PAIR_FORMATS:
        raise UserError(f"data.format={cfg.data.format!r} is unknown; use one of {', '.join(PAIR_FORMATS)}")
    if cfg.data.path == "embedded" and cfg.data.format != "hh":
        raise UserError("data.path=embedded generates HH-format pairs; set data.format=hh")
    if cfg.data.sft_path is not None and cfg.data.format not in DEMONSTRATION_FORMATS:
        raise UserError(
            f"data.sft_path is set but data.format={cfg.data.format} has no demonstration format; "
            f"set data.format to one of {', '.join(DEMONSTRATION_FORMATS)}, or data.sft_path=null to train SFT on "
            "the chosen responses"
        )
    if cfg.eval.baseline not in EVAL_BASELINES:
        raise UserError(f"eval.baseline={cfg.eval.baseline!r} is unknown; use one of {', '.join(EVAL_BASELINES)}")
    for section in PAIR_READERS:
        source = getattr(cfg, section).pairs
        if source not in PAIR_SOURCES:
            raise UserError(f"{section}.pairs={source!r} is not a pair source; use one of {', '.join(PAIR_SOURCES)}")
    if cfg.collect.annotator not in ANNOTATORS:
        raise UserError(f"collect.annotator={cfg.collect.annotator!r} is unknown; use one of {', '.join(ANNOTATORS)}")
    check_lora_config(cfg.model)
    check_rollout_config(cfg.rollout)
    cfg.judge.validate()


ROLLOUT_ENGINES = ("hf", "vllm", "auto")


def check_rollout_config(rollout: RolloutConfig) -> None:
    if rollout.engine not in ROLLOUT_ENGINES:
        raise UserError(f"rollout.engine={rollout.engine!r} is unknown; use one of {', '.join(ROLLOUT_ENGINES)}")
    if not 0 < rollout.gpu_memory_utilization <= 1:
        raise UserError(f"rollout.gpu_memory_utilization={rollout.gpu_memory_utilization} must lie in (0, 1]")
    if rollout.tis_cap is not None and rollout.tis_cap < 1:
        raise UserError(f"rollout.tis_cap={rollout.tis_cap} must be >= 1 (Yao et al. 2025 use 2), or null for off")


# Full SFT, then LoRA (model.lora.stages): the recipe when full SFT is affordable, and the only one that learns on a
# randomly initialised base, whose adapters would otherwise sit on random weights.
LORA_AFTER_SFT = ",".join(LORA_STAGES[1:])


def check_lora_config(model: ModelConfig) -> None:
    """The LoRA settings that need no model; target module names are checked against the model when it is built.

    Adapters on a randomly initialised base learn little (LoRA adapts pretrained weights), so LoRA on sft with
    model.init=random fails, unless model.lora.stages names sft: a choice made knowingly, e.g. to test the code."""
    lora = model.lora
    if lora.r < 1:
        raise UserError(f"model.lora.r={lora.r} must be at least 1; set the adapter rank, e.g. model.lora.r=8")
    if lora.alpha <= 0:
        raise UserError(f"model.lora.alpha={lora.alpha} must be > 0; e.g. model.lora.alpha={2 * lora.r}")
    if not 0 <= lora.dropout < 1:
        raise UserError(f"model.lora.dropout={lora.dropout} must lie in [0, 1)")
    if not [name for name in lora.target_modules.split(",") if name.strip()]:
        raise UserError("model.lora.target_modules is empty; give layer names (e.g. c_attn,c_proj), auto or all-linear")
    names = [name.strip() for name in lora.stages.split(",") if name.strip()]
    if not names:
        raise UserError("model.lora.stages is empty; name the stages that train adapters (e.g. reward,ppo,dpo) or all")
    if unknown := [name for name in names if name not in LORA_STAGES] if names != ["all"] else []:
        raise UserError(
            f"model.lora.stages: {', '.join(unknown)} is not a stage that trains; "
            f"choose from {', '.join(LORA_STAGES)}, or all"
        )
    if lora.enabled and model.init == "random" and names == ["all"]:
        raise UserError(
            "model.lora.enabled=true trains sft as adapters on model.init=random weights, which learn little (LoRA "
            "adapts pretrained weights) and leave every later stage a noise policy; train SFT in full and LoRA after "
            f"it with model.lora.stages={LORA_AFTER_SFT}, or model.init=pretrained (name sft in model.lora.stages "
            "to train it with LoRA anyway)"
        )


def set_key(cfg: Config, dotted: str, raw: Any) -> None:
    """Set one dotted key (e.g. `sft.lr`), coercing `raw` to the field's declared type."""
    *parents, leaf = dotted.split(".")
    node: Any = cfg
    for depth, name in enumerate(parents):
        node = getattr(node, name, None) if dataclasses.is_dataclass(node) else None
        if (
            isinstance(node, dict) and depth == len(parents) - 1
        ):  # one entry of a mapping: model.config_overrides.n_layer=2
            try:
                node[leaf] = yaml.safe_load(raw) if isinstance(raw, str) else raw
            except yaml.YAMLError:
                raise UserError(f"{dotted}={raw} is not a YAML value; quote it, e.g. '{dotted}=\"{raw}\"'") from None
            return
        if not dataclasses.is_dataclass(node):
            raise UserError(_unknown_key_message(cfg, dotted))
    _assign(cfg, node, leaf, raw, dotted)


def _merge(cfg: Config, tree: dict, source: str) -> None:
    for key, value in tree.items():
        try:
            _assign(cfg, cfg, str(key), value, str(key))
        except UserError as exc:
            raise UserError(f"{source}: {exc}") from None


def _assign(cfg: Config, node: Any, key: str, value: Any, dotted: str) -> None:
    hints = typing.get_type_hints(type(node))
    if key not in hints:
        raise UserError(_unknown_key_message(cfg, dotted))
    hint = hints[key]
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            first = dataclasses.fields(hint)[0].name
            raise UserError(f"'{dotted}' is a section, not a value; set its keys, e.g. {dotted}.{first}=...")
        for child_key, child_value in value.items():
            _assign(cfg, getattr(node, key), str(child_key), child_value, f"{dotted}.{child_key}")
    else:
        try:
            setattr(node, key, coerce(value, hint, dotted))
        except UserError as exc:
            current = getattr(node, key)
            example = shlex.quote(f"{dotted}={_spelled(current)}")  # as pasted into a shell: a mapping has spaces
            fix = "give a value of that type, or null" if current is None else f"e.g. {example}"
            raise UserError(f"{exc}; {fix}") from None


def _spelled(value: Any) -> str:
    """A value as it would be written in an override (the current one serves as an example)."""
    if isinstance(value, (bool, dict)):
        return yaml.safe_dump(value, default_flow_style=True, sort_keys=False).strip().removesuffix("...").strip()
    return str(value)


# Spellings users bring from other trainers (transformers.TrainingArguments, TRL).
_SYNONYMS = {
    "learning_rate": "lr",
    "num_train_epochs": "epochs",
    "num_epochs": "epochs",
    "per_device_train_batch_size": "micro_batch_size",
    "per_device_eval_batch_size": "eval_batch_size",
    "lr_scheduler_type": "scheduler",
    "warmup": "warmup_ratio",
    "model_name_or_path": "name_or_path",
    "dataset": "path",
}


def _unknown_key_message(cfg: Config, dotted: str) -> str:
    section, _, leaf = dotted.rpartition(".")
    keys = all_keys(cfg)
    siblings = [k for k in keys if k.rpartition(".")[0] == section]
    synonym = f"{section}.{_SYNONYMS.get(leaf, '')}" if section else ""
    if synonym in siblings:
        close = [synonym]
    else:
        close = [
            k
            for k in siblings
            if k.rpartition(".")[2]
            in difflib.get_close_matches(leaf, [s.rpartition(".")[2] for s in siblings], n=1, cutoff=0.6)
        ]
        close = close or difflib.get_close_matches(dotted, keys, n=1, cutoff=0.6)
    if close:
        return f"unknown config key '{dotted}'; did you mean '{close[0]}'?"
    if siblings:
        return (
            f"unknown config key '{dotted}'; valid keys in '{section}': "
            f"{', '.join(k.rpartition('.')[2] for k in siblings)}"
        )
    sections = ", ".join(f.name for f in dataclasses.fields(cfg))
    return f"unknown config key '{dotted}'; keys look like section.key with section one of: {sections}"


def all_keys(node: Any, prefix: str = "") -> list[str]:
    keys = []
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            keys += all_keys(value, f"{prefix}{f.name}.")
        else:
            keys.append(f"{prefix}{f.name}")
    return keys


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def coerce(raw: Any, hint: Any, dotted: str) -> Any:
    """Convert a YAML or command-line value to the annotated type, or raise a one-line UserError."""
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if raw is None or (isinstance(raw, str) and raw.strip().lower() in {"null", "none", "~"}):
            return None
        return coerce(raw, args[0], dotted)
    try:
        if hint is bool:
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
            raise ValueError
        if hint is int:
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError
            return int(raw) if not isinstance(raw, str) else int(raw.strip())
        if hint is float:
            if isinstance(raw, bool):
                raise ValueError
            return float(raw)
        if hint is str:
            if isinstance(raw, (dict, list)):
                raise ValueError
            return str(raw)
        if hint is dict or origin is dict:
            value = yaml.safe_load(raw) if isinstance(raw, str) else raw
            if not isinstance(value, dict):
                raise ValueError
            return value
    except (ValueError, TypeError, yaml.YAMLError):
        type_name = getattr(hint, "__name__", str(hint))
        raise UserError(f"config key '{dotted}' expects {type_name}, got {raw!r}") from None
    raise UserError(f"config key '{dotted}' has an unsupported type {hint}")


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def dump_yaml(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


GGUF_SUFFIX = ".gguf"


def is_gguf(source: str | None) -> bool:
    return source is not None and source.lower().endswith(GGUF_SUFFIX)
