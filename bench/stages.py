"""Our side of the benchmarks: one stage's real step functions, timed for a fixed number of steps after
warm-up, on a run folder's data and models. Prints one JSON line (a `StageResult`).

    python bench/stages.py STAGE --run outputs/tiny [--preset tiny] [--steps 10] [--warmup 2] [key=value ...]

`bench/run.py` (the harness) and `bench/vs_trl.py` run this script once per stage, each in its own
process, so that peak memory (max RSS on CPU) and thread settings belong to one stage alone.

- sft, reward, dpo: `rlhf.loop.step.train_step` with the stage's own loss and collation, on the
  first (warm-up + steps) x batch_size training examples, in the stage's epoch order (length
  grouped). DPO's reference pass over those pairs (`PreferenceSplits.logps`, forward-only, as the stage
  precomputes it) runs before the first step and counts in `total_s`. The reward model is trained
  with the Bradley-Terry loss alone (`reward.logprob_distill_coef` is a stage option TRL has no
  counterpart of; its SFT forward pass is left out). With `model.lora` on for the stage, the model
  is built as the stage builds it (`rlhf.models.lora.with_lora`: adapters on frozen weights, the reward
  model's score head trained in full; DPO's reference is the policy with its adapters disabled).
  Every sequence trained on, warm-up included, is recorded (`trained`, bench/trained_sequences.py),
  so that bench/vs_trl.py can check that TRL read the same tokens.
- ppo, grpo: the stage script itself (`main`), run in a scratch run folder whose data/, sft/ and
  reward/ link to the given run, for (warm-up + steps) iterations; its per-iteration
  `<rl>/time/{generate_s,score_s,train_s}` metrics are read back from metrics.jsonl. Held-out
  evaluation, checkpoints and publishing are outside those timers.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script: the stage modules (part*/) import from the repo root

from profiling import StepProfile  # noqa: E402
from trained_sequences import TrainedSequences  # noqa: E402

from rlhf.core.batching import (  # noqa: E402
    collate_sequences,
    collate_shared_prompt_pairs,
    encode_demonstrations,
    encode_pairs,
    shared_prompt_pair_length,
)
from rlhf.core.losses import DPO_AVERAGES_LOGPS, bradley_terry_loss  # noqa: E402
from rlhf.data import read_demonstrations, read_jsonl  # noqa: E402
from rlhf.loop.step import equal_micro_batches, train_step  # noqa: E402
from rlhf.methods.dpo import PrecomputedReference, PreferenceSplits, make_loss_fn  # noqa: E402
from rlhf.models.lora import load_trainable_policy, reference_policy, with_lora  # noqa: E402
from rlhf.models.memory import peak_memory_mb  # noqa: E402
from rlhf.models.modeling import (  # noqa: E402
    SharedPromptPairRewards,
    build_reward_model,
    load_policy,
    load_tokenizer,
)
from rlhf.models.training import build_optimizer, build_scheduler, epoch_order, make_accelerator, sft_batch_loss  # noqa: E402
from rlhf.stage.config import load_config, preset_path  # noqa: E402
from rlhf.stage.run import RunDir  # noqa: E402
from rlhf.stage.schema import Config  # noqa: E402

OFFLINE_STAGES = ("sft", "reward", "dpo")
RL_STAGES = ("ppo", "grpo")
STAGES = OFFLINE_STAGES + RL_STAGES


@dataclass
class StageResult:
    """What one stage's benchmark measured. `timed_s` covers the `steps` steps after warm-up;
    `total_s` is end to end (optimizer set-up, reference pass, warm-up and timed steps)."""

    stage: str
    steps: int
    warmup: int
    batch_size: int  # examples (SFT), pairs (reward, DPO) or samples (PPO, GRPO) per optimizer step / iteration
    timed_s: float
    total_s: float
    tokens: int  # non-pad tokens in the timed steps (RL: generated tokens)
    threads: int
    peak_memory_mb: float
    memory_kind: str
    device: str
    split_s: dict[str, float] = field(default_factory=dict)  # RL: generate / score / train seconds of the timed steps
    profile: dict = field(default_factory=dict)  # StepProfile.summary(): offline, the timed steps; RL, the stage
    trainable_params: int = 0  # parameters the optimizer updates (LoRA: adapters and heads); RL: the policy's
    trained: dict = field(default_factory=dict)  # offline: TrainedSequences.summary() of every step, warm-up included

    @property
    def examples(self) -> int:
        return self.steps * self.batch_size


@dataclass
class OfflineWorkload:
    """An offline stage's training step: the model, its examples (with token lengths, for
    grouping), how a list of them becomes a micro-batch, and the loss."""

    model: torch.nn.Module
    examples: list
    lengths: list[int]
    collate: object
    loss_fn: object
    pad_id: int  # tokens other than this one are counted
    sequences: object  # a collated micro-batch -> [(token ids, context length)] of the sequences it trains on


def train_rows(run: RunDir, n: int) -> list[dict]:
    """The first `n` training rows: the same ones TRL's side trains on."""
    rows = read_jsonl(run.stage("data") / "train.jsonl")
    if len(rows) < n:
        raise SystemExit(f"error: {run.stage('data')}/train.jsonl has {len(rows)} rows, fewer than the {n} needed")
    return rows[:n]


