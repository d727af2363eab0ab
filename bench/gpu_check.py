"""The prepared check for a GPU window (about 15 minutes of device time): every stage of the gpt2-hh preset runs
a few steps on synthetic HH-format rows (bench/hh_rows.py), or with `--rows hh` on real HH-RLHF pairs (the
harmless-base file in ../shared/data/hh-rlhf/, as many as the shape's rows), with a random-init GPT-2 and a
tokenizer trained on those rows, all offline, in the preset's bf16; then the benchmark harness (bench/run.py) times
each training stage's steps. Prints the figures and writes them to bench/results/<device>-<date>-gpu-check.json
(and .md):

- whether each pipeline stage ran, and its wall seconds;
- each timed stage's seconds per step, tokens/s and peak memory;
- model FLOPs utilisation (MFU) of the SFT, reward and DPO steps, against the device's dense bf16 peak;
- GRPO's milliseconds per generated sample and generated tokens/s through the `hf` engine, then through vLLM
  when it is installed (the pipeline's samplers take vLLM too there, through the preset's `rollout.engine=auto`);
- the projected time of the whole gpt2-hh pipeline at its preset budgets, from the measured step times.

    bash bench/gpu_check.sh                 # GPT-2 124M shape (on a CPU this takes hours: use --shape tiny)
    bash bench/gpu_check.sh --shape tiny    # the tiny shape, one step each, as CI runs it
    bash bench/gpu_check.sh --rows hh       # on real HH-RLHF pairs: their lengths, not the synthetic rows'

A stage that fails is recorded with its error and the check goes on, so that one window finds every fault.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script: bench.* and rlhf.* import from the repo root

from bench.hh_rows import write_hh_folder  # noqa: E402
from bench.run import device_name, measure_stage, rates  # noqa: E402

PRESET = "gpt2-hh"
PIPELINE_STAGES = ("data", "sft", "reward", "ppo", "grpo", "raft", "dpo", "online_dpo", "eval", "report")
TIMED_STAGES = ("sft", "reward", "dpo", "ppo", "grpo")
RL = ("ppo", "grpo")

# Dense bf16 tensor-core peak, FLOP/s, from the vendors' data sheets (external figures): H100 and H200 SXM
# 989.4 TFLOP/s, H100 PCIe 756.5, A100 312, A6000 154.8 (with sparsity these sheets print twice as much).
PEAK_BF16_FLOPS = {"h100 pcie": 756.5e12, "h100": 989.4e12, "h200": 989.4e12, "a100": 312e12, "a6000": 154.8e12}

# The shapes: GPT-2 124M as the preset trains it, or a 1-layer model that runs anywhere in seconds.
SHAPES = {
    "gpt2": {
        "rows": (2048, 256),
        "lengths": {"earlier_exchanges": 3, "answer_sentences": 4},  # prompts ~150 tokens, chosen ~70
        "model": ["model.config_overrides={n_positions: 1024}"],
        "vocab_size": 8192,
        "steps": (3, 1),  # timed, warm-up: offline stages
        "rl_steps": (2, 1),  # RL iterations
    },
    "tiny": {
        "rows": (400, 24),  # SFT times 2 steps of 128 demonstrations
        "lengths": {},
        # one head of 32: vLLM's CPU attention kernels take head sizes of 32 and up
        "model": ["model.config_overrides={n_layer: 1, n_embd: 32, n_head: 1, n_positions: 1024}"],
        "vocab_size": 256,
        "steps": (1, 1),
        "rl_steps": (1, 1),
    },
}

GPT2_VOCAB = 50_257


def gpt2_vocab_extra(shape: dict) -> int:
    """LM-head parameters GPT-2's own vocabulary adds to this check's model."""
    return (GPT2_VOCAB - shape["vocab_size"]) * shape["n_embd"]


# HH-RLHF's train split has 160,800 pairs (external: the dataset card); the preset keeps 1 - data.val_fraction.
HH_TRAIN_PAIRS = 160_800
# Real HH-RLHF pairs available offline (../shared/data/README.md): the harmless-base test split, 2,312 pairs
HH_FILE = REPO.parent / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"


def training_rows(rows: str, shape: dict, work: Path, hh_file: Path = HH_FILE) -> tuple[Path, list[str]]:
    """The rows every stage reads -> (`data.path`, the data overrides that go with it): `synthetic` writes the
    shape's train and test rows (bench/hh_rows.py); `hh` reads real pairs from `hh_file`, which the data stage splits
    by prompt, capped at the shape's row counts."""
    n_train, n_eval = shape["rows"]
    if rows == "synthetic":
        return write_hh_folder(work / "hh", n_train, n_eval, **shape["lengths"]), []
    if not hh_file.is_file():
        raise SystemExit(f"--rows hh reads {hh_file}, which is not there; give --hh-file, or use --rows synthetic")
    return hh_file, [f"data.max_train_pairs={n_train}", f"data.max_eval_pairs={n_eval}"]


