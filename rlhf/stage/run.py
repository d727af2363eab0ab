"""The run folder: where each stage reads its inputs and writes its outputs.

    <output-dir>/
      summary.json            every stage merges its results here (keys documented in docs/metrics.md)
      data/                   train/val/test.jsonl, stats.json, lengths.png, tokenizer/
      sft/  reward/  ...      one folder per stage:
        model/                final artifact in Hugging Face format (safetensors + tokenizer)
        adapter/              with model.lora.enabled: the LoRA adapters alone (model/ holds them merged)
        checkpoint/           resumable training state (deleted when the stage completes)
        config.yaml           the resolved config the stage ran with
        metrics.jsonl         every logged metric, keys stage/group/name
        complete.json         written last: the config fingerprint the outputs belong to
      tensorboard/<stage>/      one TensorBoard run per stage, tags group/name (`objective/kl`)

A stage is *complete* when complete.json exists and its fingerprint matches the current
config. The fingerprint covers the config sections the stage reads and, recursively, the
fingerprints of the stages it reads from, so changing SFT settings re-runs SFT and everything
downstream of it, while changing only reward settings re-runs only the reward stage.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

import yaml

from rlhf.core.errors import UserError
from rlhf.core.stages import METHOD_STAGES, PAIR_READERS, STAGES
from rlhf.data import read_jsonl
from rlhf.stage.config import all_keys, is_gguf, load_config, to_dict
from rlhf.stage.schema import LORA_STAGES, Config

LATER_SECTIONS = ("rollout",)  # config sections added after runs were made: fingerprinted only when set
LATER_KEYS = ("micro_batch_tokens",)  # keys added to a section after runs were made: fingerprinted only when set
STAGE_SCRIPTS = {name: spec.script for name, spec in STAGES.items()}
COMPLETE_FILE = "complete.json"


def stage_seed(cfg: Config, stage: str) -> int:
    """The seed `stage` runs with: run.method_seed for the alignment stages when it is set, else run.seed."""
    if stage in METHOD_STAGES and cfg.run.method_seed is not None:
        return cfg.run.method_seed
    return cfg.run.seed


def fixed_inputs(stage: str) -> tuple[str, ...]:
    """The stages whose outputs `stage` reads under every config: its inputs, then its optional ones
    (`rlhf.core.stages.StageSpec`)."""
    return (*STAGES[stage].inputs, *STAGES[stage].optional_inputs)


def stage_inputs(stage: str, cfg: Config) -> tuple[str, ...]:
    """The stages whose outputs `stage` reads under this config: `fixed_inputs`, plus `collect` for a
    pair reader whose `pairs` setting is "collected" or "both", and `judge_rm` for eval when data.judge_fraction
    holds pairs out for it."""
    if stage in PAIR_READERS and getattr(cfg, stage).pairs != "dataset":
        return (*fixed_inputs(stage), "collect")
    if stage == "eval" and judge_needed(cfg):
        return (*fixed_inputs(stage), "judge_rm")
    return fixed_inputs(stage)


def required_inputs(stage: str, cfg: Config) -> tuple[str, ...]:
    """The input stages `stage` cannot run without under this config: `stage_inputs` less its optional ones."""
    return tuple(name for name in stage_inputs(stage, cfg) if name not in STAGES[stage].optional_inputs)


def config_inputs(stage: str, cfg: Config) -> tuple[str, ...]:
    """The inputs this config adds to the stage's fixed ones (`fixed_inputs`); they must have completed."""
    return tuple(name for name in stage_inputs(stage, cfg) if name not in fixed_inputs(stage))


def stage_sections(stage: str, cfg: Config) -> tuple[str, ...]:
    """The config sections `stage` reads (its spec's `sections`): the `judge` section only where the stage asks the
    LLM judge (collect.annotator or online_dpo.judge = openai), so a judge.* change re-judges in eval alone."""
    sections = STAGES[stage].sections
    asks_the_llm_judge = {"collect": cfg.collect.annotator == "openai", "online_dpo": cfg.online_dpo.judge == "openai"}
    if asks_the_llm_judge.get(stage, True):
        return sections
    return tuple(section for section in sections if section != "judge")


def judge_needed(cfg: Config) -> bool:
    """True when the data stage holds pairs out for the independent judge (data.judge_fraction), so a pipeline run
    includes `judge_rm` and eval judges with it."""
    return cfg.data.judge_fraction > 0