def sft_workload(cfg: Config, run: RunDir, n: int, accelerator) -> OfflineWorkload:
    tokenizer = load_tokenizer(run.model_dir("sft"))
    demonstrations = read_demonstrations(run.stage("data"), "train", cfg.data.sft_path is not None)[:n]  # as SFT reads
    examples = encode_demonstrations(tokenizer, demonstrations)

    def collate(batch_examples):
        prompts, responses = zip(*batch_examples)
        return collate_sequences(
            list(prompts),
            list(responses),
            tokenizer.pad_token_id,
            cfg.data.max_prompt_tokens,
            cfg.data.max_response_tokens + 1,
        )

    # The SFT stage trains from model.init (random on the tiny preset); the SFT weights are the same shape.
    model = with_lora(load_policy(run.model_dir("sft")), cfg.model.lora.for_stage("sft"))
    lengths = [len(p) + len(r) for p, r in examples]
    return OfflineWorkload(model, examples, lengths, collate, sft_batch_loss, tokenizer.pad_token_id, sft_sequences)


def sft_sequences(batch: dict) -> list[tuple[torch.Tensor, int]]:
    """`collate_sequences` rows: each row's tokens, its prompt the context."""
    rows = []
    for ids, mask, response in zip(batch["input_ids"], batch["attention_mask"].bool(), batch["response_mask"]):
        rows.append((ids[mask], int((mask & ~response).sum())))
    return rows


def pair_sequences(batch: dict, prompt_is_context: bool) -> list[tuple[torch.Tensor, int]]:
    """`collate_shared_prompt_pairs` rows: each pair's [prompt][chosen] and [prompt][rejected] sequences, the prompt
    the context when `prompt_is_context` (DPO), none otherwise (the reward model reads the whole sequence)."""
    rows = []
    for ids, chosen, rejected in zip(batch["input_ids"], batch["chosen_mask"], batch["rejected_mask"]):
        context = int((chosen & rejected).sum()) if prompt_is_context else 0
        rows += [(ids[chosen], context), (ids[rejected], context)]
    return rows


def reward_workload(cfg: Config, run: RunDir, n: int, accelerator) -> OfflineWorkload:
    tokenizer = load_tokenizer(run.model_dir("sft"))
    pairs = encode_pairs(tokenizer, train_rows(run, n))

    def collate(batch_pairs):
        return collate_shared_prompt_pairs(
            batch_pairs, tokenizer.pad_token_id, cfg.data.max_prompt_tokens, cfg.data.max_response_tokens + 1
        )

    def loss_fn(pairwise, batch):
        chosen, rejected = pairwise(batch)[:2]
        return bradley_terry_loss(chosen, rejected, None, cfg.reward.label_smoothing)

    model = with_lora(build_reward_model(run.model_dir("sft"), cfg.reward), cfg.model.lora.for_stage("reward"))
    pairwise = SharedPromptPairRewards(model)
    lengths = [shared_prompt_pair_length(p) for p in pairs]
    return OfflineWorkload(
        pairwise, pairs, lengths, collate, loss_fn, tokenizer.pad_token_id, lambda b: pair_sequences(b, False)
    )


