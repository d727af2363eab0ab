"""A Hugging Face causal LM as one GGUF file (the format of llama.cpp, Ollama and LM Studio), with its tokenizer and
chat template in the file's metadata, for the architectures the pipeline trains: Llama (SmolLM2, the 1B Llama preset)
and GPT-2 (the tiny and gpt2-hh presets).

What a GGUF file holds, and where llama.cpp's layout differs from transformers' (the gguf package's writer, names
and quantizer do the rest):
- Tensors under llama.cpp's names (`gguf.get_tensor_name_map`). A tied output matrix is left out: llama.cpp reads the
  token embedding in its place.
- Llama's query and key rows permuted (`rotary_to_interleaved`): transformers rotates the two halves of each head's
  dimensions (`rotate_half`), llama.cpp adjacent pairs (RoPE's original form, Su et al. 2021). The permutation
  makes the two compute the same attention; transformers' GGUF reader undoes it.
- GPT-2's projection matrices transposed: transformers stores them as Conv1D weights, (in, out), llama.cpp as
  (out, in) like every other linear layer.
- `f32`, `f16`, or `q8_0` (blocks of 32 weights, one f16 scale each, 8.5 bits a weight); vectors (norms, biases)
  stay f32 in every type, as llama.cpp's converter keeps them, and a matrix whose rows do not split into blocks
  of 32 is written f16.
- The tokenizer: every token's text (byte-level BPE, as GPT-2's and SmolLM2's), its type (control for special
  tokens), the merges, BOS/EOS/pad ids, the pre-tokenizer's name in llama.cpp (`tokenizer.ggml.pre`), and the chat
  template; a model without one gets the HH format it was trained on (`rlhf.chat.HH_CHAT_TEMPLATE`).
"""

from __future__ import annotations

import errno
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlhf.core.errors import UserError

