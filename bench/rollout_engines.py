"""Rollout throughput of the two engines (`rollout.engine=hf|vllm`, rlhf/rollout/engines.py) on one workload: a
random-init GPT-2 of the shape, P prompts of synthetic HH rows (bench/hh_rows.py), R new tokens each, one seed per
row, as GRPO samples. Times the engine's build and its first call apart from the steady calls after them.

    python bench/rollout_engines.py --shape tiny            # the tiny preset's model shape
    python bench/rollout_engines.py --shape gpt2 --prompts 64 --new-tokens 53     # GPT-2 124M
    python bench/rollout_engines.py --shape gpt2 --out bench/results   # also writes <device>-<date>-rollout.json
    python bench/rollout_engines.py --run outputs/smollm2-harmless --prompts 32 --new-tokens 64   # a run's SFT policy

With `--run`, the workload is real: the run's SFT policy (`<run>/sft/model`, e.g. SmolLM2-135M-Instruct) and the
first P prompts of its test split, as eval samples them. Beside the timings, the arithmetic bound: the tokens/s the
model would reach if every forward FLOP (2 per parameter per token, prefill included) ran at this machine's measured
float32 matmul rate, and each engine's share of it.

On a GPU both run in bf16; on CPU in float32, on torch's threads (OMP_NUM_THREADS) for both."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.hh_rows import hh_pairs
from bench.run import device_name
from rlhf.core.batching import encode_texts
from rlhf.data import read_jsonl
from rlhf.models.modeling import disable_dropout, load_policy, load_tokenizer, train_tokenizer
from rlhf.rollout.batch import SamplingConfig
from rlhf.rollout.engines import build_engine, vllm_installed
from rlhf.rollout.generate import sampling_seeds
from rlhf.stage.schema import RolloutConfig

SHAPES = {  # GPT-2 widths; tiny is the tiny preset's model (configs/tiny.yaml)
    "tiny": {"n_layer": 4, "n_embd": 192, "n_head": 6, "vocab_size": 1024},
    "gpt2": {"n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50_257},
}


def prompt_of(dialogue: str) -> str:
    """An HH dialogue up to its last "Assistant:", where the response starts."""
    return dialogue.rsplit("\n\nAssistant:", 1)[0] + "\n\nAssistant:"


def build_model_dir(shape: str, folder: Path, rows: list[dict]):
    from transformers import GPT2Config, GPT2LMHeadModel

    spec = SHAPES[shape]
    tokenizer = train_tokenizer([row["chosen"] for row in rows], vocab_size=1024)
    config = GPT2Config(
        vocab_size=max(spec["vocab_size"], len(tokenizer)),
        n_positions=1024 if shape == "gpt2" else 192,
        n_layer=spec["n_layer"],
        n_embd=spec["n_embd"],
        n_head=spec["n_head"],
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    disable_dropout(model)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model.eval(), tokenizer


def time_engine(name: str, model, tokenizer, folder: Path, prompts: list[list[int]], new_tokens: int, calls: int):
    on_gpu = torch.cuda.is_available()
    accelerator = SimpleNamespace(
        device=torch.device("cuda" if on_gpu else "cpu"),
        num_processes=1,
        mixed_precision="bf16" if on_gpu else "no",
        autocast=(lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if on_gpu else torch.no_grad,
    )
    model = model.to(accelerator.device)
    started = time.perf_counter()
    engine = build_engine(RolloutConfig(engine=name), "bench", folder, tokenizer, accelerator, len(prompts))
    engine.load(model)
    build_s = time.perf_counter() - started
    sampling = SamplingConfig(max_new_tokens=new_tokens, temperature=1.0)
    seconds, tokens = [], []
    for call in range(calls + 1):  # call 0 warms up (vLLM's first call is several times slower)
        started = time.perf_counter()
        rollout = engine.sample(prompts, sampling, sampling_seeds(0, call, range(len(prompts))))
        seconds.append(time.perf_counter() - started)
        tokens.append(int(rollout.response_lengths.sum()))
    steady = sum(seconds[1:]) / calls
    return {
        "build_s": round(build_s, 2),
        "first_call_s": round(seconds[0], 3),
        "call_s": round(steady, 3),
        "samples_per_s": round(len(prompts) / steady, 1),
        "tokens_per_s": round(sum(tokens[1:]) / sum(seconds[1:]), 1),
    }


def matmul_gflops(size: int = 1024, repeats: int = 20) -> float:
    """The machine's float32 matmul rate on torch's threads (GFLOP/s): the arithmetic bound's numerator."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)  # warm-up
    started = time.perf_counter()
    for _ in range(repeats):
        torch.mm(a, b)
    return 2 * size**3 * repeats / (time.perf_counter() - started) / 1e9


