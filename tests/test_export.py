"""The GGUF exporter (rlhf/models/export.py, part4_eval/export.py): the rotary permutation by hand, each weight type's
rounding, and round trips through transformers' own GGUF reader on small random Llama and GPT-2 models with a
byte-level BPE tokenizer: the logits, the tokens and the chat template come back. The exporter on a real run's
LoRA-trained SmolLM2: tests/test_smollm2_e2e.py; llama.cpp reading the files: bench/llamacpp_check.sh
(docs/export.md)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import REPO

from rlhf.chat import HH_CHAT_TEMPLATE, hh_text
from rlhf.core.errors import UserError
from rlhf.models.export import (
    architecture,
    encode_tensor,
    interleaved_to_rotary,
    rotary_to_interleaved,
    write_gguf,
)
from rlhf.report.contract import RunData
from rlhf.report.model_card import model_card, modelfile, section_export

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TEXT = ["the cat sat on the mat", "a dog ran in the park, 12 times", "Human: hello there", "Assistant: how are you?"]


def test_rotary_to_interleaved_by_hand():
    """One head of 4 dimensions: transformers pairs dimension 0 with 2 and 1 with 3; llama.cpp wants the pairs
    adjacent, so rows (r0, r1, r2, r3) become (r0, r2, r1, r3). Two heads permute within each head."""
    rows = np.arange(4, dtype=np.float32)[:, None] * np.ones((1, 3), dtype=np.float32)
    assert rotary_to_interleaved(rows, 1)[:, 0].tolist() == [0, 2, 1, 3]
    rows = np.arange(8, dtype=np.float32)[:, None]
    assert rotary_to_interleaved(rows, 2)[:, 0].tolist() == [0, 2, 1, 3, 4, 6, 5, 7]
    assert np.array_equal(interleaved_to_rotary(rotary_to_interleaved(rows, 2), 2), rows)


def test_rotary_permutation_is_what_transformers_gguf_reader_undoes():
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    weight = np.random.default_rng(0).standard_normal((24, 5)).astype(np.float32)  # 3 heads of 8
    undone = LlamaTensorProcessor()._reverse_permute_weights(rotary_to_interleaved(weight, 3), 3, 3)
    assert np.array_equal(undone, weight)


def test_each_weight_type_rounds_as_stated():
    import gguf

    rng = np.random.default_rng(0)
    matrix = rng.standard_normal((4, 64)).astype(np.float32)
    vector = rng.standard_normal(64).astype(np.float32)
    assert encode_tensor(vector, "q8_0").ggml_type == "F32"  # norms and biases stay f32 in every type
    assert encode_tensor(matrix, "f32").ggml_type == "F32"
    half = encode_tensor(matrix, "f16")
    assert (
        half.ggml_type == "F16" and np.abs(half.data.astype(np.float32) - matrix).max() <= 2**-10 * np.abs(matrix).max()
    )
    packed = encode_tensor(matrix, "q8_0")
    assert packed.ggml_type == "Q8_0" and packed.data.nbytes == 4 * 2 * 34  # 2 blocks a row, 32 bytes + f16 scale
    restored = gguf.quants.dequantize(packed.data, gguf.GGMLQuantizationType.Q8_0)
    # each block: scale = max|w| / 127, every weight within half a step (and the scale's own f16 rounding)
    blocks = matrix.reshape(-1, 32)
    bound = np.abs(blocks).max(axis=1, keepdims=True) / 127 * (0.5 + 127 * 2**-11)
    assert (np.abs(restored.reshape(-1, 32) - blocks) <= bound + 1e-7).all()
    assert encode_tensor(rng.standard_normal((4, 48)).astype(np.float32), "q8_0").ggml_type == "F16"  # 48 % 32


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """A byte-level BPE tokenizer (GPT-2's scheme, as the tiny preset trains it) with an EOS and a pad token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(TEXT * 10, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>", pad_token="<|pad|>")


def small_model(kind: str, vocab: int):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if kind == "llama":  # grouped-query attention (4 heads, 2 KV heads) as SmolLM2's 9 and 3; tied embeddings
        config = LlamaConfig(
            vocab_size=vocab,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            tie_word_embeddings=True,
            rope_theta=10000.0,
        )
        return LlamaForCausalLM(config).eval()
    config = GPT2Config(
        vocab_size=vocab, n_embd=64, n_layer=2, n_head=4, n_positions=96, activation_function="gelu_pytorch_tanh"
    )
    return GPT2LMHeadModel(config).eval()


def round_trip(model, tokenizer, tmp_path, gguf_type: str, template: str):
    """Write the model as GGUF, read it back with transformers; both models' logits on the same ids, and the
    tokenizer transformers builds from the file."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tmp_path / f"model-{gguf_type}.gguf"
    written = write_gguf(model, tokenizer, path, gguf_type, "test", template, "gpt-2")
    assert not (tmp_path / f"{path.name}.tmp").exists()
    config = model.config if model.config.model_type == "gpt2" else None  # its reader misses GPT-2's n_positions
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, config=config, dtype=torch.float32)
    ids = torch.tensor([tokenizer(" ".join(TEXT)).input_ids])
    with torch.no_grad():
        logits = model(ids).logits, loaded.eval()(ids).logits
    return written, logits, AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name), path


@pytest.mark.slow  # models written and read back by transformers' GGUF reader (seconds): out of the unit run
@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_a_float32_file_computes_what_the_model_does_and_keeps_its_tokenizer(kind, tokenizer, tmp_path):
    model = small_model(kind, len(tokenizer))
    import gguf

    written, (ours, theirs), read, path = round_trip(model, tokenizer, tmp_path, "f32", CHATML)
    assert written["architecture"] == kind and written["pre"] == "gpt-2"
    torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-5)
    text = " ".join(TEXT)
    assert read(text).input_ids == tokenizer(text).input_ids
    assert (read.eos_token_id, read.pad_token_id) == (tokenizer.eos_token_id, tokenizer.pad_token_id)
    assert read.chat_template == CHATML
    fields = gguf.GGUFReader(path).fields
    types = fields["tokenizer.ggml.token_type"].contents()
    assert types[tokenizer.eos_token_id] == types[tokenizer.pad_token_id] == gguf.TokenType.CONTROL
    assert types[len(tokenizer) - 1] == gguf.TokenType.NORMAL
    values = {key.split(".", 1)[1]: fields[key].contents() for key in fields if key.startswith(f"{kind}.")}
    assert values["context_length"] == (128 if kind == "llama" else 96)  # GPT-2's n_positions, which transformers
    assert (values["block_count"], values["embedding_length"], values["attention.head_count"]) == (2, 64, 4)
    assert values["feed_forward_length"] == (128 if kind == "llama" else 256)  # GPT-2's 4 * n_embd


@pytest.mark.slow  # two more files written and read back (seconds): out of the unit run
def test_a_q8_0_file_stays_within_its_rounding(tokenizer, tmp_path):
    """q8_0 rounds each weight by at most half a step of its block's max/127: on this 2-layer model the logits move
    by at most 0.05 (measured 0.006; f16 0.0003) and every position's most likely token is the same; f16 by 1e-3."""
    model = small_model("llama", len(tokenizer))
    for gguf_type, tolerance in (("f16", 1e-3), ("q8_0", 0.05)):
        _, (ours, theirs), _, _ = round_trip(model, tokenizer, tmp_path, gguf_type, CHATML)
        assert float((ours - theirs).abs().max()) < tolerance, gguf_type
        assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


def test_the_hh_template_renders_what_the_pipeline_trained_on(tokenizer):
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "How?"},
    ]
    tokenizer.chat_template = HH_CHAT_TEMPLATE
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == hh_text(messages) == "\n\nHuman: Hi\n\nAssistant: Hello.\n\nHuman: How?\n\nAssistant:"