GGUF_TYPES = ("f32", "f16", "q8_0")
ARCHITECTURES = ("llama", "gpt2")
GPT2_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
GPT2_TANH_GELU = ("gelu_new", "gelu_pytorch_tanh")  # llama.cpp's GPT-2 computes GELU's tanh approximation
Q8_0_BLOCK = 32
KEPT_F32 = ("position_embd.weight",)  # GPT-2's position table: f32 in any type, as llama.cpp's converter keeps it
ROPE_TYPES = ("default", "llama3")  # RoPE as Llama 2 and SmolLM2 have it, and Llama 3.1/3.2's long-context scaling
# The pre-tokenizer split of Llama 3's tokenizer.json (a Split by this regex, then byte-level BPE): llama.cpp's
# "llama-bpe". Digits in runs of at most 3, where GPT-2's regex keeps every run of digits whole.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def rotary_to_interleaved(weight: np.ndarray, n_head: int) -> np.ndarray:
    """The rows of a query or key projection (n_head * head_dim, in) reordered from transformers' rotary layout
    (each head's dimension i pairs with i + head_dim/2) to llama.cpp's (dimension 2j pairs with 2j + 1): within each
    head, row j of the first half goes to 2j, row j of the second half to 2j + 1. transformers'
    `LlamaTensorProcessor._reverse_permute_weights` is its inverse."""
    rows = weight.shape[0]
    half = rows // n_head // 2
    return weight.reshape(n_head, 2, half, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def interleaved_to_rotary(weight: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of `rotary_to_interleaved`."""
    rows = weight.shape[0]
    half = rows // n_head // 2
    return weight.reshape(n_head, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


@dataclass
class Encoded:
    """One tensor as the file stores it: `data` (for q8_0 the packed bytes) and its type."""

    data: np.ndarray
    ggml_type: str  # "F32", "F16" or "Q8_0"


def encode_tensor(array: np.ndarray, gguf_type: str) -> Encoded:
    """`array` (float32) in the file's type: vectors always f32; matrices f32, f16, or q8_0 when each row splits
    into blocks of 32 (else f16)."""
    import gguf

    array = np.ascontiguousarray(array, dtype=np.float32)
    if array.ndim < 2 or gguf_type == "f32":
        return Encoded(array, "F32")
    if gguf_type == "q8_0" and array.shape[-1] % Q8_0_BLOCK == 0:
        return Encoded(gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0), "Q8_0")
    return Encoded(array.astype(np.float16), "F16")


def architecture(config) -> str:
    """The GGUF architecture of a transformers config, or a one-line error naming what can be written."""
    model_type = getattr(config, "model_type", None)
    if model_type not in ARCHITECTURES:
        raise UserError(
            f"model type '{model_type}' cannot be written as GGUF here (this exporter writes "
            f"{', '.join(ARCHITECTURES)}); "
            "export the Hugging Face folder and convert it with llama.cpp's convert_hf_to_gguf.py"
        )
    problems = []
    if model_type == "llama":
        rope = rope_parameters(config)
        if rope.get("rope_type", "default") not in ROPE_TYPES:
            problems.append(f"RoPE scaling of type {rope.get('rope_type')} (this exporter writes llama3's only)")
        if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
            problems.append("biases in the attention or MLP projections")
    else:
        if config.activation_function not in GPT2_TANH_GELU:
            problems.append(f"activation {config.activation_function} (llama.cpp's GPT-2 computes gelu_new)")
        if config.scale_attn_by_inverse_layer_idx or config.reorder_and_upcast_attn:
            problems.append("scale_attn_by_inverse_layer_idx or reorder_and_upcast_attn")
    if problems:
        raise UserError(
            f"this {model_type} model has {'; '.join(problems)}, which this exporter cannot write; export the "
            "Hugging Face folder and convert it with llama.cpp's convert_hf_to_gguf.py"
        )
    return model_type


def gguf_tensors(state_dict: dict, config) -> dict[str, np.ndarray]:
    """The model's weights under llama.cpp's names and layout (float32 arrays), tied output left out."""
    import gguf

    arch = architecture(config)
    names = gguf.get_tensor_name_map(
        gguf.MODEL_ARCH.LLAMA if arch == "llama" else gguf.MODEL_ARCH.GPT2, config.num_hidden_layers
    )
    tied = bool(getattr(config, "tie_word_embeddings", False))
    tensors = {}
    for key, value in state_dict.items():
        if key == "lm_head.weight" and tied:
            continue
        if key.endswith((".attn.bias", ".attn.masked_bias")):  # GPT-2's causal-mask buffers in older checkpoints
            continue
        name = names.get_name(key, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise UserError(f"weight '{key}' has no GGUF name for {arch}; this checkpoint is not a plain {arch} model")
        array = value.detach().float().cpu().numpy()
        if arch == "llama" and name.endswith("attn_q.weight"):
            array = rotary_to_interleaved(array, config.num_attention_heads)
        elif arch == "llama" and name.endswith("attn_k.weight"):
            array = rotary_to_interleaved(array, config.num_key_value_heads)
        elif arch == "gpt2" and key.endswith(GPT2_TRANSPOSED):
            array = array.T
        tensors[name] = array
    rope = rope_parameters(config)  # Llama 3.1's scaling: the divisors llama.cpp applies to each rotary frequency
    if arch == "llama" and rope.get("rope_type") == "llama3":
        tensors["rope_freqs.weight"] = llama3_rope_factors(head_dim(config), rope_theta(config), rope)
    return tensors


def llama3_rope_factors(head_dim: int, theta: float, rope: dict) -> np.ndarray:
    """Llama 3.1's RoPE scaling as llama.cpp reads it: per rotary frequency, the divisor of that frequency
    (`rope_freqs.weight`). Frequencies whose wavelength is under original_max_position_embeddings / high_freq_factor
    keep their value (1), those over original / low_freq_factor are divided by `factor`, and those between are
    divided by a factor interpolated linearly in original / wavelength (Meta's Llama 3.1 release; transformers'
    `_compute_llama3_parameters` computes the scaled frequencies themselves)."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    context = rope["original_max_position_embeddings"]
    wavelength = 2 * np.pi / inv_freq
    smooth = (context / wavelength - low) / (high - low)
    divisor = 1.0 / ((1 - smooth) / factor + smooth)
    divisor = np.where(wavelength < context / high, 1.0, divisor)
    divisor = np.where(wavelength > context / low, factor, divisor)
    return divisor.astype(np.float32)


def pre_tokenizer_name(tokenizer_json: dict) -> str | None:
    """llama.cpp's name for a byte-level BPE pre-tokenizer that splits with GPT-2's regex ("gpt-2") or Llama 3's
    ("llama-bpe"); None for any other, whose name must then be given (`--tokenizer-pre`) or read from the GGUF file
    the model came from."""
    pre = tokenizer_json.get("pre_tokenizer") or {}
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
        return "gpt-2"
    steps = pre.get("pretokenizers") or []
    kinds = [step.get("type") for step in steps]
    if kinds == ["Split", "ByteLevel"] and (steps[0].get("pattern") or {}).get("Regex") == LLAMA3_SPLIT:
        return "llama-bpe" if not steps[1].get("use_regex", True) else None
    return None


def token_table(tokenizer, vocab_rows: int) -> tuple[list[str], list[int]]:
    """Every token's text and GGUF type by id, for `vocab_rows` embedding rows: added tokens marked special are control
    tokens (whether or not the tokenizer names them among its special tokens, as SmolLM2's `<repo_name>`), other
    added tokens user-defined, rows beyond the tokenizer unused."""
    import gguf

    vocab = tokenizer.get_vocab()
    if len(vocab) > vocab_rows:
        raise UserError(f"the tokenizer has {len(vocab)} tokens but the model only {vocab_rows} embedding rows")
    by_id = {index: text for text, index in vocab.items()}
    added = tokenizer.get_added_vocab()
    special = {token.content for token in tokenizer.added_tokens_decoder.values() if token.special}
    tokens, types = [], []
    for index in range(vocab_rows):
        text = by_id.get(index)
        if text is None:
            tokens.append(f"[PAD{index}]")
            types.append(gguf.TokenType.UNUSED)
        else:
            tokens.append(text)
            if text in special:
                types.append(gguf.TokenType.CONTROL)
            elif text in added:
                types.append(gguf.TokenType.USER_DEFINED)
            else:
                types.append(gguf.TokenType.NORMAL)
    return tokens, [int(t) for t in types]


def bpe_merges(tokenizer_json: dict) -> list[str]:
    """The BPE merges as "left right" strings, however tokenizer.json spells them."""
    model = tokenizer_json.get("model") or {}
    if model.get("type") != "BPE":
        raise UserError(f"tokenizer model {model.get('type')} is not byte-level BPE; this exporter writes BPE only")
    return [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]


def write_gguf(model, tokenizer, path: Path, gguf_type: str, name: str, chat_template: str, pre: str) -> dict:
    """Write `model` (a transformers causal LM in float32) and `tokenizer` as one GGUF file at `path` (atomically:
    a file under that name is always whole); what it wrote: architecture, type, tensor count and bytes."""
    import gguf

    if gguf_type not in GGUF_TYPES:
        raise UserError(f"GGUF type '{gguf_type}' is not one of {', '.join(GGUF_TYPES)}")
    config = model.config
    arch = architecture(config)
    tensors = gguf_tensors(model.state_dict(), config)
    vocab_rows = model.get_input_embeddings().weight.shape[0]
    tokenizer_json = json.loads(tokenizer.backend_tokenizer.to_str())
    tokens, types = token_table(tokenizer, vocab_rows)
    file_types = {
        "f32": gguf.LlamaFileType.ALL_F32,
        "f16": gguf.LlamaFileType.MOSTLY_F16,
        "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    }
    tmp = path.with_name(path.name + ".tmp")
    try:
        writer = gguf.GGUFWriter(tmp, arch)
        writer.add_name(name)
        writer.add_file_type(file_types[gguf_type])
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        writer.add_block_count(config.num_hidden_layers)
        writer.add_embedding_length(config.hidden_size)
        writer.add_head_count(config.num_attention_heads)
        if arch == "llama":
            writer.add_context_length(config.max_position_embeddings)
            writer.add_feed_forward_length(config.intermediate_size)
            writer.add_head_count_kv(config.num_key_value_heads)
            writer.add_layer_norm_rms_eps(config.rms_norm_eps)
            writer.add_rope_dimension_count(head_dim(config))
            if head_dim(config) * config.num_attention_heads != config.hidden_size:  # llama.cpp assumes it otherwise
                writer.add_key_length(head_dim(config))
                writer.add_value_length(head_dim(config))
            writer.add_rope_freq_base(float(rope_theta(config)))
            writer.add_vocab_size(vocab_rows)
        else:
            writer.add_context_length(config.n_positions)
            writer.add_feed_forward_length(config.n_inner or 4 * config.n_embd)
            writer.add_layer_norm_eps(config.layer_norm_epsilon)
        writer.add_tokenizer_model("gpt2")  # llama.cpp's name for byte-level BPE
        writer.add_tokenizer_pre(pre)
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_merges(bpe_merges(tokenizer_json))
        for key, add in (
            ("bos_token_id", writer.add_bos_token_id),
            ("eos_token_id", writer.add_eos_token_id),
            ("pad_token_id", writer.add_pad_token_id),
            ("unk_token_id", writer.add_unk_token_id),
        ):  # the tokenizer's, else the model's (GPT-2's BOS is its <|endoftext|>, which its tokenizer may not name)
            token_id = getattr(tokenizer, key, None)
            token_id = token_id if token_id is not None else getattr(config, key, None)
            if token_id is not None and 0 <= token_id < vocab_rows:  # GPT-2's config says 50256 in any vocabulary
                add(token_id)
        writer.add_add_bos_token(adds_bos(tokenizer))
        writer.add_chat_template(chat_template)
        total = 0
        for tensor_name, array in tensors.items():
            encoded = encode_tensor(array, "f32" if tensor_name in KEPT_F32 else gguf_type)
            raw_dtype = getattr(gguf.GGMLQuantizationType, encoded.ggml_type)
            writer.add_tensor(tensor_name, encoded.data, raw_dtype=raw_dtype)  # the shape: from the data's bytes
            total += encoded.data.nbytes
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        tmp.replace(path)
    except OSError as exc:
        fix = "free space on that disk" if exc.errno == errno.ENOSPC else "give a writable --out"
        raise UserError(f"cannot write {path} ({' '.join(str(exc).split())[:200]}); {fix}") from None
    finally:  # on any failure, Ctrl-C included, nothing is left under the final name or beside it
        tmp.unlink(missing_ok=True)
    return {"architecture": arch, "type": gguf_type, "tensors": len(tensors), "tensor_bytes": total, "pre": pre}


def rope_parameters(config) -> dict:
    """RoPE's settings (rope_type, rope_theta, a scaling's factors), wherever this transformers version keeps them."""
    return dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})


def head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def rope_theta(config) -> float:
    """RoPE's base frequency."""
    theta = getattr(config, "rope_theta", None)
    return theta if theta is not None else rope_parameters(config).get("rope_theta", 10000.0)


def adds_bos(tokenizer) -> bool:
    """Whether the tokenizer puts BOS before a text (Llama 3's does; GPT-2's and SmolLM2's do not), which llama.cpp
    must then do too."""
    ids = tokenizer("a").input_ids
    return tokenizer.bos_token_id is not None and bool(ids) and ids[0] == tokenizer.bos_token_id