def arithmetic_bound(gflops: float, n_params: int, prompt_tokens: float, new_tokens: int) -> dict:
    """New tokens per second if every forward FLOP ran at the matmul rate: a token costs 2·N FLOPs (Kaplan et al.
    2020, attention left out), and each response's prompt is processed once (prefill) beside its new tokens."""
    per_token = 2 * n_params / (gflops * 1e9)  # seconds per token through the model
    return {
        "matmul_gflops": round(gflops, 1),
        "decode_only_tokens_per_s": round(1 / per_token, 1),
        "with_prefill_tokens_per_s": round(new_tokens / ((prompt_tokens + new_tokens) * per_token), 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=53)
    parser.add_argument("--calls", type=int, default=3, help="timed calls after the warm-up call")
    parser.add_argument("--run", type=Path, default=None, help="a run folder: its SFT policy and test prompts")
    parser.add_argument("--out", type=Path, default=None, help="folder for <device>-<date>-rollout-<shape>.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        if args.run is not None:
            folder = args.run / "sft" / "model"
            model, tokenizer = load_policy(folder).eval(), load_tokenizer(folder)
            texts = [row["prompt"] for row in read_jsonl(args.run / "data" / "test.jsonl")][: args.prompts]
            prompts, shape = encode_texts(tokenizer, texts), args.run.name
        else:
            rows = hh_pairs(args.prompts, seed=0)
            folder, shape = Path(tmp), args.shape
            model, tokenizer = build_model_dir(args.shape, folder, rows)
            prompts = [tokenizer(prompt_of(row["chosen"]))["input_ids"] for row in rows]
        results = {
            "device": device_name(),
            "date": date.today().isoformat(),
            "threads": torch.get_num_threads(),
            "shape": shape,
            "model": str(folder) if args.run is not None else args.shape,
            "prompts": args.prompts,
            "new_tokens": args.new_tokens,
            "mean_prompt_tokens": round(sum(map(len, prompts)) / len(prompts), 1),
            "engines": {},
        }
        for name in ("hf", "vllm") if vllm_installed() else ("hf",):
            results["engines"][name] = time_engine(name, model, tokenizer, folder, prompts, args.new_tokens, args.calls)
            print(f"[rollout] {shape} {name}: {results['engines'][name]}", flush=True)
    n_params = sum(p.numel() for p in model.parameters())  # tied embeddings counted once, as the LM head's matmul
    results["bound"] = arithmetic_bound(matmul_gflops(), n_params, results["mean_prompt_tokens"], args.new_tokens)
    for timing in results["engines"].values():
        timing["share_of_bound"] = round(timing["tokens_per_s"] / results["bound"]["with_prefill_tokens_per_s"], 3)
    if "vllm" in results["engines"]:
        results["vllm_speedup"] = round(results["engines"]["hf"]["call_s"] / results["engines"]["vllm"]["call_s"], 2)
    print(json.dumps(results, indent=1))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"{results['device']}-{results['date']}-rollout-{shape}.json"
        path.write_text(json.dumps(results, indent=1) + "\n")
        print(f"[rollout] wrote {path}")


if __name__ == "__main__":
    main()
