"""Benchmark: full fine-tuning against LoRA, in fp32 and under bf16 autocast, on a pretrained model's SFT step.

    python bench/full_vs_lora.py --run outputs/smollm2-harmless --preset smollm2-hh [--steps 6] [--batch 8]

One SFT optimizer step (forward, backward, AdamW) on the run's training demonstrations (chosen responses), the
same length-grouped batches for every setting: the pretrained base model (`data/base_model`, or
`model.name_or_path`) trained in full, and with the preset's LoRA adapters (`model.lora`: r, alpha, targets).
Prints real (non-pad) tokens/s per setting and the ratios; writes them to
bench/results/<device>-<date>-full-vs-lora.json. bf16 autocast is measured only where the CPU has native bf16
(AMX or AVX-512 BF16): elsewhere torch emulates it, far slower. Report ratios, or tokens/s with device and date.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlhf, even under another clone's .venv

from run import REPO, device_name

from rlhf.core.batching import collate_sequences, encode_responses, encode_texts
from rlhf.core.losses import sft_loss
from rlhf.data import read_jsonl
from rlhf.models.lora import with_lora
from rlhf.models.modeling import build_policy, load_tokenizer, token_logprobs
from rlhf.models.training import cpu_computes_bf16, epoch_order
from rlhf.stage.config import load_config, preset_path
from rlhf.stage.run import RunDir


def cpu_has_native_bf16() -> bool:
    cpuinfo = Path("/proc/cpuinfo")
    return cpuinfo.exists() and bool(cpu_computes_bf16(cpuinfo.read_text()))


def measure(model, batches: list[dict], bf16: bool) -> float:
    """Real tokens/s over `batches` after one untimed warm-up step."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    real_tokens, elapsed = 0, 0.0
    for i, inputs in enumerate([batches[0], *batches]):
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logprobs = token_logprobs(model, inputs["input_ids"], inputs["attention_mask"])
        loss, _ = sft_loss(logprobs.float(), inputs["response_mask"])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if i > 0:
            elapsed += time.perf_counter() - start
            real_tokens += int(inputs["attention_mask"].sum())
    return real_tokens / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a run folder whose data stage completed")
    parser.add_argument("--preset", default="smollm2-hh")
    parser.add_argument("--steps", type=int, default=6, help="timed optimizer steps per setting")
    parser.add_argument("--batch", type=int, default=8, help="demonstrations per step")
    args = parser.parse_args()
    cfg = load_config(preset_path(args.preset))
    run = RunDir(args.run)
    tokenizer = load_tokenizer(run.tokenizer_dir)
    rows = read_jsonl(run.stage("data") / "train.jsonl")
    examples = list(
        zip(
            encode_texts(tokenizer, [r["prompt"] for r in rows]),
            encode_responses(tokenizer, [r["chosen"] for r in rows]),
        )
    )
    order = epoch_order([len(p) + len(r) for p, r in examples], 0, 0, args.batch, True)[: args.steps * args.batch]
    batches = [
        collate_sequences(*zip(*[examples[i] for i in order[s : s + args.batch]]), tokenizer.pad_token_id)
        for s in range(0, len(order), args.batch)
    ]
    settings = [("full", False), ("lora", False)]
    if cpu_has_native_bf16():
        settings += [("full", True), ("lora", True)]
    results = {}
    for kind, bf16 in settings:
        torch.manual_seed(0)
        model = build_policy(cfg.model, tokenizer, run.pretrained_source(cfg))
        if kind == "lora":
            model = with_lora(model, cfg.model.lora.for_stage("sft"))
        name = f"{kind}_{'bf16' if bf16 else 'fp32'}"
        results[name] = measure(model, batches, bf16)
        print(f"{name}: {results[name]:,.0f} real tokens/s")
        del model
    ratios = {"lora_over_full_fp32": results["lora_fp32"] / results["full_fp32"]}
    if "full_bf16" in results:
        ratios["full_bf16_over_fp32"] = results["full_bf16"] / results["full_fp32"]
        ratios["lora_bf16_over_fp32"] = results["lora_bf16"] / results["lora_fp32"]
    for key, value in ratios.items():
        print(f"{key}: {value:.2f}x")
    record = {
        "device": device_name(),
        "date": time.strftime("%Y-%m-%d"),
        "threads": torch.get_num_threads(),
        "native_bf16": cpu_has_native_bf16(),
        "command": " ".join(["python", *sys.argv]),
        "model": str(cfg.model.name_or_path),
        "batch": args.batch,
        "steps": args.steps,
        "tokens_per_s": results,
        "ratios": ratios,
    }
    out = REPO / "bench" / "results" / f"{record['device']}-{record['date']}-full-vs-lora.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