def model_overrides(shape: str, on_gpu: bool) -> list[str]:
    """A random-init GPT-2 of the shape, its tokenizer trained on the rows, bf16 on a GPU and fp32 on a CPU."""
    spec = SHAPES[shape]
    return [
        "model.init=random",
        "model.name_or_path=null",
        "model.model_type=gpt2",
        *spec["model"],
        "tokenizer.train_from_data=true",
        f"tokenizer.vocab_size={spec['vocab_size']}",
        f"run.mixed_precision={'bf16' if on_gpu else 'no'}",
    ]


# The SFT and reward stages that the timed RL stages start from ran this far (the config check compares them).
UPSTREAM_CAPS = ["sft.max_steps=2", "reward.max_steps=2"]


def pipeline_overrides() -> list[str]:
    """A few steps of every stage, and a short evaluation: the point is that each stage runs, not what it learns."""
    few = [*UPSTREAM_CAPS, "dpo.max_steps=2", "dpo.eval_prompts=8"]
    for rl in ("ppo", "grpo", "online_dpo"):
        few += [f"{rl}.total_episodes=64", f"{rl}.batch_size=32", f"{rl}.eval_prompts=8", f"{rl}.max_new_tokens=32"]
    few += ["raft.rounds=1", "raft.prompts_per_round=16", "raft.samples_per_prompt=4", "raft.batch_size=16"]
    few += ["raft.eval_prompts=8", "raft.max_new_tokens=32"]
    few += ["eval.num_prompts=32", "eval.best_of_n=4", "eval.best_of_n_prompts=8", "eval.max_new_tokens=32"]
    return few


def run_pipeline(run: Path, data: Path, stages: list[str], overrides: list[str], log: Path) -> dict:
    """`python -m rlhf.pipeline` over `stages`; each stage's completion and wall seconds from summary.json."""
    command = [sys.executable, "-m", "rlhf.pipeline", "--preset", PRESET, "--output-dir", str(run)]
    command += ["--only", ",".join(stages)]
    command += [f"data.path={data}", *overrides]
    started = time.perf_counter()
    with log.open("w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    summary_path = run / "summary.json"
    timing = json.loads(summary_path.read_text()).get("timing_s", {}) if summary_path.exists() else {}
    stages = {
        stage: {"completed": (run / stage / "complete.json").is_file(), "wall_s": timing.get(stage)} for stage in stages
    }
    result = {"returncode": done.returncode, "wall_s": time.perf_counter() - started, "stages": stages}
    if done.returncode != 0:
        result["log_tail"] = log.read_text()[-4000:]
    return result


def model_shape(run: Path) -> dict:
    """Parameters and layer sizes of the SFT model the timed stages load."""
    config = json.loads((run / "sft" / "model" / "config.json").read_text())
    d, layers, vocab, positions = config["n_embd"], config["n_layer"], config["vocab_size"], config["n_positions"]
    block = 12 * d * d + 13 * d  # attention (4 d^2 + 4 d) + MLP (8 d^2 + 5 d) + two layer norms (4 d)
    return {
        "n_layer": layers,
        "n_embd": d,
        "vocab_size": vocab,
        "params": layers * block + (vocab + positions) * d + 2 * d,
        "params_in_matmuls": layers * 12 * d * d + vocab * d,  # blocks' weight matrices and the (tied) LM head
    }


def training_flops_per_token(shape: dict, stage: str, mean_row_tokens: float) -> float:
    """Forward + backward FLOPs per token, 6 N + 12 L d T (Kaplan et al. 2020, eq. 2.1, as PaLM's MFU, appendix
    B): N the matmul parameters, T the mean row length attended over. The reward model's head is one scalar, so
    its N leaves the LM head out."""
    n = shape["params_in_matmuls"] - (shape["vocab_size"] * shape["n_embd"] if stage == "reward" else 0)
    return 6 * n + 12 * shape["n_layer"] * shape["n_embd"] * mean_row_tokens


def peak_flops(device: str) -> float | None:
    name = device.replace("-", " ")
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)