def collect_needed(cfg: Config) -> bool:
    """True when some stage trains on collected pairs, so a pipeline run must include `collect`."""
    return any("collect" in stage_inputs(stage, cfg) for stage in PAIR_READERS)


def fingerprinted_model_section(cfg: Config) -> dict:
    """The `model` section as the data and sft fingerprints cover it: without model.lora.stages, and with
    model.lora.enabled as sft applies it. So full SFT then LoRA shares its data and SFT with full fine-tuning (a run
    folder's data/ and sft/ serve both), and the fingerprints of runs made before model.lora.stages existed (LoRA on
    every stage, or off) are unchanged. Which later stage trains adapters is in that stage's own fingerprint."""
    section = to_dict(cfg.model)
    del section["lora"]["stages"]
    section["lora"]["enabled"] = cfg.model.lora.for_stage("sft").enabled
    return section


class RunDir:
    def __init__(self, root: str | Path, preset: str | None = None, args: Sequence[str] | None = None):
        self.root = Path(root)
        self.preset = preset
        # the command-line arguments that chose this folder and config (without --force): suggested commands repeat them
        self.args = list(args) if args is not None else None

    def stage(self, name: str) -> Path:
        return self.root / name

    @property
    def summary_path(self) -> Path:
        return self.root / "summary.json"

    @property
    def tokenizer_dir(self) -> Path:
        return self.root / "data" / "tokenizer"

    @property
    def base_model_dir(self) -> Path:
        """The data stage's dequantized copy of a GGUF model.name_or_path (`rlhf.models.sources`)."""
        return self.root / "data" / "base_model"

    def pretrained_source(self, cfg: Config) -> str | None:
        """Where the pretrained model loads from: model.name_or_path, or this run's dequantized copy of a GGUF."""
        return str(self.base_model_dir) if is_gguf(cfg.model.name_or_path) else cfg.model.name_or_path

    def model_dir(self, stage: str) -> Path:
        return self.root / stage / "model"

    def checkpoint_dir(self, stage: str) -> Path:
        return self.root / stage / "checkpoint"

    def tensorboard_dir(self, stage: str) -> Path:
        return self.root / "tensorboard" / stage

    # -- completion -------------------------------------------------------------------

    def fingerprint(self, stage: str, cfg: Config) -> str:
        tree = {**to_dict(cfg), "model": fingerprinted_model_section(cfg)}
        defaults = to_dict(Config())
        for section, values in tree.items():
            for key in LATER_KEYS:
                if key in values and values[key] == defaults[section][key]:
                    del values[key]
        payload = {
            "seed": stage_seed(cfg, stage),
            "mixed_precision": cfg.run.mixed_precision,
            "sections": {
                section: tree[section]
                for section in stage_sections(stage, cfg)
                # a section added later counts only when set, so runs made before it existed stay complete
                if not (section in LATER_SECTIONS and tree[section] == defaults[section])
            },
            "inputs": {name: self.fingerprint(name, cfg) for name in stage_inputs(stage, cfg)},
        }
        lora = cfg.model.lora  # sft's use of it is in the model section (fingerprinted_model_section)
        trains_as = STAGES[stage].trains_as
        if lora.enabled and trains_as in LORA_STAGES[1:] and lora.stage_names() != LORA_STAGES:
            payload["lora"] = trains_as in lora.stage_names()  # some stages train adapters: is this one of them?
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]

    def is_complete(self, stage: str, cfg: Config) -> bool:
        marker = self.stage(stage) / COMPLETE_FILE
        if not marker.is_file():
            return False
        return json.loads(marker.read_text()).get("fingerprint") == self.fingerprint(stage, cfg)

    def completed_fingerprint(self, stage: str) -> str | None:
        """The config fingerprint `stage` last completed with (None: it has not completed)."""
        marker = self.stage(stage) / COMPLETE_FILE
        return json.loads(marker.read_text()).get("fingerprint") if marker.is_file() else None

    def mark_complete(self, stage: str, cfg: Config, info: dict) -> None:
        """Written last, once the stage's outputs are published; the resumable checkpoint is then obsolete."""
        write_json_atomic(self.stage(stage) / COMPLETE_FILE, {"fingerprint": self.fingerprint(stage, cfg), **info})
        shutil.rmtree(self.checkpoint_dir(stage), ignore_errors=True)

    def clear_complete(self, stage: str) -> None:
        (self.stage(stage) / COMPLETE_FILE).unlink(missing_ok=True)

    def require(self, stages: str | Iterable[str], cfg: Config, then: str | None = None) -> None:
        """Fail at start-up, in one line, when an input stage has not completed for this config. The line names
        every stage missing (the inputs' own inputs too), the keys a stage run with another config differs in,
        and one `run_all.sh` command that builds them and then runs `then` (the stage starting)."""
        stages = (stages,) if isinstance(stages, str) else tuple(stages)
        if all(self.is_complete(stage, cfg) for stage in stages):
            return
        unfinished = self.unfinished(stages, cfg)
        build = ",".join(stage for stage in STAGES if stage in unfinished or stage == then)
        raise self.unfinished_error(unfinished, cfg, f"bash run_all.sh --only {build} {shlex.join(self.hint_args())}")

    def unfinished(self, stages: Iterable[str], cfg: Config, will_run: Iterable[str] = ()) -> list[str]:
        """`stages` and, through each that has not completed (or is in `will_run`), the stages it needs: those not
        complete for this config and not in `will_run`, in pipeline order."""
        will_run, todo, seen, found = set(will_run), list(stages), set(), set()
        while todo:
            stage = todo.pop()
            if stage in seen:
                continue
            seen.add(stage)
            if stage in will_run or not self.is_complete(stage, cfg):
                todo.extend(required_inputs(stage, cfg))
                if stage not in will_run:
                    found.add(stage)
        return [stage for stage in STAGES if stage in found]

    def unfinished_error(self, unfinished: Sequence[str], cfg: Config, build: str, skipped: str = "") -> UserError:
        """The one-line error for input stages `unfinished` (in pipeline order) that have not completed for this
        config: those never run, and those run with another config with the keys it differs in and how to reuse
        them; `build` is the command that builds them with this config, `skipped` why it is needed (may be "")."""
        missing = [stage for stage in unfinished if not (self.stage(stage) / COMPLETE_FILE).is_file()]
        stale = [stage for stage in unfinished if stage not in missing]
        problems = []
        if missing:
            problems.append(f"{_stage_list(missing)} {'has' if len(missing) == 1 else 'have'} not completed")
        if stale:
            problems.append(f"{_stage_list(stale)} {'was' if len(stale) == 1 else 'were'} run with a different config")
        problem = f"{' and '.join(problems)} in {self.root}{skipped}"
        target = "it" if len(unfinished) == 1 else "them"
        if not stale:
            return UserError(f"{problem}; build {target} with: {build}")
        # The last stale stage's config.yaml covers every section the earlier ones read.
        saved = self.stage(stale[-1]) / "config.yaml"
        ran_with = self.saved_config(stale[-1])
        if ran_with is None:
            return UserError(
                f"{problem}; repeat the overrides {target} ran with, or redo {target} with this config: {build}"
            )
        differences = config_differences(ran_with, cfg, fingerprinted_keys(stale[-1], cfg))
        shown = ", ".join(f"{key}: {_spell(old)} there, {_spell(new)} now" for key, old, new in differences[:5])
        more = f" and {len(differences) - 5} more" if len(differences) > 5 else ""
        overrides = " ".join(shlex.quote(f"{key}={_spell(old)}") for key, old, _ in differences)
        ran = "it ran" if len(unfinished) == 1 else "they ran"
        repeat = f"add {overrides} (the settings {ran} with), or " if differences and not more else ""
        instead_of = f"--preset {self.preset}" if self.preset else "your --config"
        return UserError(
            f"{problem}{f' ({shown}{more})' if shown else ''}; {repeat}pass --config {saved} in place of {instead_of}, "
            f"or redo {target} with this config: {build}"
        )

    def replaced_line(self, stage: str, cfg: Config) -> str | None:
        """For a stage that completed here with another config, the line it prints as it starts again: the
        settings that differ (its own or an input's) and the folder it replaces; None for a stage never completed
        here, or complete for `cfg`."""
        if not (self.stage(stage) / COMPLETE_FILE).is_file() or self.is_complete(stage, cfg):
            return None
        ran_with = self.saved_config(stage)
        if ran_with is None:
            changed = "with settings its config.yaml no longer shows"
        elif differences := config_differences(ran_with, cfg, fingerprinted_keys(stage, cfg)):
            shown = ", ".join(f"{key}: {_spell(old)} there, {_spell(new)} now" for key, old, new in differences[:5])
            changed = f"with {shown}" + (f" and {len(differences) - 5} more" if len(differences) > 5 else "")
        else:
            changed = "with another version of this code"
        return f"[{stage}] completed in {self.stage(stage)} {changed}: re-running it replaces that result"

    def saved_config(self, stage: str) -> Config | None:
        """The config in the stage's config.yaml when it reproduces the fingerprint its complete.json holds."""
        try:
            saved = load_config(self.stage(stage) / "config.yaml")
            marker = json.loads((self.stage(stage) / COMPLETE_FILE).read_text())
        except (UserError, OSError, ValueError):
            return None
        return saved if marker.get("fingerprint") == self.fingerprint(stage, saved) else None

    def hint_args(self) -> list[str]:
        """The arguments a suggested command repeats: those of this command, else the preset and folder."""
        if self.args is not None:
            return self.args
        return [*(["--preset", self.preset] if self.preset else ["--config", "FILE"]), "--output-dir", str(self.root)]

    # -- inputs -----------------------------------------------------------------------

    def training_pairs(self, source: str) -> list[dict]:
        """The train pairs of `reward.pairs` / `dpo.pairs`: "dataset" (data/train.jsonl), "collected"
        (collect/train.jsonl) or "both" (the dataset's, then the collected ones)."""
        files = {"dataset": ["data"], "collected": ["collect"], "both": ["data", "collect"]}[source]
        return [row for stage in files for row in read_jsonl(self.stage(stage) / "train.jsonl")]

    # -- summary ----------------------------------------------------------------------

    def read_summary(self) -> dict:
        if not self.summary_path.is_file():
            return {}
        return json.loads(self.summary_path.read_text())

    def update_summary(self, updates: dict) -> None:
        """Write `updates` into summary.json, atomically. Each section (a stage's results) replaces the
        old one whole, so a re-run stage leaves nothing of an earlier run behind; `timing_s` holds one
        entry per stage, and its entries are merged. A stage's `timing_s` entry comes with its
        `cpu_threads` entry: the torch intra-op threads of the process writing it, which the stage ran
        with (a different count changes the last bits of float reductions, so it belongs with the numbers)."""
        summary = self.read_summary()
        for key, value in updates.items():
            if key == "timing_s":
                summary[key] = {**summary.get(key, {}), **value}
                if stages := [name for name in value if name in STAGES]:
                    import torch

                    threads = {name: torch.get_num_threads() for name in stages}
                    summary["cpu_threads"] = {**summary.get("cpu_threads", {}), **threads}
            else:
                summary[key] = value
        write_json_atomic(self.summary_path, summary)