def dpo_workload(cfg: Config, run: RunDir, n: int, accelerator) -> OfflineWorkload:
    """DPO against a precomputed reference: the forward-only pass over the pairs runs here, inside
    the end-to-end time, as the stage runs it before training."""
    dcfg = cfg.dpo
    tokenizer = load_tokenizer(run.model_dir("sft"))
    rows = train_rows(run, n)
    average = DPO_AVERAGES_LOGPS[dcfg.loss_type]
    truncation = (cfg.data.max_prompt_tokens, cfg.data.max_response_tokens + 1)
    splits = PreferenceSplits(
        {"train": encode_pairs(tokenizer, rows)},
        {"train": rows},
        tokenizer.pad_token_id,
        truncation,
        dcfg.eval_batch_size,
        accelerator,
        average,
    )
    pairs = splits.pairs["train"]

    # The reference: with LoRA, as the stage, the policy with its adapters disabled (one copy of the weights);
    # without, a copy of the SFT policy, freed before the policy loads.
    lora = cfg.model.lora.for_stage("dpo")
    policy = load_trainable_policy(run.model_dir("sft"), lora) if lora.enabled else None
    if policy is not None:
        reference_model = reference_policy(policy, run.model_dir("sft"), accelerator.device)
    else:
        reference_model = load_policy(run.model_dir("sft")).to(accelerator.device)
    ref_logps = splits.logps(reference_model, "train")  # (N, 2)
    del reference_model
    loss_fn = make_loss_fn(dcfg.loss_type, dcfg.beta, dcfg.label_smoothing, PrecomputedReference({"train": ref_logps}))
    policy = policy if policy is not None else load_policy(run.model_dir("sft"))
    lengths = [shared_prompt_pair_length(p) for p in pairs]
    return OfflineWorkload(
        policy, list(range(len(pairs))), lengths, splits.collate_train, loss_fn, tokenizer.pad_token_id,
        lambda b: pair_sequences(b, True),
    )  # fmt: skip


WORKLOADS = {"sft": sft_workload, "reward": reward_workload, "dpo": dpo_workload}


def measure_offline(
    stage: str, cfg: Config, run: RunDir, steps: int, warmup: int, operators: bool = False
) -> StageResult:
    """`train_step` on `steps` global batches after `warmup` ones, one process, micro-batches as configured;
    the timed steps' token positions are counted, and with `operators` profiled by torch.profiler. Every
    step's sequences are recorded (`trained`)."""
    tcfg = getattr(cfg, stage)
    accelerator = make_accelerator(cfg)
    total_steps = warmup + steps
    start = time.perf_counter()
    workload = WORKLOADS[stage](cfg, run, total_steps * tcfg.batch_size, accelerator)
    trainable = sum(p.numel() for p in workload.model.parameters() if p.requires_grad)
    optimizer = build_optimizer(workload.model, tcfg)
    scheduler = build_scheduler(optimizer, tcfg, total_steps)
    model, optimizer = accelerator.prepare(workload.model, optimizer)
    profile = StepProfile(model, operators)
    order = epoch_order(workload.lengths, cfg.run.seed, 0, tcfg.batch_size, tcfg.group_by_length)
    tokens, trained = 0, TrainedSequences()
    for step in range(total_steps):
        if step == warmup:
            profile.start()
            timed_start = time.perf_counter()
        batch = [workload.examples[i] for i in order[step * tcfg.batch_size : (step + 1) * tcfg.batch_size]]
        micro_batches = [
            workload.collate(batch[k : k + tcfg.micro_batch_size])
            for k in range(0, tcfg.batch_size, tcfg.micro_batch_size)
        ]
        train_step(
            stage, run, f"step {step + 1}", accelerator, model, optimizer, scheduler,
            equal_micro_batches(micro_batches, accelerator.device), workload.loss_fn, tcfg.max_grad_norm,
        )  # fmt: skip
        if step >= warmup:
            tokens += sum(int((mb["input_ids"] != workload.pad_id).sum()) for mb in micro_batches)
        for mb in micro_batches:
            for ids, context in workload.sequences(mb):
                trained.add(ids, context)
    end = time.perf_counter()
    profile.stop()
    memory, kind = peak_memory_mb(accelerator.device)
    return StageResult(
        stage, steps, warmup, tcfg.batch_size, end - timed_start, end - start, tokens,
        torch.get_num_threads(), memory, kind, str(accelerator.device), profile=profile.summary(),
        trainable_params=trainable, trained=trained.summary(),
    )  # fmt: skip