def vllm_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def grpo_per_sample(entry: dict, engine: str) -> dict:
    """GRPO's cost per generated sample from a timed entry: the whole iteration, and its generation alone."""
    return {
        "engine": engine,
        "ms_per_sample": 1000 * entry["seconds_per_step"] / entry["raw"]["batch_size"],
        "generate_ms_per_sample": 1000 * entry["generate_s_per_step"] / entry["raw"]["batch_size"],
        "generated_tokens_per_s": entry["generated_tokens_per_s"],
    }


def projection(timed: dict, config) -> dict:
    """Seconds each stage would take at the preset's own budgets (HH's 160,800 train pairs), from the timed
    seconds per step at this check's sequence lengths; RAFT's rounds from GRPO's generation time per sample and
    SFT's step time."""
    train_pairs = round(HH_TRAIN_PAIRS * (1 - config.data.val_fraction))
    steps = {
        "sft": math.ceil(train_pairs / config.sft.batch_size) * config.sft.epochs,
        "reward": math.ceil(train_pairs / config.reward.batch_size) * config.reward.epochs,
        "dpo": math.ceil(train_pairs / config.dpo.batch_size) * config.dpo.epochs,
        "ppo": config.ppo.total_episodes // config.ppo.batch_size,
        "grpo": config.grpo.total_episodes // config.grpo.batch_size,
    }
    seconds = {s: steps[s] * timed[s]["seconds_per_step"] for s in steps if s in timed}
    # The tokenizer trained on the synthetic rows has a few thousand tokens; GPT-2's has 50,257, whose LM head
    # adds FLOPs to the offline steps (compute-bound), scaled here by the FLOPs per token at each vocabulary.
    at_gpt2_vocab = {
        s: seconds[s] * timed[s]["flops_per_token_gpt2_vocab"] / timed[s]["flops_per_token"]
        for s in ("sft", "reward", "dpo")
        if s in seconds
    }
    if "grpo" in timed and "sft" in timed:
        raft = config.raft
        per_sample = timed["grpo"]["generate_s_per_step"] / config.grpo.batch_size
        kept = raft.prompts_per_round * raft.top_k
        seconds["raft"] = raft.rounds * (
            raft.prompts_per_round * raft.samples_per_prompt * per_sample
            + math.ceil(kept / raft.batch_size) * raft.epochs * timed["sft"]["seconds_per_step"]
        )
    seconds_gpt2_vocab = {**seconds, **at_gpt2_vocab}
    return {
        "train_pairs": train_pairs,
        "steps": steps,
        "seconds": seconds,
        "total_s": sum(seconds.values()),
        "seconds_at_gpt2_vocab": seconds_gpt2_vocab,
        "total_s_at_gpt2_vocab": sum(seconds_gpt2_vocab.values()),
    }


