"""What training runs on: the accelerator, the offline stages' batch plans and data order, optimizers and
schedulers, the SFT loss, and sharded forward-only passes. The step and the loop are `rlhf.loop`.

Data order is a function of (seed, epoch) alone and the data position is the optimizer step, so
a resumed run sees exactly the batches an uninterrupted one would. Each optimizer step takes
one *global* batch; process r takes its contiguous slice and splits it into micro-batches, so a
run on W processes computes the same gradient as one process accumulating W times as long
(DDP averages over processes what accumulation averages over micro-batches).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object, set_seed
from tqdm import tqdm

from rlhf.core.errors import UserError
from rlhf.core.losses import sft_loss
from rlhf.models.modeling import token_logprobs
from rlhf.stage.run import stage_seed
from rlhf.stage.schema import Config, TrainConfig


def sft_batch_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
    """The SFT loss (a `rlhf.loop.step.LossFn`) of a `rlhf.core.batching.collate_sequences` batch: mean NLL of its
    response tokens (and the EOS that ends them) given the prompt; prompt and pad tokens carry no loss. Its
    statistic: `train/nll`."""
    logprobs = token_logprobs(model, batch["input_ids"], batch["attention_mask"])  # (B, T)
    loss, stats = sft_loss(logprobs, batch["response_mask"])
    return loss, {f"train/{name}": value for name, value in stats.items()}


def response_tokens(batch: dict[str, torch.Tensor]) -> float:
    """What `sft_batch_loss` averages over: the batch's response tokens (its loss units, `rlhf.loop.fit`)."""
    return float(batch["response_mask"].sum())


def idle_cores(window_s: float = 0.3) -> float | None:
    """Cores that other processes left idle over the last `window_s` seconds, from /proc/stat's
    aggregate line (Linux); None where it cannot be read."""

    def idle_and_total() -> tuple[int, int]:
        ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return ticks[3] + ticks[4], sum(ticks)  # idle + iowait, all states

    try:
        idle_before, total_before = idle_and_total()
        time.sleep(window_s)
        idle_after, total_after = idle_and_total()
    except (OSError, ValueError, IndexError):
        return None
    if total_after == total_before:
        return None
    return (idle_after - idle_before) / (total_after - total_before) * (os.cpu_count() or 1)


