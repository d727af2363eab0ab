"""A run's model back where people run models: one GGUF file (llama.cpp, Ollama, LM Studio) with its tokenizer and
chat template inside, an Ollama Modelfile beside it, and a Hugging Face folder with a model card.

    python part4_eval/export.py outputs/smollm2-ifeval raft                 # f16
    python part4_eval/export.py outputs/smollm2-ifeval raft --type q8_0
    python part4_eval/export.py outputs/tiny ppo --type f32

writes <run>/export/<model>.gguf, <run>/export/<model>.Modelfile and <run>/export/<model>/ (weights, tokenizer,
README.md). <model> is any policy of the run (sft, ppo, grpo, raft, dpo, online_dpo, or base for the pretrained model
it started from); a LoRA stage's published model is already merged, and --model-dir takes any other Hugging Face
folder, LoRA adapters (adapter_config.json) merged into their base. Llama (SmolLM2, the 1B Llama preset) and GPT-2
only (rlhf/models/export.py says what the file holds). docs/export.md: chatting with it in llama.cpp and Ollama,
and the round trips that check the file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlhf, even under another clone's .venv

from rlhf.chat import HH_CHAT_TEMPLATE
from rlhf.core.errors import UserError
from rlhf.models.checkpoint import written_atomically
from rlhf.models.export import GGUF_TYPES, architecture, pre_tokenizer_name, write_gguf
from rlhf.models.sources import SOURCE_FILE, locate_gguf
from rlhf.report.model_card import model_card, modelfile
from rlhf.stage.cli import run_stage
from rlhf.stage.config import is_gguf, load_config
from rlhf.stage.run import RunDir, write_text_atomic

MODELS = ("base", "sft", "ppo", "grpo", "raft", "dpo", "online_dpo")


def model_folder(run: RunDir, model: str) -> Path:
    """The published model of a complete stage (a stage that did not finish has no model to export)."""
    if model not in MODELS:
        raise UserError(f"model '{model}' is not one of {', '.join(MODELS)}; or give --model-dir")
    if model == "base":
        folder = run.base_model_dir
        if not (folder / "config.json").is_file():
            raise UserError(f"{run.root} has no pretrained base model ({folder}); only a pretrained run has one")
        return folder
    if not (run.stage(model) / "complete.json").is_file():
        raise UserError(
            f"stage {model} has not completed in {run.root}; run it first: bash run_all.sh --preset <its preset> "
            f"--output-dir {run.root} --only {model}"
        )
    return run.model_dir(model)


def load(folder: Path, run: RunDir):
    """The model in float32 and its tokenizer: the folder's own, else the run's (data/tokenizer). A folder of LoRA
    adapters is merged into the base it names, grown to the run's tokenizer first (its added pad token is a row the
    adapters' saved embeddings have and the base's do not)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapters = (folder / "adapter_config.json").is_file()
    base_path = None
    if adapters:
        from peft import PeftConfig, PeftModel

        base_path = PeftConfig.from_pretrained(folder).base_model_name_or_path
        if not base_path:
            raise UserError(f"the adapters in {folder} name no base model (adapter_config.json); export the merged one")
    places = [folder, run.tokenizer_dir, *([Path(base_path)] if base_path else [])]
    tokenizer_dir = next((d for d in places if (d / "tokenizer_config.json").is_file()), None)
    if tokenizer_dir is None:
        raise UserError(f"no tokenizer for {folder} in {' or '.join(map(str, places))}; export a folder that has one")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    if not adapters:
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, use_safetensors=True).eval(), tokenizer
    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32, use_safetensors=True)
    if base.get_input_embeddings().weight.shape[0] != len(tokenizer):
        base.resize_token_embeddings(len(tokenizer))
    return PeftModel.from_pretrained(base, folder).merge_and_unload().eval(), tokenizer


def source_pre_tokenizer(base_model: str | None) -> str | None:
    """`tokenizer.ggml.pre` of the GGUF file the run's pretrained model came from, if it came from one."""
    if not is_gguf(base_model):
        return None
    import gguf

    source = locate_gguf(base_model)
    field = gguf.GGUFReader(source.folder / source.name).fields.get("tokenizer.ggml.pre")
    return field.contents() if field is not None else None


def chat_format(template: str) -> str:
    if template == HH_CHAT_TEMPLATE:
        return "hh"
    return "chatml" if "<|im_start|>" in template else "other"


