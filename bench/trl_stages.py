"""TRL's side of bench/vs_trl.py: one stage on exactly bench/stages.py's workload, with TRL's trainer.
Prints one JSON line with the same keys as bench/stages.py. Runs under the TRL venv
(bench/requirements-trl.txt), with PYTHONPATH at the repo root.

    python bench/trl_stages.py STAGE --run outputs/tiny [--steps 10] [--warmup 2] [--threads N] [key=value ...]

The same data (the first (warm-up + steps) x batch_size training rows), model and tokenizer (the run
folder's sft/ and reward/ models), batch and micro-batch sizes, number of steps, maximum lengths,
learning rate and gradient clipping as ours, and the settings a fair CPU user would pick:
fp32 (`bf16=False`: TRL 1.x otherwise autocasts to bf16, tens of times slower on a CPU without
bf16 units), no gradient checkpointing (TRL 1.x's default turns it on), DPO's reference log-probs
precomputed (`precompute_ref_log_probs`), no logging or checkpoints. Torch threads: `--threads`
(bench/vs_trl.py gives ours' count under its `equal` setting), else torch's default. TRL 1.x has no PPO trainer.
GRPO: G = grpo.group_size completions per prompt, one generation batch of grpo.batch_size
completions per optimizer step (micro-batches accumulated), k3 KL with beta = grpo.kl_coef against
a reference copy, per-sequence normalisation (`loss_type="grpo"`, as grpo.loss_normalization=sequence),
the same prompts in the same order (`ours_prompt_order`), scored by the run's reward model as ours scores
(`scored_as_ours`). Both sides report their generated tokens.
LoRA: where the preset trains a stage with adapters (`model.lora`, `for_stage`), TRL trains the same ones through
its own `peft_config=` (`peft_config_as_ours`: r, alpha, dropout, target modules, the reward model's score head
trained in full), so DPO's and GRPO's reference is the policy with its adapters disabled, as in ours.
The offline stages report every sequence they trained on (`trained`, bench/trained_sequences.py) and both sides
their trainable parameters, so that bench/vs_trl.py can show both trained the same parameters on the same tokens.
The rows are text as ours reads them (data/train.jsonl: prompts already rendered in the chat template when
`data.chat_template`): TRL treats a plain-string "prompt"/"completion" (or "chosen"/"rejected") as text, applies
no chat template, tokenizes without special tokens being added by this tokenizer and appends the EOS to each
completion, as ours does.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from datasets import Dataset
from profiling import StepProfile
from trained_sequences import TrainedSequences
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, TrainerCallback

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlhf, even under another clone's .venv

from rlhf.data import read_jsonl, unique_prompts
from rlhf.models.lora import REWARD_HEAD, lora_targets
from rlhf.models.memory import peak_memory_mb
from rlhf.models.modeling import load_tokenizer
from rlhf.online.prompts import iteration_prompts
from rlhf.stage.config import load_config, preset_path
from rlhf.stage.run import RunDir, stage_seed
from rlhf.stage.schema import Config

TRL_STAGES = ("sft", "reward", "dpo", "grpo")


class StepClock(TrainerCallback):
    """Wall time at the end of every optimizer step; `profile` (if any) runs over the steps after `warmup`."""

    def __init__(self, warmup: int, profile: StepProfile | None):
        self.step_ends: list[float] = []
        self.warmup = warmup
        self.profile = profile

    def on_train_begin(self, args, state, control, **kwargs):
        if self.profile is not None and self.warmup == 0:
            self.profile.start()

    def on_step_end(self, args, state, control, **kwargs):
        self.step_ends.append(time.perf_counter())
        if self.profile is not None and len(self.step_ends) == self.warmup:
            self.profile.start()

    def on_train_end(self, args, state, control, **kwargs):
        if self.profile is not None:
            self.profile.stop()


def common_args(cfg: Config, stage: str, steps: int) -> dict:
    """TrainingArguments shared by every TRL trainer: our stage's sizes and optimiser, fp32 on CPU, no I/O."""
    tcfg = getattr(cfg, stage)
    return {
        "output_dir": f"/tmp/trl-bench-{stage}",
        "max_steps": steps,
        "per_device_train_batch_size": tcfg.micro_batch_size,
        "gradient_accumulation_steps": tcfg.batch_size // tcfg.micro_batch_size,
        "learning_rate": tcfg.lr,
        "weight_decay": tcfg.weight_decay,
        "adam_epsilon": tcfg.adam_eps,
        "max_grad_norm": tcfg.max_grad_norm,
        "lr_scheduler_type": tcfg.scheduler,
        "warmup_steps": round(tcfg.warmup_ratio * steps),  # as rlhf.models.training.build_scheduler
        "bf16": False,
        "fp16": False,
        "gradient_checkpointing": False,
        "use_cpu": not torch.cuda.is_available(),
        "report_to": "none",
        "save_strategy": "no",
        "logging_steps": 10**6,
        "disable_tqdm": True,
        "seed": cfg.run.seed,
        "dataloader_num_workers": 0,
    }