def warn_if_cpu_shared(accelerator: Accelerator) -> None:
    """On CPU, one line of advice when other processes keep cores busy, nothing says how idle OpenMP threads wait
    (neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT is set: libgomp's threads spin 300,000 times at each barrier) and
    OMP_NUM_THREADS is unset.

    torch's default is one intra-op thread per core. When another process keeps a core busy, its
    threads spin at every barrier waiting for the one that was descheduled: a reward-model step on
    a 2-core machine shared with one busy job took 3.0 s with 2 threads and 0.34 s with 1
    (docs/performance.md). The thread count is left alone, so a stage's numbers never depend on the machine's
    load (a different count can change float reductions); the advice says how to choose it.
    """
    wait_set = any(os.environ.get(key) for key in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"))
    if accelerator.device.type != "cpu" or "OMP_NUM_THREADS" in os.environ or wait_set:
        return
    idle = idle_cores()
    if idle is not None and round(idle) < torch.get_num_threads():
        accelerator.print(
            f"[cpu] only {idle:.1f} of {os.cpu_count()} cores idle: torch's {torch.get_num_threads()} threads will "
            "spin against the other jobs; start the stage with GOMP_SPINCOUNT=1000 (bash run_all.sh sets it), "
            "often several times faster"
        )


BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")  # x86 AVX512-BF16 and AMX-BF16; Arm's BF16 (`Features`)


def cpu_computes_bf16(cpuinfo: str) -> bool | None:
    """Whether the CPU has bf16 arithmetic (BF16_CPU_FLAGS), from /proc/cpuinfo's text; None when the text lists
    no flags at all (a format this does not know)."""
    flags = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return bool(flags & set(BF16_CPU_FLAGS)) if flags else None


def warn_if_bf16_is_emulated(accelerator: Accelerator, mixed_precision: str) -> None:
    """On a CPU without bf16 arithmetic, one line at start-up: bf16 autocast there runs each op through float32
    conversions, many times slower than float32 itself (docs/gpu.md, "bf16 on CPU")."""
    if mixed_precision != "bf16" or accelerator.device.type != "cpu":
        return
    try:
        computes = cpu_computes_bf16(Path("/proc/cpuinfo").read_text())
    except OSError:  # not Linux: nothing to read the flags from
        return
    if computes is False:
        accelerator.print(
            "[cpu] run.mixed_precision=bf16 on a CPU without bf16 arithmetic (/proc/cpuinfo has none of "
            f"{', '.join(BF16_CPU_FLAGS)}): every op is emulated, tiny SFT measured about 30x slower than in float32 "
            "(docs/gpu.md); pass run.mixed_precision=no"
        )


def make_accelerator(cfg: Config, stage: str | None = None) -> Accelerator:
    """One Accelerator per stage; each process gets its own seed (Huang et al. 2024, detail 13), from
    `stage_seed(cfg, stage)` (run.method_seed for an alignment stage), and on CPU, advice on threads when
    other jobs share the cores (`warn_if_cpu_shared`) and on bf16 without bf16 arithmetic."""
    if cfg.run.mixed_precision not in ("no", "bf16", "fp16"):
        raise UserError(f"run.mixed_precision must be 'no', 'bf16' or 'fp16', got '{cfg.run.mixed_precision}'")
    # bf16 autocast runs on CPU too (slowly without bf16 units; it is how the tests exercise the GPU presets'
    # precision path); fp16 needs a GradScaler, which accelerate offers only on GPUs.
    if cfg.run.mixed_precision == "fp16" and not torch.cuda.is_available():
        raise UserError("run.mixed_precision=fp16 needs a CUDA GPU; on CPU pass run.mixed_precision=bf16 or no")
    # cpu=True when there is no GPU: only then does accelerate join torchrun's processes into a
    # gloo group (MULTI_CPU) instead of running each one alone.
    accelerator = Accelerator(mixed_precision=cfg.run.mixed_precision, cpu=not torch.cuda.is_available())
    set_seed(cfg.run.seed if stage is None else stage_seed(cfg, stage), device_specific=True)
    warn_if_bf16_is_emulated(accelerator, cfg.run.mixed_precision)
    warn_if_cpu_shared(accelerator)
    return accelerator


@dataclass(frozen=True)
class StepPlan:
    steps_per_epoch: int
    total_steps: int
    batch_size: int  # examples per optimizer step, all processes
    per_process: int  # examples per process per optimizer step
    micro_batch_size: int  # examples per forward/backward pass (`micro_batch_size`)
    accumulation: int  # micro-batches per process per optimizer step

    def micro_rows(self, order: list[int], position: int, rank: int) -> list[list[int]]:
        """Process `rank`'s micro-batches of the global batch at `position` in an epoch's `order`: its
        contiguous slice of that batch, cut into micro-batches, so W processes train on what one would."""
        start = position * self.batch_size + rank * self.per_process
        local = order[start : start + self.per_process]
        return [local[k * self.micro_batch_size : (k + 1) * self.micro_batch_size] for k in range(self.accumulation)]


def budget_micro_rows(
    rows: list[int], lengths: list[int], max_tokens: int, count: int | None = None
) -> list[list[int]]:
    """`rows` (one process's share of a batch; `lengths`: tokens per example) in micro-batches of at most
    `max_tokens` positions each (rows x the longest row's length, the padding included): sorted longest first
    (stably), each micro-batch filled while the next row fits; a row longer than the budget goes alone. With
    `count` (at least as many as the budget makes), the micro-batch with the most rows is halved until there are
    `count`: processes whose forward passes gather sharded weights (FSDP) must each take as many."""
    micro: list[list[int]] = []
    for row in sorted(rows, key=lambda i: -lengths[i]):
        if micro and (len(micro[-1]) + 1) * lengths[micro[-1][0]] <= max_tokens:
            micro[-1].append(row)
        else:
            micro.append([row])
    while count is not None and len(micro) < count:
        widest = max(range(len(micro)), key=lambda k: len(micro[k]))
        if len(micro[widest]) < 2:
            raise ValueError(f"{len(rows)} rows cannot make {count} micro-batches")
        half = len(micro[widest]) // 2
        micro[widest : widest + 1] = [micro[widest][:half], micro[widest][half:]]
    return micro


def micro_batch_size(stage: str, configured: int, per_process: int, share: str) -> int:
    """The micro-batch a process accumulates over: `{stage}.micro_batch_size`, or the process's whole share
    of a batch when that is smaller, so that a batch splits over more processes than the configured
    micro-batch allows (the tiny preset's sft.batch_size=32 = micro_batch_size on 4 processes: 8 each) and
    one process runs as configured. `share` describes `per_process`, which must be a multiple of it."""
    micro = min(configured, per_process)
    if per_process % micro:
        raise UserError(
            f"{stage}: {share} is not divisible by {stage}.micro_batch_size={configured}; "
            f"set {stage}.micro_batch_size to a divisor of {per_process}, or change the number of processes"
        )
    return micro


def split_batch(stage: str, tcfg: TrainConfig, world_size: int) -> tuple[int, int]:
    """(examples per process, micro-batch size) of a `{stage}.batch_size` batch on `world_size` processes:
    config only, so the pipeline checks it for the launch before any stage runs (`rlhf.pipeline.launch`)."""
    if tcfg.batch_size % world_size:
        raise UserError(
            f"{stage}.batch_size={tcfg.batch_size} is not divisible by {world_size} processes; "
            f"set {stage}.batch_size to a multiple of {world_size}, or change the number of processes"
        )
    per_process = tcfg.batch_size // world_size
    share = f"a batch of {per_process} per process ({stage}.batch_size={tcfg.batch_size} / {world_size})"
    return per_process, micro_batch_size(stage, tcfg.micro_batch_size, per_process, share)


def plan_steps(stage: str, tcfg: TrainConfig, n_examples: int, world_size: int) -> StepPlan:
    """Derived sizes, checked once at start-up with errors that name the keys to change."""
    per_process, micro = split_batch(stage, tcfg, world_size)
    steps_per_epoch = n_examples // tcfg.batch_size
    if steps_per_epoch == 0:
        raise UserError(
            f"{stage}: {n_examples} training examples is fewer than one batch ({stage}.batch_size={tcfg.batch_size})"
        )
    total = math.ceil(tcfg.epochs * steps_per_epoch)
    if tcfg.max_steps is not None:
        total = min(total, tcfg.max_steps)
    if total <= 0:
        raise UserError(f"{stage}: no optimizer steps to take; raise {stage}.epochs or {stage}.max_steps")
    return StepPlan(steps_per_epoch, total, tcfg.batch_size, per_process, micro, per_process // micro)


def epoch_order(lengths: list[int], seed: int, epoch: int, batch_size: int, group_by_length: bool) -> list[int]:
    """The example order of one epoch, a function of (seed, epoch) alone.

    With `group_by_length`, a shuffled order is cut into mega-batches of 32 batches, each sorted
    by length and cut into batches, and the batches are shuffled again: batches hold similar
    lengths (far less padding) while their order stays random (as transformers' LengthGroupedSampler).
    """
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(len(lengths), generator=generator).tolist()
    if not group_by_length:
        return order
    mega = 32 * batch_size
    grouped = [
        i
        for start in range(0, len(order), mega)
        for i in sorted(order[start : start + mega], key=lambda i: -lengths[i])
    ]
    batches = [grouped[start : start + batch_size] for start in range(0, len(grouped) - batch_size + 1, batch_size)]
    return [i for b in torch.randperm(len(batches), generator=generator).tolist() for i in batches[b]]


def build_optimizer(model: torch.nn.Module, tcfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices only, never on biases, norms or embeddings' 1-D params.

    A parameter with an `_optim` dict of its own (e.g. {"lr": 0.05}) gets a group with those settings
    (the convention of the state-spaces/Mamba code); the schedule scales every group alike.
    """
    trained = [p for p in model.parameters() if p.requires_grad]
    own = [p for p in trained if hasattr(p, "_optim")]
    decay = [p for p in trained if not hasattr(p, "_optim") and p.ndim >= 2]
    no_decay = [p for p in trained if not hasattr(p, "_optim") and p.ndim < 2]
    groups = [{"params": decay, "weight_decay": tcfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    groups += [{"params": [p], **p._optim} for p in own]
    return torch.optim.AdamW(groups, lr=tcfg.lr, eps=tcfg.adam_eps)


def build_scheduler(optimizer: torch.optim.Optimizer, tcfg: TrainConfig, total_steps: int):
    from transformers import get_scheduler

    try:
        return get_scheduler(
            tcfg.scheduler,
            optimizer,
            num_warmup_steps=round(tcfg.warmup_ratio * total_steps),
            num_training_steps=total_steps,
        )
    except ValueError:
        raise UserError(
            f"unknown scheduler '{tcfg.scheduler}'; use cosine, linear, constant or constant_with_warmup"
        ) from None


@torch.no_grad()
def forward_map(
    fn: Callable[[list], list],
    items: list,
    batch_size: int,
    accelerator: Accelerator,
    lengths: list[int] | None = None,
    desc: str | None = None,
) -> list:
    """Apply `fn` (a batch of items -> a list of per-item results) over `items` with no autograd,
    sharded across processes, and return the results in the original order on every process.

    With `lengths` (tokens per item), batches are formed longest first: each batch then holds
    items of similar length, so little of a forward-only pass is spent on padding, and the widest
    batch (the one that could run out of memory) comes first. `desc` names a progress bar (main process).
    """
    order = sorted(range(len(items)), key=lambda i: -lengths[i]) if lengths is not None else list(range(len(items)))
    mine = order[accelerator.process_index :: accelerator.num_processes]
    results = []
    starts = range(0, len(mine), batch_size)
    for start in tqdm(starts, desc=desc, disable=desc is None or not accelerator.is_main_process, leave=False):
        indices = mine[start : start + batch_size]
        results += list(zip(indices, fn([items[i] for i in indices])))
    if accelerator.num_processes > 1:
        results = gather_object(results)
    return [value for _, value in sorted(results, key=lambda pair: pair[0])]


def set_cpu_threads(stage: str, threads: int, device: torch.device) -> None:
    """Intra-op threads on CPU; 0 keeps torch's default, one per core, which a quiet machine wants.
    Small ops (generation steps, a few-million-parameter model) are latency-bound: when other jobs keep
    the cores busy, threads spin waiting for each other and one thread is several times faster."""
    if threads < 0:
        raise UserError(f"{stage}.cpu_threads={threads} must be >= 0 (0: torch's default)")
    if threads and device.type == "cpu":
        torch.set_num_threads(threads)