def test_an_architecture_llama_cpp_cannot_run_is_one_line(tokenizer):
    from transformers import GPT2Config, MistralConfig

    with pytest.raises(UserError, match="model type 'mistral' cannot be written as GGUF here"):
        architecture(MistralConfig())
    with pytest.raises(UserError, match="activation relu"):
        architecture(GPT2Config(activation_function="relu"))


def test_the_model_card_carries_the_runs_numbers_and_the_modelfile_its_template():
    summary = {
        "eval": {
            "win_rates": {"gold": {"ppo_vs_sft": {"win_rate": 0.592, "ci95_low": 0.56, "ci95_high": 0.623, "n": 300}}},
            "models": {"ppo": {"kl_to_ref": 0.438, "length_mean": 10.1, "degenerate": []}},
            "benchmarks": {
                "ifeval": {
                    "ppo": {
                        "prompt_strict": {"accuracy": 0.198, "ci95_low": 0.166, "ci95_high": 0.233},
                        "change_vs_sft": {"prompt_strict": {"change": 0.03, "ci95_low": 0.002, "ci95_high": 0.057}},
                    }
                }
            },
        }
    }
    config = {"data": {"path": "embedded"}, "ppo": {"lr": 1e-4, "kl_coef": 0.05}}
    export = {"gguf": "ppo.gguf", "modelfile": "ppo.Modelfile", "type": "f16", "base_model": None}
    card = model_card("ppo", config, summary, export)
    assert "| win rate vs SFT (gold judge, n = 300) | 0.592 [0.560, 0.623] |" in card
    assert "| IFEval prompt-level strict accuracy | 0.198 [0.166, 0.233]; vs SFT +0.030 [0.002, 0.057] |" in card
    assert "`ppo.lr=0.0001`, `ppo.kl_coef=0.05`" in card and "the embedded task" in card
    assert "flagged degenerate" not in card and card.startswith("---\nlibrary_name: transformers\n")
    chatml = modelfile("raft.gguf", "chatml", ["<|im_end|>"], "You are SmolLM")
    assert chatml.splitlines()[0] == "FROM ./raft.gguf" and 'SYSTEM """You are SmolLM"""' in chatml
    assert 'PARAMETER stop "<|im_end|>"' in chatml and "<|im_start|>{{ .Role }}" in chatml
    assert ".System" not in chatml  # Ollama passes SYSTEM among .Messages: rendering .System too would repeat it
    hh = modelfile("ppo.gguf", "hh", ["<|endoftext|>"], None)
    assert "\n\nHuman: {{ .Content }}" in hh and "SYSTEM" not in hh