def measure_rl(
    stage: str, preset: str, overrides: list[str], run_root: Path, steps: int, warmup: int, operators: bool = False
) -> StageResult:
    """The RL stage script for (warmup + steps) iterations in a scratch run folder; the timers are its own.
    With `operators`, torch.profiler records the whole stage (loading and warm-up included)."""
    cfg = load_config(preset_path(preset), overrides)
    rl_cfg = getattr(cfg, stage)
    iterations = warmup + steps
    with tempfile.TemporaryDirectory(prefix=f"bench-{stage}-") as scratch:
        for upstream in ("data", "sft", "reward"):
            (Path(scratch) / upstream).symlink_to((run_root / upstream).resolve())
        stage_overrides = [
            f"{stage}.total_episodes={iterations * rl_cfg.batch_size}",
            f"{stage}.save_every=0",
            f"{stage}.samples_every=0",
            f"{stage}.eval_every=0",
            f"{stage}.eval_prompts=8",  # the final held-out comparison is untimed; keep it short
        ]
        if stage == "ppo":
            from part2_ppo_grpo.train_ppo import main
        else:
            from part2_ppo_grpo.train_grpo import main
        profile = StepProfile(None, operators)
        profile.start()
        main(["--preset", preset, "--output-dir", scratch, "--force", *overrides, *stage_overrides])
        profile.stop()
        rows = [
            row
            for row in map(json.loads, (Path(scratch) / stage / "metrics.jsonl").read_text().splitlines())
            if f"{stage}/time/generate_s" in row
        ]
    if len(rows) != iterations:
        raise SystemExit(f"error: {stage} logged {len(rows)} iterations, expected {iterations}")
    phases = ("generate", "score", "train")
    split = {phase: sum(row[f"{stage}/time/{phase}_s"] for row in rows[warmup:]) for phase in phases}
    generated = sum(row[f"{stage}/responses/length_mean"] * rl_cfg.batch_size for row in rows[warmup:])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    # the policy's trainable parameters, built as the stage builds it (after the stage, outside its timers and
    # its logged peak memory; PPO's critic is not counted)
    policy = load_trainable_policy(RunDir(run_root).model_dir("sft"), cfg.model.lora.for_stage(stage))
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    return StageResult(
        stage, steps, warmup, rl_cfg.batch_size, sum(split.values()),
        sum(row[f"{stage}/time/{phase}_s"] for row in rows for phase in phases), round(generated),
        torch.get_num_threads(), rows[-1][f"{stage}/memory/peak_mb"], peak_memory_mb(torch.device(device))[1],
        device, split, profile.summary(), trainable,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=STAGES)
    parser.add_argument(
        "--run", type=Path, required=True, help="a run folder whose data, sft and reward stages completed"
    )
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=10, help="timed optimizer steps (RL: iterations)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps before them")
    parser.add_argument(
        "--profile", action="store_true", help="torch.profiler operator shares (RL stages: of the whole stage)"
    )
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")
    args = parser.parse_intermixed_args(argv)  # overrides may follow the options
    if args.stage in RL_STAGES:
        result = measure_rl(args.stage, args.preset, args.overrides, args.run, args.steps, args.warmup, args.profile)
    else:
        cfg = load_config(preset_path(args.preset), args.overrides)
        result = measure_offline(args.stage, cfg, RunDir(args.run), args.steps, args.warmup, args.profile)
    print(json.dumps(asdict(result)))


if __name__ == "__main__":
    main()