def fingerprinted_keys(stage: str, cfg: Config) -> list[str]:
    """The config keys `stage`'s fingerprint covers: those of the sections it and its inputs read (transitively),
    the seed and the precision."""
    sections, todo = set(), [stage]
    while todo:
        name = todo.pop()
        sections.update(stage_sections(name, cfg))
        todo.extend(stage_inputs(name, cfg))
    run_keys = ("run.seed", "run.method_seed", "run.mixed_precision")
    return [key for key in all_keys(cfg) if key.partition(".")[0] in sections or key in run_keys]


def config_differences(old: Config, new: Config, keys: Iterable[str]) -> list[tuple[str, object, object]]:
    """(key, old value, new value) for each of `keys` (dotted, e.g. "sft.lr") whose value differs."""

    def value(tree: dict, key: str) -> object:
        for name in key.split("."):
            tree = tree[name]
        return tree

    old_tree, new_tree = to_dict(old), to_dict(new)
    pairs = [(key, value(old_tree, key), value(new_tree, key)) for key in keys]
    return [(key, old_value, new_value) for key, old_value, new_value in pairs if old_value != new_value]


def _spell(value: object) -> str:
    """A config value as a `key=value` override spells it (null, true, 0.0003, {n_layer: 1})."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def _stage_list(stages: Sequence[str]) -> str:
    names = ", ".join(f"'{stage}'" for stage in stages)
    return f"stage {names}" if len(stages) == 1 else f"stages {names}"


def write_text_atomic(path: Path, text: str) -> None:
    """Write to a temporary name, then rename: readers see the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_json_atomic(path: Path, payload: dict) -> None:
    write_text_atomic(path, json.dumps(payload, indent=2, default=float) + "\n")