def peft_config_as_ours(cfg: Config, stage: str, model):
    """TRL's `peft_config` for `stage`: the adapters ours puts on `model` (`rlhf.models.lora.with_lora`), or None
    when the preset trains every weight of that stage. The same r, alpha, dropout and target modules (`lora_targets`:
    the architecture's defaults under `auto`); a sequence-classification model's score head is trained in full
    (`modules_to_save`), as ours trains it."""
    lora = cfg.model.lora.for_stage(stage)
    if not lora.enabled:
        return None
    import peft
    from transformers.pytorch_utils import Conv1D

    targets = lora_targets(model, lora.target_modules)
    classifier = hasattr(model, REWARD_HEAD)
    return peft.LoraConfig(
        task_type="SEQ_CLS" if classifier else "CAUSAL_LM",
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        fan_in_fan_out=any(  # GPT-2's Conv1D stores W transposed
            isinstance(module, Conv1D) for name, module in model.named_modules() if name.rpartition(".")[2] in targets
        ),
        modules_to_save=[REWARD_HEAD] if classifier else None,
    )


def record_sequences(trainer, stage: str) -> TrainedSequences:
    """Every sequence `trainer` trains on from now on (its collator's batches), as bench/stages.py records ours'."""
    trained, collate = TrainedSequences(), trainer.data_collator

    def collate_and_record(examples):
        batch = collate(examples)
        masks = batch["attention_mask"].bool()
        if stage == "sft":  # labels: -100 on the prompt (completion_only_loss) and the pads
            contexts = (masks & (batch["labels"] == -100)).sum(1)
        elif stage == "dpo":  # chosen rows, then rejected rows; completion_mask 0 on the prompt
            contexts = (masks & (batch["completion_mask"] == 0)).sum(1)
        else:  # reward: the whole sequence is read
            contexts = torch.zeros(len(masks), dtype=torch.long)
        for ids, mask, context in zip(batch["input_ids"], masks, contexts):
            trained.add(ids[mask], int(context))
        return batch

    trainer.data_collator = collate_and_record
    return trained