@pytest.mark.slow  # five script processes (seconds): out of the unit run
def test_export_command_errors_name_the_fix(tmp_path):
    command = [sys.executable, str(REPO / "part4_eval" / "export.py")]
    for args, message in (
        ([str(tmp_path), "ppo"], f"stage ppo has not completed in {tmp_path}"),
        ([str(tmp_path), "reward"], "model 'reward' is not one of base, sft, ppo, grpo, raft, dpo, online_dpo"),
        ([str(tmp_path / "none"), "sft"], "is not a run folder"),
        ([str(tmp_path), "x", "--model-dir", str(tmp_path / "none")], "holds no config.json or adapter_config.json"),
        ([str(tmp_path), "../x", "--model-dir", str(tmp_path)], "must be a plain file name"),
    ):
        done = subprocess.run([*command, *args], capture_output=True, text=True, cwd=REPO)
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


def test_the_reports_export_command_names_the_best_policy_that_has_not_degenerated():
    gold = {
        f"{m}_vs_sft": {"win_rate": rate, "ci95_low": 0.5, "ci95_high": 0.7}
        for m, rate in (("ppo", 0.59), ("dpo", 0.65), ("raft", 0.61))
    }
    models = {"ppo": {}, "raft": {}, "dpo": {"degenerate": ["distinct-2 0.45 against SFT's 0.65"]}}
    summary = {"eval": {"win_rates": {"gold": gold}, "models": models}}
    text = section_export(RunData(summary=summary, run_dir="outputs/tiny"))
    assert "`raft` has the highest win rate against SFT under the `gold` judge" in text
    assert "python part4_eval/export.py outputs/tiny raft" in text
    assert section_export(RunData(summary={"eval": {"win_rates": {}}})) == ""