def markdown(results: dict) -> str:
    lines = [f"GPU check on {results['device']}, {results['date']}: `{results['command']}`", ""]
    lines += ["| pipeline stage | ran | wall s |", "|---|---|---:|"]
    for stage, entry in results["pipeline"]["stages"].items():
        wall = f"{entry['wall_s']:.1f}" if entry["wall_s"] is not None else "-"
        lines.append(f"| {stage} | {'yes' if entry['completed'] else '**no**'} | {wall} |")
    lines += ["", "| timed stage | s/step | tokens/s | MFU | peak MB |", "|---|---:|---:|---:|---:|"]
    for stage, entry in results["timed"].items():
        if "error" in entry:
            lines.append(f"| {stage} | failed: {entry['error'].splitlines()[0][:80]} | | | |")
            continue
        tokens = entry.get("tokens_per_s", entry.get("generated_tokens_per_s"))
        mfu = f"{entry['mfu']:.1%}" if entry.get("mfu") is not None else "-"
        lines.append(
            f"| {stage} | {entry['seconds_per_step']:.3f} | {tokens:,.0f} | {mfu} | {entry['peak_memory_mb']:,.0f} |"
        )
    for key in ("grpo_per_sample", "grpo_per_sample_vllm"):
        if grpo := results.get(key):
            lines += ["", f"GRPO, engine {grpo['engine']}: {grpo['ms_per_sample']:.1f} ms per generated sample "]
            lines[-1] += f"(whole iteration), {grpo['generated_tokens_per_s']:,.0f} generated tokens/s"
    lines += ["", f"Engines: {results['engines']}"]
    if proj := results.get("projection"):
        parts = ", ".join(f"{s} {v / 60:.1f} min" for s, v in proj["seconds"].items())
        lines += ["", f"Projected at the preset's budgets ({proj['train_pairs']:,} train pairs): {parts}; "]
        lines[-1] += f"total {proj['total_s'] / 3600:.2f} h (evaluation not included); "
        lines[-1] += f"{proj['total_s_at_gpt2_vocab'] / 3600:.2f} h with the offline steps scaled to GPT-2's vocabulary"
    return "\n".join(lines) + "\n"


def write(results: dict, out_dir: Path) -> Path:
    """The results so far -> <out_dir>/<device>-<date>-gpu-check.json and .md (rewritten after every stage, so a
    window that closes early still leaves what was measured)."""
    path = out_dir / f"{results['device']}-{results['date']}-gpu-check.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    path.with_suffix(".md").write_text(markdown(results))
    return path