def build_trainer(stage: str, cfg: Config, run: RunDir, rows: list[dict], steps: int):
    from trl import DPOConfig, DPOTrainer, RewardConfig, RewardTrainer, SFTConfig, SFTTrainer

    tokenizer = load_tokenizer(run.model_dir("sft"))
    max_length = cfg.data.max_prompt_tokens + cfg.data.max_response_tokens + 1  # ours: prompt + response + EOS
    policy_path = str(run.model_dir("sft"))
    if stage == "sft":
        data = Dataset.from_list([{"prompt": r["prompt"], "completion": r["chosen"]} for r in rows])
        args = SFTConfig(**common_args(cfg, stage, steps), max_length=max_length, completion_only_loss=True)
        model = AutoModelForCausalLM.from_pretrained(policy_path)
        peft_config = peft_config_as_ours(cfg, stage, model)
        return SFTTrainer(
            model=model, args=args, train_dataset=data, processing_class=tokenizer, peft_config=peft_config
        )
    if stage == "grpo":
        return grpo_trainer(cfg, run, rows, steps, tokenizer, policy_path)
    pairs = Dataset.from_list([{k: r[k] for k in ("prompt", "chosen", "rejected")} for r in rows])
    if stage == "reward":
        args = RewardConfig(**common_args(cfg, stage, steps), max_length=max_length, disable_dropout=True)
        model = AutoModelForSequenceClassification.from_pretrained(policy_path, num_labels=1)
        model.config.pad_token_id = tokenizer.pad_token_id
        peft_config = peft_config_as_ours(cfg, stage, model)
        return RewardTrainer(
            model=model, args=args, train_dataset=pairs, processing_class=tokenizer, peft_config=peft_config
        )
    if stage == "dpo":

        class TimedDPOTrainer(DPOTrainer):
            """TRL 1.x precomputes the reference log-probs in the constructor: time that pass, which ours
            counts in its end-to-end time, so that it counts on both sides."""

            reference_s = 0.0

            def _precompute_ref_logps(self, *args, **kwargs):
                start = time.perf_counter()
                try:
                    return super()._precompute_ref_logps(*args, **kwargs)
                finally:
                    TimedDPOTrainer.reference_s += time.perf_counter() - start

        args = DPOConfig(
            **common_args(cfg, stage, steps),
            max_length=max_length,
            beta=cfg.dpo.beta,
            loss_type=[cfg.dpo.loss_type],
            precompute_ref_log_probs=True,
            precompute_ref_batch_size=cfg.dpo.eval_batch_size,
            disable_dropout=True,
        )
        model = AutoModelForCausalLM.from_pretrained(policy_path)
        # with peft_config and no ref_model, TRL's reference is the policy with its adapters disabled, as ours
        peft_config = peft_config_as_ours(cfg, stage, model)
        return TimedDPOTrainer(
            model=model, args=args, train_dataset=pairs, processing_class=tokenizer, peft_config=peft_config
        )


def grpo_trainer(cfg: Config, run: RunDir, rows: list[dict], steps: int, tokenizer, policy_path: str):
    """TRL's GRPOTrainer on ours' prompts (`rows`, in ours' order), with ours' GRPO settings and reward."""
    from trl import GRPOConfig, GRPOTrainer

    gcfg = cfg.grpo
    prompts = Dataset.from_list([{"prompt": r["prompt"]} for r in rows])
    args = GRPOConfig(
        **common_args(cfg, "grpo", steps),
        num_generations=gcfg.group_size,
        max_completion_length=gcfg.max_new_tokens,
        temperature=gcfg.temperature,
        top_p=gcfg.top_p,
        top_k=gcfg.top_k,
        beta=gcfg.kl_coef,
        epsilon=gcfg.clip,
        num_iterations=gcfg.epochs,
        scale_rewards="group" if gcfg.scale_rewards else "none",
        loss_type="grpo",
        disable_dropout=True,
        shuffle_dataset=False,  # the prompts come in ours' order (`ours_prompt_order`)
    )
    reward_model = AutoModelForSequenceClassification.from_pretrained(str(run.model_dir("reward")))
    model = AutoModelForCausalLM.from_pretrained(policy_path)
    return GRPOTrainer(
        model=model,
        reward_funcs=scored_as_ours(reward_model, load_tokenizer(run.model_dir("reward")), gcfg.missing_eos_penalty),
        args=args,
        train_dataset=prompts,
        processing_class=tokenizer,
        peft_config=peft_config_as_ours(cfg, "grpo", model),  # the reference: adapters disabled, as ours
    )