def test_llama3_rope_factors_are_what_transformers_divides_each_frequency_by():
    """Llama 3.1's scaling (Llama 3.2's settings, a short original context so that all three bands occur): the
    divisors written for llama.cpp times transformers' scaled frequencies give back the unscaled ones; by hand, the
    highest frequency is kept (1) and the lowest divided by the whole factor."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from rlhf.models.export import llama3_rope_factors, rope_parameters

    rope = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    config = LlamaConfig(
        hidden_size=128,
        num_attention_heads=2,
        rope_theta=500000.0,
        rope_scaling={**rope, "original_max_position_embeddings": 64},
    )
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    factors = llama3_rope_factors(64, 500000.0, rope_parameters(config))
    unscaled = 1.0 / 500000.0 ** (np.arange(0, 64, 2) / 64)
    np.testing.assert_allclose(scaled.double().numpy() * factors, unscaled, rtol=1e-5)
    assert factors[0] == 1.0 and factors[-1] == 32.0 and ((factors > 1) & (factors < 32)).any()


def test_llama3s_pre_tokenizer_and_bos_are_recognised():
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from rlhf.models.export import LLAMA3_SPLIT, adds_bos, pre_tokenizer_name

    backend = Tokenizer(models.BPE(vocab={"a": 0, "<s>": 1}, merges=[]))
    split = pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated")
    backend.pre_tokenizer = pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(use_regex=False)])
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>")
    assert pre_tokenizer_name(json.loads(backend.to_str())) == "llama-bpe" and adds_bos(tokenizer)
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    assert pre_tokenizer_name(json.loads(backend.to_str())) is None  # the exporter then asks for --tokenizer-pre


@pytest.mark.slow  # a script process (seconds): out of the unit run
def test_lora_adapters_are_merged_into_their_base_with_the_runs_tokenizer(tokenizer, tmp_path):
    """`--model-dir <stage>/adapter`: the adapters of a stage that added a pad token (so their saved embeddings have a
    row the base lacks) merge into the base they name, with the run's tokenizer, into the model the stage published
    merged: the same logits, exported."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    small_model("llama", len(tokenizer)).save_pretrained(tmp_path / "data" / "base_model")
    tokenizer.save_pretrained(tmp_path / "data" / "base_model")  # as the data stage writes a dequantized base
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "data" / "base_model")  # the adapters name its folder
    grown = copy.deepcopy(tokenizer)  # the module's tokenizer stays as the other tests use it
    grown.add_special_tokens({"additional_special_tokens": ["<|extra_pad|>"]})
    grown.save_pretrained(tmp_path / "data" / "tokenizer")
    base.resize_token_embeddings(len(grown))
    adapted = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    adapted.save_pretrained(tmp_path / "ppo" / "adapter", save_embedding_layers=True)
    merged = adapted.merge_and_unload().eval()
    command = [sys.executable, str(REPO / "part4_eval" / "export.py"), str(tmp_path), "ppo", "--type", "f32"]
    done = subprocess.run([*command, "--model-dir", str(tmp_path / "ppo" / "adapter")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "export", gguf_file="ppo.gguf", dtype=torch.float32)
    ids = torch.tensor([grown(" ".join(TEXT)).input_ids])
    with torch.no_grad():
        torch.testing.assert_close(exported.eval()(ids).logits, merged(ids).logits, rtol=0, atol=1e-5)
    # the run's pretrained base (a GGUF-started run's data/base_model) by its name
    done = subprocess.run([*command[:-3], "base", "--type", "q8_0"], capture_output=True, text=True)
    assert done.returncode == 0 and (tmp_path / "export" / "base.gguf").is_file(), done.stderr[-2000:]


def test_a_failed_write_leaves_nothing_under_the_name_or_beside_it(tokenizer, tmp_path):
    model = small_model("llama", len(tokenizer))
    path = tmp_path / "missing" / "model.gguf"
    with pytest.raises(UserError, match=r"cannot write .*; give a writable --out"):
        write_gguf(model, tokenizer, path, "f16", "test", CHATML, "gpt-2")
    assert not path.exists() and not path.with_name("model.gguf.tmp").exists()
    (tmp_path / "model.gguf").write_text("the previous file")
    with pytest.raises(UserError, match="GGUF type 'q4_0' is not one of"):
        write_gguf(model, tokenizer, tmp_path / "model.gguf", "q4_0", "test", CHATML, "gpt-2")
    assert (tmp_path / "model.gguf").read_text() == "the previous file" and list(tmp_path.iterdir()) == [
        tmp_path / "model.gguf"
    ]