def default_system(tokenizer) -> str | None:
    """The system line a ChatML template adds when the conversation has none (SmolLM2's), for the Modelfile."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False)
    head = "<|im_start|>system\n"
    return text[len(head) : text.index("<|im_end|>")] if text.startswith(head) else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python part4_eval/export.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="the run folder (outputs/<preset>)")
    parser.add_argument("model", help=f"which model: {', '.join(MODELS)}")
    parser.add_argument("--type", default="f16", choices=GGUF_TYPES, help="the GGUF file's weight type (default f16)")
    parser.add_argument("--model-dir", type=Path, help="export this Hugging Face or LoRA adapter folder instead")
    parser.add_argument("--out", type=Path, help="where to write (default <run>/export)")
    parser.add_argument(
        "--tokenizer-pre", help="llama.cpp's pre-tokenizer name, when it is neither GPT-2's nor the source GGUF's"
    )
    args = parser.parse_args(argv)

    # 1. The model: a complete stage's published folder, its config and the run's numbers.
    run = RunDir(args.run)
    if not args.run.is_dir():
        raise UserError(f"{args.run} is not a run folder; give the --output-dir of a run (outputs/<preset>)")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", args.model) or args.model.startswith("."):
        raise UserError(f"model name '{args.model}' must be a plain file name (letters, digits, _ . -)")
    model_files = ("config.json", "adapter_config.json")
    if args.model_dir is not None and not any((args.model_dir / name).is_file() for name in model_files):
        raise UserError(
            f"--model-dir {args.model_dir} holds no config.json or adapter_config.json; give a model folder"
        )
    folder = args.model_dir or model_folder(run, args.model)
    stage_config = run.saved_config(args.model) if args.model != "base" else None
    cfg = stage_config or (run.saved_config("data") or load_config())
    summary = run.read_summary() if run.summary_path.is_file() else {}
    out = args.out or args.run / "export"
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a folder")

    # 2. Load it (LoRA adapters merged) and check, before anything is written, that llama.cpp can run it.
    model, tokenizer = load(folder, run)
    architecture(model.config)
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else HH_CHAT_TEMPLATE
    tokenizer.chat_template = template
    base_model = cfg.model.name_or_path
    if (folder / SOURCE_FILE).is_file():  # a dequantized GGUF model (the run's base model) names its file
        base_model = json.loads((folder / SOURCE_FILE).read_text())["spec"]
    pre = args.tokenizer_pre or source_pre_tokenizer(base_model)
    pre = pre or pre_tokenizer_name(json.loads(tokenizer.backend_tokenizer.to_str()))
    if pre is None:
        raise UserError("this tokenizer's pre-tokenizer has no known llama.cpp name; give it with --tokenizer-pre")

    # 3. The GGUF file, then the Modelfile that points Ollama at it.
    out.mkdir(parents=True, exist_ok=True)
    gguf_name, modelfile_name = f"{args.model}.gguf", f"{args.model}.Modelfile"
    written = write_gguf(model, tokenizer, out / gguf_name, args.type, f"{args.model} ({args.run.name})", template, pre)
    stops = [tokenizer.eos_token] if tokenizer.eos_token else []
    kind = chat_format(template)
    system = default_system(tokenizer) if kind == "chatml" else None
    write_text_atomic(out / modelfile_name, modelfile(gguf_name, kind, stops, system))

    # 4. The Hugging Face folder: merged weights, the tokenizer with its chat template, and the model card.
    export = {"gguf": gguf_name, "modelfile": modelfile_name, "type": args.type, "base_model": base_model}
    card = model_card(args.model, dataclasses.asdict(cfg), summary, export)
    hf_folder = out / args.model
    with written_atomically(hf_folder) as tmp:  # a failed write keeps the previous folder, whole
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "README.md").write_text(card, encoding="utf-8")

    size = (out / gguf_name).stat().st_size / 2**20
    print(
        f"[export] {out / gguf_name}: {written['architecture']}, {args.type}, "
        f"{written['tensors']} tensors, {size:.1f} MiB"
    )
    print(f"[export] {out / modelfile_name} and {hf_folder}/ (README.md: the model card)")
    print(
        f"[export] chat with it: llama-cli -m {out / gguf_name} -cnv, "
        f"or ollama create {args.model} -f {out / modelfile_name} (docs/export.md)"
    )


if __name__ == "__main__":
    run_stage(main)
