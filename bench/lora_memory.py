"""What LoRA saves in a policy training step: trainable parameters, gradient and AdamW state bytes, and peak
memory, full fine-tuning against `model.lora.*`, each in a fresh process so peak memory is its own.

    python bench/lora_memory.py --preset tiny [--steps 3] [section.key=value ...]

The policy is the preset's model section with random weights (model.init=random: only its shape matters here),
built and given adapters as the SFT stage does. A step is `rlhf.loop.step.train_step` with the SFT loss on random
tokens: sft.micro_batch_size sequences of data.max_prompt_tokens + data.max_response_tokens + 1 tokens, the
second half of each a response. Peak memory is CUDA max allocated on a GPU, else the process's max RSS, of which
`step_mb` is the part above the RSS before the first step (the interpreter and libraries left out). Prints one
JSON line per variant and their ratios.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class VocabOnly:
    """What `build_policy` reads from a tokenizer for random weights: a size and the special ids."""

    def __init__(self, size: int):
        self.size, self.bos_token_id, self.eos_token_id, self.pad_token_id = size, None, 0, 1

    def __len__(self) -> int:
        return self.size


def rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize() / 2**20


def measure(preset: str, steps: int, overrides: list[str]) -> dict:
    import torch

    from rlhf.loop.step import equal_micro_batches, train_step
    from rlhf.models.lora import with_lora
    from rlhf.models.modeling import build_policy
    from rlhf.models.training import build_optimizer, build_scheduler, make_accelerator, sft_batch_loss
    from rlhf.stage.config import load_config, preset_path
    from rlhf.stage.run import RunDir

    cfg = load_config(preset_path(preset), overrides)
    accelerator = make_accelerator(cfg)
    device = accelerator.device
    model = with_lora(build_policy(cfg.model, VocabOnly(cfg.tokenizer.vocab_size)), cfg.model.lora.for_stage("sft"))
    optimizer = build_optimizer(model, cfg.sft)
    scheduler = build_scheduler(optimizer, cfg.sft, steps)
    model, optimizer = accelerator.prepare(model, optimizer)
    width = cfg.data.max_prompt_tokens + cfg.data.max_response_tokens + 1
    generator = torch.Generator().manual_seed(cfg.run.seed)
    ids = torch.randint(2, cfg.tokenizer.vocab_size, (cfg.sft.micro_batch_size, width), generator=generator)
    batch = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "response_mask": torch.arange(width).expand_as(ids) >= width // 2,
    }  # (B, T) each
    before_mb = torch.cuda.memory_allocated(device) / 2**20 if device.type == "cuda" else rss_mb()
    with tempfile.TemporaryDirectory() as folder:
        run = RunDir(folder)  # named in train_step's error messages only
        for step in range(steps):
            micro = equal_micro_batches([batch], device)
            train_step(
                "sft", run, f"step {step + 1}", accelerator, model, optimizer, scheduler, micro, sft_batch_loss, 1.0
            )
    if device.type == "cuda":
        peak_mb, source = torch.cuda.max_memory_allocated(device) / 2**20, "cuda_max_memory_allocated"
    else:
        peak_mb, source = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "cpu_max_rss"
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer_tensors = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    return {
        "lora": cfg.model.lora.enabled,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu-{torch.get_num_threads()}t",
        "parameters": sum(p.numel() for p in model.parameters()),
        "trainable_parameters": sum(p.numel() for p in trainable),
        "gradient_mb": sum(p.numel() * p.element_size() for p in trainable) / 2**20,
        "optimizer_state_mb": sum(t.numel() * t.element_size() for t in optimizer_tensors) / 2**20,
        "peak_mb": peak_mb,
        "step_mb": peak_mb - before_mb,
        "peak_source": source,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--variant", choices=("full", "lora"), help=argparse.SUPPRESS)  # the child process
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")
    args = parser.parse_args(argv)
    if args.variant:
        # the SFT step's memory: naming sft lets LoRA run on the tiny preset's random base, whose values don't matter
        lora = [f"model.lora.enabled={args.variant == 'lora'}", "model.lora.stages=sft"]
        print(json.dumps(measure(args.preset, args.steps, [*args.overrides, *lora])))
        return
    results = {}
    for variant in ("full", "lora"):
        command = [sys.executable, __file__, "--preset", args.preset, "--steps", str(args.steps)]
        done = subprocess.run([*command, "--variant", variant, *args.overrides], capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"error: the {variant} measurement failed:\n{done.stderr[-3000:]}")
        results[variant] = json.loads(done.stdout.strip().splitlines()[-1])
        print(json.dumps(results[variant]))
    keys = ("trainable_parameters", "gradient_mb", "optimizer_state_mb", "peak_mb", "step_mb")
    print(json.dumps({f"lora/full {key}": results["lora"][key] / results["full"][key] for key in keys}))


if __name__ == "__main__":
    main()
