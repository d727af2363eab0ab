"""An exported GGUF file run by llama.cpp (llama-cpp-python) against the Hugging Face model it came from: the same
prompt tokens from the chat template stored in the file, and the same greedy answer.

    bash bench/llamacpp_check.sh outputs/smollm2-ifeval/export/raft.gguf outputs/smollm2-ifeval/export/raft

Two halves, in two environments (llama.cpp's Python binding is built from source into .venv-llamacpp; transformers is
in .venv): `decode` loads the file in llama.cpp, renders each prompt with the chat template the file holds, tokenizes
it with llama.cpp's tokenizer and decodes greedily; `compare` renders the same prompts with the Hugging Face folder's
tokenizer, checks the prompt tokens are the same, decodes greedily with transformers, and reports each answer's
first divergence (and how much likelier transformers found its token there). Results, with the machine and
llama-cpp-python's version: bench/results/cpu-2core-<date>-llamacpp-<model>-<type>.json, read in docs/export.md. The
prompts are rendered by llama-cpp-python's Jinja2 formatter (Python's jinja2) from the template stored in the file, not
by llama.cpp's own C++ template engine, which llama-cli uses.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

# A handful of everyday requests (not from any benchmark): an answer that ends, a list, a number, a refusal-shaped
# request, an instruction with a format.
PROMPTS = (
    "What is the capital of France?",
    "Give me three tips for sleeping better.",
    "What is 12 times 7?",
    "How can I kill a Python process that is stuck?",
    "Write one sentence about the sea, in lowercase letters only.",
)


def decode(gguf: Path, max_new_tokens: int, out: Path) -> None:
    """llama.cpp's side: every prompt's tokens and greedy answer tokens, written to `out`."""
    from llama_cpp import Llama
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    llm = Llama(model_path=str(gguf), n_ctx=0, n_threads=2, verbose=False, seed=0)  # n_ctx 0: the model's own
    metadata = llm.metadata
    eos = llm.token_eos()
    formatter = Jinja2ChatFormatter(
        template=metadata["tokenizer.chat_template"],
        eos_token=llm.detokenize([eos], special=True).decode(),
        bos_token=llm.detokenize([llm.token_bos()], special=True).decode() if llm.token_bos() >= 0 else "",
    )
    rows = []
    for prompt in PROMPTS:
        text = formatter(messages=[{"role": "user", "content": prompt}]).prompt
        tokens = llm.tokenize(text.encode(), add_bos=False, special=True)
        answer = []
        start = time.perf_counter()
        for token in llm.generate(tokens, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
            if token == eos or len(answer) == max_new_tokens:
                break
            answer.append(token)
        rows.append(
            {
                "prompt": prompt,
                "text": text,
                "prompt_tokens": tokens,
                "answer_tokens": answer,
                "seconds": time.perf_counter() - start,
            }
        )
    import llama_cpp

    record = {"gguf": str(gguf), "llama_cpp_python": llama_cpp.__version__, "eos": eos, "rows": rows}
    out.write_text(json.dumps(record, indent=1) + "\n")


def compare(hf_dir: Path, decoded: Path, max_new_tokens: int, out: Path | None, weights_from_gguf: bool) -> dict:
    """transformers' side: the same prompts through the Hugging Face folder, compared token by token; with
    `weights_from_gguf`, the weights are the GGUF file's, dequantized by transformers (for a q8_0 file: the same
    rounded weights llama.cpp multiplies, so what is left to differ is how each computes with them)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    llama = json.loads(decoded.read_text())
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    if weights_from_gguf:  # the folder's config: transformers' GGUF reader misses GPT-2's n_positions
        gguf = Path(llama["gguf"])
        config = AutoConfig.from_pretrained(hf_dir)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, config=config, dtype=torch.float32
        )
    else:
        model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, use_safetensors=True)
    model.eval()
    results = []
    for row in llama["rows"]:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": row["prompt"]}], tokenize=False, add_generation_prompt=True
        )
        ids = tokenizer(text, add_special_tokens=False).input_ids
        with torch.no_grad():
            output = model.generate(
                torch.tensor([ids]),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
        answer = output[0, len(ids) :].tolist()
        if answer and answer[-1] == tokenizer.eos_token_id:
            answer = answer[:-1]
        theirs = row["answer_tokens"]
        first = next((i for i, (a, b) in enumerate(zip(answer, theirs)) if a != b), None)
        if first is None and len(answer) != len(theirs):
            first = min(len(answer), len(theirs))
        margin = None  # how much likelier transformers found its token than llama.cpp's, where they part
        if first is not None and first < min(len(answer), len(theirs)):
            with torch.no_grad():
                logits = model(torch.tensor([ids + answer[:first]])).logits[0, -1].float()
            logprobs = logits.log_softmax(-1)
            margin = float(logprobs[answer[first]] - logprobs[theirs[first]])
        results.append(
            {
                "prompt": row["prompt"],
                "same_template_text": text == row["text"],
                "same_prompt_tokens": ids == row["prompt_tokens"],
                "answer_tokens": len(answer),
                "same_answer": first is None,
                "first_divergence": first,
                "logprob_margin_at_divergence": margin,
                "transformers_answer": tokenizer.decode(answer),
                "llamacpp_answer": tokenizer.decode(theirs),
            }
        )
    summary = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": cpu_name(),
        "llama_cpp_python": llama.get("llama_cpp_python"),
        "gguf": llama["gguf"],
        "hf_dir": str(hf_dir),
        "transformers_weights": "the GGUF file's, dequantized" if weights_from_gguf else "the Hugging Face folder's",
        "max_new_tokens": max_new_tokens,
        "prompts": len(results),
        "same_prompt_tokens": sum(r["same_prompt_tokens"] for r in results),
        "same_answers": sum(r["same_answer"] for r in results),
        "rows": results,
    }
    for r in results:
        where = "same" if r["same_answer"] else f"parts at token {r['first_divergence']}"
        if r["logprob_margin_at_divergence"] is not None:
            where += f", where transformers' token was {r['logprob_margin_at_divergence']:.3f} nats likelier"
        print(
            f"[llama.cpp] {r['prompt'][:48]!r}: prompt tokens {'same' if r['same_prompt_tokens'] else 'DIFFER'}, "
            f"answer {where} ({r['answer_tokens']} tokens)"
        )
    print(f"[llama.cpp] {summary['same_answers']} of {len(results)} greedy answers equal to transformers'")
    if out:
        out.write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def cpu_name() -> str:
    """The CPU's model name (Linux), else the machine type."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.machine()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python bench/llamacpp_check.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="side", required=True)
    one = sub.add_parser("decode", help="llama.cpp's side (in .venv-llamacpp)")
    one.add_argument("gguf", type=Path)
    one.add_argument("--out", type=Path, required=True)
    two = sub.add_parser("compare", help="transformers' side (in .venv)")
    two.add_argument("hf_dir", type=Path)
    two.add_argument("--decoded", type=Path, required=True)
    two.add_argument("--out", type=Path)
    two.add_argument("--weights-from-gguf", action="store_true", help="transformers reads the GGUF file's weights")
    for side in (one, two):
        side.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args(argv)
    if args.side == "decode":
        decode(args.gguf, args.max_new_tokens, args.out)
    else:
        compare(args.hf_dir, args.decoded, args.max_new_tokens, args.out, args.weights_from_gguf)


if __name__ == "__main__":
    main()