def scored_as_ours(reward_model, tokenizer, missing_eos_penalty: float):
    """TRL's own reward-model call (texts tokenized, one forward pass, the score at the last token), on the texts
    ours scores. TRL decodes completions without special tokens, so given the model it would score each text at
    its last word, but the model was trained to read the EOS (bench/trl_reward_check.py: on 64 SFT samples a mean
    of -1.32 where ours gives +0.16), and the two trainers then learned from different rewards.
    Here a finished completion gets its EOS back, and one cut at max_completion_length loses
    `missing_eos_penalty`, as ours does."""
    reward_model.eval()
    eos = tokenizer.eos_token_id

    def reward_model_with_eos(prompts, completions, completion_ids, **kwargs) -> list[float]:
        finished = [eos in ids for ids in completion_ids]
        texts = [p + c + (tokenizer.eos_token if done else "") for p, c, done in zip(prompts, completions, finished)]
        inputs = tokenizer(texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
        with torch.inference_mode():
            scores = reward_model(**inputs).logits[:, 0]
        return [score - (0.0 if done else missing_eos_penalty) for score, done in zip(scores.tolist(), finished)]

    return reward_model_with_eos


def ours_prompt_order(cfg: Config, run: RunDir, steps: int) -> list[dict]:
    """The prompts our GRPO samples in its first `steps` iterations, in its order (`rlhf.online.prompts`), for TRL to
    read unshuffled: each step then generates for the same 16 prompts on both sides."""
    texts = unique_prompts(read_jsonl(run.stage("data") / "train.jsonl"))
    per_step = cfg.grpo.batch_size // cfg.grpo.group_size
    seed = stage_seed(cfg, "grpo")
    return [{"prompt": texts[i]} for step in range(steps) for i in iteration_prompts(len(texts), per_step, step, seed)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=TRL_STAGES)
    parser.add_argument("--run", required=True)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--profile", action="store_true", help="torch.profiler operator shares of the timed steps")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")
    args = parser.parse_intermixed_args(argv)  # the overrides follow the options (bench/vs_trl.py's command)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = load_config(preset_path(args.preset), args.overrides)
    run = RunDir(args.run)
    total_steps = args.warmup + args.steps
    batch_size = getattr(cfg, args.stage).batch_size
    if args.stage == "grpo":
        rows = ours_prompt_order(cfg, run, total_steps)
    else:
        rows = read_jsonl(run.stage("data") / "train.jsonl")[: total_steps * batch_size]
    torch.manual_seed(cfg.run.seed)
    trainer = build_trainer(args.stage, cfg, run, rows, total_steps)
    # offline stages: token positions (and operators) of the timed steps, as bench/stages.py measures them;
    # GRPO: operators of the whole train() (warm-up included), as bench/stages.py profiles its RL stages
    offline = args.stage != "grpo"
    profile = StepProfile(trainer.model if offline else None, args.profile)
    clock = StepClock(args.warmup, profile if offline else None)
    trainer.add_callback(clock)
    trained = record_sequences(trainer, args.stage) if offline else None
    lengths = CompletionLengths(trainer)
    if not offline:
        trainer.add_callback(lengths)
    start = time.perf_counter()
    if not offline:
        profile.start()
    trainer.train()
    end = time.perf_counter()
    profile.stop()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    memory, kind = peak_memory_mb(torch.device(device))
    result = {
        "stage": args.stage,
        "steps": args.steps,
        "warmup": args.warmup,
        "batch_size": batch_size,
        "timed_s": end - clock.step_ends[args.warmup - 1] if args.warmup else end - start,
        "total_s": end - start + getattr(trainer, "reference_s", 0.0),  # DPO: the reference pass in the constructor
        "threads": torch.get_num_threads(),
        "peak_memory_mb": memory,
        "memory_kind": kind,
        "device": device,
        "profile": profile.summary(),
        "trainable_params": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
    }
    if offline:
        result["trained"] = trained.summary()
    else:
        result["tokens"] = generated_tokens(lengths.per_step, args.warmup, total_steps, batch_size)
    print(json.dumps(result))


class CompletionLengths(TrainerCallback):
    """GRPO's mean completion length of each optimizer step (one generation batch each here), read from the
    trainer's `_metrics` after every step: TRL keeps them there until it logs, at the end of `train()`."""

    def __init__(self, trainer):
        self.trainer, self.per_step = trainer, []

    def on_step_end(self, args, state, control, **kwargs):
        self.per_step = list(self.trainer._metrics["train"].get("completions/mean_length", []))


def generated_tokens(per_step: list[float], warmup: int, total_steps: int, batch_size: int) -> int:
    """Generated tokens (EOS included) in the steps after `warmup`, as bench/stages.py counts ours, so that the two
    sides' generation work can be compared."""
    if len(per_step) != total_steps:
        raise SystemExit(f"error: TRL recorded {len(per_step)} generation batches, expected {total_steps}")
    return round(sum(per_step[warmup:]) * batch_size)


if __name__ == "__main__":
    main()