def timed_entry(raw: dict, stage: str, shape: dict, flops_peak: float | None) -> dict:
    """bench/run.py's rates of one timed stage, plus (offline stages) model FLOPs per token and MFU."""
    entry = {**rates(raw), "raw": raw}
    if stage in RL:
        return entry
    mean_row_tokens = raw["tokens"] / (raw["steps"] * raw["batch_size"])
    entry["flops_per_token"] = training_flops_per_token(shape, stage, mean_row_tokens)
    gpt2_vocab = {**shape, "params_in_matmuls": shape["params_in_matmuls"] + gpt2_vocab_extra(shape)}
    entry["flops_per_token_gpt2_vocab"] = training_flops_per_token(gpt2_vocab, stage, mean_row_tokens)
    entry["model_flops_per_s"] = entry["flops_per_token"] * entry["tokens_per_s"]
    entry["mfu"] = entry["model_flops_per_s"] / flops_peak if flops_peak else None
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="gpt2")
    parser.add_argument("--rows", choices=("synthetic", "hh"), default="synthetic", help="synthetic or real HH rows")
    parser.add_argument("--hh-file", type=Path, default=HH_FILE, help="the real HH-RLHF pairs --rows hh reads")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--work", type=Path, help="folder for the run (default: a temporary one)")
    parser.add_argument("--pipeline", default=",".join(PIPELINE_STAGES), help="pipeline stages to run first")
    parser.add_argument("--timed", default=",".join(TIMED_STAGES), help="stages to time after them")
    parser.add_argument("--profile", action="store_true", help="operator and GPU kernel times (offline stages)")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="for the timed stages")
    args = parser.parse_intermixed_args(argv)

    import torch

    from rlhf.stage.config import load_config, preset_path

    on_gpu = torch.cuda.is_available()
    spec = SHAPES[args.shape]
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    data, data_caps = training_rows(args.rows, spec, work, args.hh_file)
    run = work / "run"
    settings = [*model_overrides(args.shape, on_gpu), *data_caps]  # every stage's: the model and the data caps
    device = device_name()
    results = {
        "device": device,
        "date": time.strftime("%Y-%m-%d"),
        "command": "bash bench/gpu_check.sh " + " ".join(argv if argv is not None else sys.argv[1:]),
        "shape": args.shape,
        "rows": args.rows if args.rows == "synthetic" else str(data),
        "torch": torch.__version__,
        "engines": {"hf": "measured", "vllm": "installed" if vllm_importable() else "not installed"},
        "timed": {},
    }
    print(f"[gpu-check] {device}, torch {torch.__version__}, shape {args.shape}; work folder {work}", flush=True)

    stages = args.pipeline.split(",")
    results["pipeline"] = run_pipeline(run, data, stages, settings + pipeline_overrides(), work / "pipeline.log")
    ran = [s for s, e in results["pipeline"]["stages"].items() if e["completed"]]
    print(f"[gpu-check] pipeline rc {results['pipeline']['returncode']}: ran {', '.join(ran)}", flush=True)
    write(results, args.out)

    timed_stages = [s for s in args.timed.split(",") if s] if (run / "reward" / "complete.json").is_file() else []
    if timed_stages:
        results["model"] = shape = model_shape(run)
    for stage in timed_stages:
        timed, warmup = spec["rl_steps"] if stage in RL else spec["steps"]
        # the table is the hf engine's (the preset's `auto` would take vLLM where it is installed); GRPO through
        # vLLM is timed after it
        overrides = [f"data.path={data}", *settings, *UPSTREAM_CAPS, "rollout.engine=hf", *args.overrides]
        try:
            # an RL stage's profile records every generation kernel of the whole stage: minutes on a GPU
            raw = measure_stage(stage, run, PRESET, timed, warmup, overrides, args.profile and stage not in RL)
        except SystemExit as exc:
            results["timed"][stage] = {"error": str(exc)[-3000:]}
            print(f"[gpu-check] {stage}: FAILED {str(exc).splitlines()[0]}", flush=True)
            continue
        results["timed"][stage] = entry = timed_entry(raw, stage, shape, peak_flops(device) if on_gpu else None)
        print(f"[gpu-check] {stage}: " + json.dumps({k: v for k, v in entry.items() if k != "raw"}), flush=True)
        if grpo := results["timed"].get("grpo"):
            results["grpo_per_sample"] = grpo_per_sample(grpo, "hf")
        ok = {s: e for s, e in results["timed"].items() if "error" not in e}
        results["projection"] = projection(ok, load_config(preset_path(PRESET), []))
        write(results, args.out)

    if "grpo" in results["timed"] and "error" not in results["timed"]["grpo"] and vllm_importable():
        timed, warmup = spec["rl_steps"]
        overrides = [f"data.path={data}", *settings, *UPSTREAM_CAPS, *args.overrides, "rollout.engine=vllm"]
        try:
            raw = measure_stage("grpo", run, PRESET, timed, warmup, overrides, False)
            entry = timed_entry(raw, "grpo", shape, None)
            results["grpo_per_sample_vllm"] = grpo_per_sample(entry, "vllm")
            results["engines"]["vllm"] = "measured"
            print(f"[gpu-check] grpo through vLLM: {json.dumps(results['grpo_per_sample_vllm'])}", flush=True)
        except SystemExit as exc:
            results["engines"]["vllm"] = f"failed: {str(exc).splitlines()[0] if str(exc) else exc}"
            print(f"[gpu-check] grpo through vLLM: FAILED {results['engines']['vllm']}", flush=True)

    path = write(results, args.out)
    print(markdown(results))
    print(f"[gpu-check] wrote {path} and {path.with_suffix('.md').name}")
    failed = results["pipeline"]["returncode"] != 0 or any("error" in e for e in results["timed"].values())
    return 1 if failed or len(results["timed"]) < len(timed_stages) else 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
