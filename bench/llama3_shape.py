"""A small random model in the shape of the 1B Llama preset's Llama 3.2 (which the Hub would serve, not this machine):
Llama 3's pre-tokenizer split, a BOS the tokenizer adds itself, its chat template's header tokens, grouped-query
attention, tied embeddings and Llama 3.1's RoPE scaling, written as a Hugging Face folder for part4_eval/export.py
and bench/llamacpp_check.sh (docs/export.md):

    python bench/llama3_shape.py /tmp/llama3-shape
    python part4_eval/export.py /tmp/llama3-shape base --model-dir /tmp/llama3-shape/model --type f32
    bash bench/llamacpp_check.sh /tmp/llama3-shape/export/base.gguf /tmp/llama3-shape/export/base

The tokenizer is trained on the first 2,000 HH-RLHF pairs of ../shared/data (the words, not the weights, matter
here: the model is random, so only whether llama.cpp computes and tokenizes what transformers does is checked).
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlhf.models.export import LLAMA3_SPLIT

HH = Path(__file__).resolve().parents[2] / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"
SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|pad|>"]
TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{{ message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python bench/llama3_shape.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder to write <out>/model into")
    args = parser.parse_args(argv)

    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    with gzip.open(HH, "rt", encoding="utf-8") as handle:
        texts = [json.loads(line)["chosen"] for line in itertools.islice(handle, 2000)]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2048, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(texts, trainer)
    bos = backend.token_to_id("<|begin_of_text|>")
    backend.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A",
        pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", bos)],
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>", pad_token="<|pad|>"
    )
    tokenizer.chat_template = TEMPLATE
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=bos,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        rope_scaling={  # Llama 3.2's factors; a short original context so that every band of frequencies is scaled
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        rope_theta=500000.0,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # weights 10x the default init's scale, so that greedy choices are not near-ties
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.mul_(10)
    model.save_pretrained(args.out / "model")
    tokenizer.save_pretrained(args.out / "model")
    print(f"[llama3-shape] {args.out / 'model'}: {sum(p.numel() for p in model.parameters()):,} parameters")


if __name__ == "__main__":
    main()
