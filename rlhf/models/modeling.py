"""Tokenizers, policies and reward models: building, loading and the forward passes stages share.

Contracts every stage relies on:
- the pad token is distinct from EOS (Huang et al. 2024, detail 1), so EOS is never masked;
- dropout is off in every role (Huang et al. 2024: policy, reference, critic and reward model);
- `token_logprobs(...)[b, t]` is log p(input_ids[b, t] | input_ids[b, :t]), aligned with the
  token itself, so it can be masked by the same `response_mask` as the ids;
- position ids come from the attention mask, so left- and right-padded rows score identically;
- a reward is read at the last non-pad token (the EOS of a finished response).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors import SafetensorError
from torch import nn

from rlhf.core.errors import UserError
from rlhf.core.ops import gather_logprobs
from rlhf.models.sources import cached_dequantization, check_model_source, locate_gguf
from rlhf.stage.config import is_gguf
from rlhf.stage.schema import DataConfig, ModelConfig, RewardConfig, TokenizerConfig

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
REWARD_CONFIG_FILE = "reward_config.json"
MEAN_POOL_HEAD_FILE = "reward_head.safetensors"


# ----------------------------------------------------------------------------- tokenizers


def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE tokenizer (GPT-2's scheme) trained on `texts`, with EOS and a separate pad."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN, padding_side="right"
    )


def load_pretrained_tokenizer(tok_cfg: TokenizerConfig, model_cfg: ModelConfig, model_source: str | None = None):
    """The model's own tokenizer, given a pad token distinct from EOS when it has none or shares EOS (SmolLM2's
    pad is its EOS, `<|im_end|>`): a pad that is EOS would mask every EOS as padding. `model_source` replaces
    model.name_or_path (the run's dequantized copy of a GGUF model)."""
    from transformers import AutoTokenizer

    source = tok_cfg.name_or_path or model_source or model_cfg.name_or_path
    if source is None:
        raise UserError(
            "no tokenizer source: set tokenizer.name_or_path or model.name_or_path, or tokenizer.train_from_data=true"
        )
    check_model_source("tokenizer.name_or_path" if tok_cfg.name_or_path else "model.name_or_path", source)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=model_cfg.trust_remote_code)
    except (OSError, ValueError) as exc:
        raise UserError(
            f"cannot load tokenizer '{source}' ({str(exc).splitlines()[0]}); "
            "offline, set tokenizer.train_from_data=true"
        ) from None
    if tokenizer.eos_token is None:
        raise UserError(f"tokenizer '{source}' has no EOS token; responses could never end")
    if tokenizer.pad_token is None or tokenizer.pad_token_id == tokenizer.eos_token_id:
        tokenizer.add_special_tokens({"pad_token": PAD_TOKEN})
    tokenizer.padding_side = "right"
    return tokenizer


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    with stage_model_errors(path):
        return AutoTokenizer.from_pretrained(str(path))


# ----------------------------------------------------------------------------- policies


def disable_dropout(model: nn.Module) -> None:
    """Zero every dropout, in the modules and in the config saved with them."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    for key, value in list(vars(model.config).items()):
        if isinstance(value, float) and ("dropout" in key or key.endswith("pdrop")):
            setattr(model.config, key, 0.0)


def _architecture_config(model_cfg: ModelConfig, local_only: bool = False, source: str | None = None):
    """The model's config with model.config_overrides applied; `local_only`: from a folder or the Hugging Face
    cache alone, never the network; `source` replaces model.name_or_path (the run's dequantized GGUF model)."""
    from transformers import AutoConfig

    source = source or model_cfg.name_or_path
    if source is not None:
        check_model_source("model.name_or_path", source)
        gguf = locate_gguf(source) if is_gguf(source) else None
        if gguf and (cached := cached_dequantization(gguf)):  # its config.json, not the whole GGUF file parsed
            source, gguf = str(cached), None
        try:
            config = AutoConfig.from_pretrained(
                gguf.folder if gguf else source,
                gguf_file=gguf.name if gguf else None,
                trust_remote_code=model_cfg.trust_remote_code,
                local_files_only=local_only,
            )
        except (OSError, ValueError) as exc:
            raise UserError(
                f"cannot load model config '{source}' ({str(exc).splitlines()[0]}); "
                "offline, point model.name_or_path at a folder with config.json"
            ) from None
    elif model_cfg.model_type is not None:
        config = AutoConfig.for_model(model_cfg.model_type)
    else:
        raise UserError("set model.name_or_path (Hub id or folder) or model.model_type (with model.init=random)")
    for key, value in model_cfg.config_overrides.items():
        if not hasattr(config, key):
            raise UserError(f"model.config_overrides.{key} is not a field of {type(config).__name__}")
        setattr(config, key, value)
    return config


def build_policy(model_cfg: ModelConfig, tokenizer, source: str | None = None) -> nn.Module:
    """The initial policy: pretrained weights, or the architecture with random weights. `source` replaces
    model.name_or_path: the run's dequantized copy of a GGUF model (`rlhf.stage.run.RunDir.pretrained_source`)."""
    from transformers import AutoModelForCausalLM

    if model_cfg.init not in ("pretrained", "random"):
        raise UserError(f"model.init must be 'pretrained' or 'random', got '{model_cfg.init}'")
    source = source or model_cfg.name_or_path
    if model_cfg.init == "pretrained" and is_gguf(source):
        raise UserError(f"model '{source}' is a GGUF file: run the data stage first, which dequantizes it")
    config = _architecture_config(model_cfg, source=source)
    if model_cfg.init == "random":
        config.vocab_size = len(tokenizer)
        config.bos_token_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        config.eos_token_id = tokenizer.eos_token_id
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=model_cfg.trust_remote_code)
    else:
        try:
            model = AutoModelForCausalLM.from_pretrained(
                source,
                config=config,
                # transformers 5 loads a checkpoint in its own dtype (Pythia: fp16, Llama 3.2: bf16); the trained
                # weights and AdamW's state stay fp32, and run.mixed_precision casts the compute
                dtype=torch.float32,
                use_safetensors=True,
                trust_remote_code=model_cfg.trust_remote_code,
            )
        except SafetensorError as exc:
            raise UserError(
                f"the weights of model '{source}' are damaged ({' '.join(str(exc).split())}); "
                "download them again, or point model.name_or_path at another copy"
            ) from None
        except (OSError, ValueError) as exc:
            raise UserError(
                f"cannot load model '{source}' ({str(exc).splitlines()[0]}); offline, use model.init=random"
            ) from None
        if model.get_input_embeddings().num_embeddings < len(tokenizer):
            model.resize_token_embeddings(len(tokenizer))  # room for the added pad token
    model.config.pad_token_id = tokenizer.pad_token_id
    model.config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    disable_dropout(model)
    if model_cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return model


@contextmanager
def stage_model_errors(path: Path) -> Iterator[None]:
    """A stage output folder that cannot be loaded (missing files, damaged weights) as a one-line UserError."""
    try:
        yield
    except (OSError, SafetensorError) as exc:
        detail = " ".join(str(exc).split())[:200]
        raise UserError(
            f"cannot load {path} ({type(exc).__name__}: {detail}); the folder is incomplete or damaged: "
            "re-run the stage that wrote it with --force"
        ) from None


def context_length(config) -> int | None:
    """Positions the model can attend over, from its config (None when it sets no limit)."""
    return getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)


def check_fits_context(config, data_cfg: DataConfig, random_init: bool = False) -> None:
    """The longest sequence the data stage lets through (prompt + response + EOS) must fit the model's
    positions; past them a training step fails on an index error, possibly hours in. With `random_init`
    (the architecture built from its config) the fix may also be more positions."""
    context = context_length(config)
    longest = data_cfg.max_prompt_tokens + data_cfg.max_response_tokens + 1
    if context is not None and longest > context:
        key = "n_positions" if getattr(config, "n_positions", None) else "max_position_embeddings"
        raise UserError(
            f"data.max_prompt_tokens={data_cfg.max_prompt_tokens} + data.max_response_tokens="
            f"{data_cfg.max_response_tokens} + 1 (EOS) = {longest} tokens exceeds the model's {context} positions; "
            "lower them (and re-run the data stage) or "
            + (f"set model.config_overrides.{key}={longest}" if random_init else "use a model with a longer context")
        )


def check_context_from_config(model_cfg: ModelConfig, data_cfg: DataConfig) -> None:
    """`check_fits_context` at start-up, from the model's config alone (no weights, no tokenizer), so a pipeline
    fails before its data stage rather than at SFT. Skipped when the config cannot be read without the network (a
    Hub model not in the cache): the SFT stage, which needs it, checks it then, or says why it cannot load it."""
    try:
        config = _architecture_config(model_cfg, local_only=True)
    except UserError:
        return
    check_fits_context(config, data_cfg, random_init=model_cfg.init == "random")


def load_policy(path: Path) -> nn.Module:
    from transformers import AutoModelForCausalLM

    with stage_model_errors(path):
        model = AutoModelForCausalLM.from_pretrained(str(path), use_safetensors=True)
    disable_dropout(model)
    return model


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """0, 1, 2, ... over real tokens whatever the padding side; pads get 0."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, T)


def token_logprobs(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Per-token log-probs of the given ids, aligned with the ids (column 0 is 0).

    Logits are divided by the sampling temperature before the softmax, so log-probs recomputed
    in training match the distribution the tokens were sampled from (Huang et al. 2024, detail 11).
    """
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask)
    ).logits
    next_logprobs = gather_logprobs(logits[:, :-1], input_ids[:, 1:], temperature)  # (B, T-1)
    return torch.nn.functional.pad(next_logprobs, (1, 0))  # (B, T)


# ----------------------------------------------------------------------------- reward models


class MeanPoolRewardModel(nn.Module):
    """Reward = MLP(mean of the final hidden states over real tokens): Linear -> ReLU -> Dropout -> Linear."""

    def __init__(self, backbone: nn.Module, hidden: int, dropout: float):
        super().__init__()
        self.backbone = backbone
        self.config = backbone.config
        width = backbone.config.hidden_size
        self.head = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, 1))

    def forward(self, input_ids, attention_mask, position_ids=None):
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        ).last_hidden_state  # (B, T, H)
        weights = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1)  # (B, H)
        return _RewardOutput(self.head(pooled))  # logits (B, 1)

    def save_pretrained(self, path, safe_serialization: bool = True) -> None:
        from safetensors.torch import save_file

        self.backbone.save_pretrained(path, safe_serialization=True)
        save_file({k: v.contiguous() for k, v in self.head.state_dict().items()}, str(Path(path) / MEAN_POOL_HEAD_FILE))


def inner_model(model: nn.Module) -> nn.Module:
    """The transformers model (or MeanPoolRewardModel) inside a peft LoRA wrapper, its layers still carrying
    the adapters, so its parts (`score`, `base_model`, ...) are reached as without LoRA; `model` otherwise."""
    from peft import PeftModel

    return model.get_base_model() if isinstance(model, PeftModel) else model


class _RewardOutput:
    def __init__(self, logits: torch.Tensor):
        self.logits = logits


def init_reward_head(linear: nn.Linear) -> None:
    """N(0, 1/sqrt(d+1)) weights and zero bias (Huang et al. 2024, reward model details)."""
    nn.init.normal_(linear.weight, std=1.0 / (linear.in_features + 1) ** 0.5)
    if linear.bias is not None:
        nn.init.zeros_(linear.bias)


class _DropLoadReport(logging.Filter):
    """Drops transformers' state-dict load report (a multi-line warning table)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "LOAD REPORT" not in record.getMessage()


def build_reward_model(sft_path: Path, reward_cfg: RewardConfig) -> nn.Module:
    """A reward model initialised from the SFT policy with a fresh scalar head.

    The head (`score.weight`) is missing from the SFT checkpoint by design, so transformers' load
    report, which would call it "newly initialized" in every run, is kept quiet; any other missing,
    unexpected or mismatched key is still an error.
    """
    from transformers import AutoModel, AutoModelForSequenceClassification

    if reward_cfg.pooling == "last":
        report_logger, quiet = logging.getLogger("transformers.modeling_utils"), _DropLoadReport()
        report_logger.addFilter(quiet)
        try:
            with stage_model_errors(sft_path):
                model, loading = AutoModelForSequenceClassification.from_pretrained(
                    str(sft_path), num_labels=1, use_safetensors=True, output_loading_info=True
                )
        finally:
            report_logger.removeFilter(quiet)
        prefix = f"{model.base_model_prefix}."
        surprises = {
            "missing": sorted(set(loading["missing_keys"]) - {"score.weight"}),
            # keys outside the backbone are the causal LM's own head (an untied one, e.g. GPT-NeoX's embed_out),
            # replaced by the score head by design
            "unexpected": sorted(key for key in loading["unexpected_keys"] if key.startswith(prefix)),
            "mismatched": sorted(str(key) for key in loading["mismatched_keys"]),
        }
        if any(surprises.values()):
            raise UserError(
                f"{sft_path} does not load as a reward model backbone ("
                + "; ".join(f"{kind}: {', '.join(keys)}" for kind, keys in surprises.items() if keys)
                + "); point the run folder at a complete sft/model"
            )
        init_reward_head(model.score)
    elif reward_cfg.pooling == "mean":
        with stage_model_errors(sft_path):
            backbone = AutoModel.from_pretrained(str(sft_path), use_safetensors=True)
        model = MeanPoolRewardModel(backbone, reward_cfg.head_hidden, reward_cfg.head_dropout)
        init_reward_head(model.head[0])
        init_reward_head(model.head[-1])
    else:
        raise UserError(f"reward.pooling must be 'last' or 'mean', got '{reward_cfg.pooling}'")
    disable_dropout(model.backbone if reward_cfg.pooling == "mean" else model)
    return model


def load_reward_model(path: Path) -> nn.Module:
    """Load either pooling kind from a reward stage's model folder."""
    from safetensors.torch import load_file
    from transformers import AutoModel, AutoModelForSequenceClassification

    with stage_model_errors(path):
        info = json.loads((path / REWARD_CONFIG_FILE).read_text())
        if info["pooling"] == "last":
            model = AutoModelForSequenceClassification.from_pretrained(str(path), use_safetensors=True)
        else:
            model = MeanPoolRewardModel(
                AutoModel.from_pretrained(str(path), use_safetensors=True), info["head_hidden"], 0.0
            )
            model.head.load_state_dict(load_file(str(path / MEAN_POOL_HEAD_FILE)))
    disable_dropout(model)
    model.reward_offset = info.get("offset_not_folded", 0.0)
    return model


def reward_scores(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B,) rewards read at the last non-pad token (HF sequence classification pooling) or mean-pooled."""
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask)
    ).logits
    return logits.squeeze(-1).float() - getattr(model, "reward_offset", 0.0)  # (B,)


def check_4d_mask_support(config, fix: str = "") -> str:
    """The model's attention implementation, if it takes the 4-D masks of shared-prompt rows; `fix`
    (e.g. "or set grpo.pack_groups=false") ends the error otherwise."""
    implementation = getattr(config, "_attn_implementation", "sdpa")
    if implementation not in ("sdpa", "eager"):
        raise UserError(
            f"shared-prompt batches need 'sdpa' or 'eager' attention (a 4-D mask), not '{implementation}'"
            + (f"; {fix}" if fix else "")
        )
    return implementation


def shared_prompt_attention_mask(config, attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The (B, 1, T, T) bool mask of `collate_shared_prompt_pairs` in the form `config`'s attention takes."""
    if check_4d_mask_support(config) == "sdpa":
        return attention_mask
    # eager attention adds the mask to its scores
    return torch.zeros(attention_mask.shape, dtype=dtype, device=attention_mask.device).masked_fill(
        ~attention_mask, torch.finfo(dtype).min
    )


def shared_prompt_response_logprobs(policy: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(B, T) log-prob under `policy` of each response token of `collate_shared_prompt_pairs` rows,
    given its own sequence's prefix; 0 on prompt and pad columns.

    Equal to `token_logprobs` on the separate `[prompt][chosen]` and `[prompt][rejected]` rows:
    a token's logits come from the column before it, except the first rejected token's, which
    come from the prompt's last column (the chosen tokens in between are not its prefix).
    Differentiable (DPO trains through it); forward-only callers run it under `torch.no_grad()`.
    `policy` may be wrapped for DDP, FSDP or DeepSpeed: the call goes through the wrapper.
    """
    from accelerate.utils import extract_model_from_parallel

    model = extract_model_from_parallel(policy)
    attention_mask = shared_prompt_attention_mask(model.config, batch["attention_mask"], model.dtype)
    logits = policy(
        input_ids=batch["input_ids"], attention_mask=attention_mask, position_ids=batch["position_ids"]
    ).logits  # (B, T, V)
    batch_size, width = batch["input_ids"].shape
    rows = torch.arange(batch_size, device=logits.device)
    previous = (torch.arange(width, device=logits.device) - 1).clamp(min=0).repeat(batch_size, 1)  # (B, T)
    prompt_last = (batch["chosen_mask"] & batch["rejected_mask"]).sum(1) - 1  # (B,)
    previous[rows, batch["chosen_last"] + 1] = prompt_last  # every response holds at least its EOS
    logprobs = gather_logprobs(logits[rows[:, None], previous], batch["input_ids"])  # (B, T)
    responses = batch["chosen_mask"] ^ batch["rejected_mask"]  # (B, T): exactly one of the two sequences
    return logprobs.masked_fill(~responses, 0.0)


def shared_prompt_hidden_states(reward_model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(B, T, H) final hidden states of a reward model's backbone over shared-prompt rows (`input_ids`,
    `position_ids` and the (B, 1, T, T) bool `attention_mask` of `rlhf.core.batching.shared_prompt_attention`)."""
    model = inner_model(reward_model)
    backbone = model.backbone if isinstance(model, MeanPoolRewardModel) else model.base_model
    attention_mask = shared_prompt_attention_mask(model.config, batch["attention_mask"], backbone.dtype)
    return backbone(
        input_ids=batch["input_ids"], attention_mask=attention_mask, position_ids=batch["position_ids"]
    ).last_hidden_state


def read_rewards(
    reward_model: nn.Module, hidden: torch.Tensor, rows: torch.Tensor, last: torch.Tensor, sequence_mask: torch.Tensor
) -> torch.Tensor:
    """(n,) rewards of n sequences inside shared-prompt rows, pooled as `reward_scores` pools a sequence
    of its own: the head reads the sequence's last token (last pooling) or its tokens' mean (mean pooling).

    hidden: (B, T, H) from `shared_prompt_hidden_states`; rows (n,) the row holding each sequence,
    last (n,) the column of its last token, sequence_mask (n, T) bool its columns (prompt included).
    """
    model = inner_model(reward_model)
    if isinstance(model, MeanPoolRewardModel):
        weights = sequence_mask.unsqueeze(-1).to(hidden.dtype)  # (n, T, 1)
        pooled = (hidden[rows] * weights).sum(1) / weights.sum(1).clamp(min=1)  # (n, H)
        head = model.head
    else:
        pooled, head = hidden[rows, last], model.score  # (n, H)
    return head(pooled).squeeze(-1).float() - getattr(model, "reward_offset", 0.0)


class PairRewards(NamedTuple):
    chosen: torch.Tensor  # (B,)
    rejected: torch.Tensor  # (B,)
    token_values: torch.Tensor | None  # (B, T) the token head's output at every column; None without one
    length_heuristic_weight: torch.Tensor | None  # () the learnt rater mixture weight w; None without one


class SharedPromptPairRewards(nn.Module):
    """A reward model applied to `collate_shared_prompt_pairs` rows: forward(batch) -> PairRewards.

    Pools exactly as `reward_scores` does on the two separate sequences: the head reads each
    sequence's last token (last pooling) or the mean over each sequence's tokens (mean pooling).
    With `token_head`, a linear head also reads every column's final hidden state (the
    log-prob distillation target of the reward stage); it is trained but not part of the reward
    model. With `length_heuristic_lr`, it also learns the weight w of the length-heuristic rater
    (`rlhf.core.losses.length_heuristic_bt_loss`) as σ(logit), from w = 0.1, at that learning rate (its own
    optimizer group: at the backbone's, a scalar would barely move). A module rather than a function
    so that the whole pass is one `forward`, which is what DistributedDataParallel synchronises;
    `reward_model` is the model to save.
    """

    def __init__(self, reward_model: nn.Module, token_head: bool = False, length_heuristic_lr: float | None = None):
        super().__init__()
        self.reward_model = reward_model
        check_4d_mask_support(reward_model.config)  # fail at start-up, not at the first batch
        self.token_head = nn.Linear(reward_model.config.hidden_size, 1) if token_head else None
        self.length_heuristic_logit = None
        if length_heuristic_lr is not None:
            # shape (1,), not (): FSDP shards parameters along their first dimension (rlhf.models.sharding)
            self.length_heuristic_logit = nn.Parameter(torch.logit(torch.tensor([0.1])))
            self.length_heuristic_logit._optim = {"lr": length_heuristic_lr, "weight_decay": 0.0}

    def forward(self, batch: dict[str, torch.Tensor]) -> PairRewards:
        hidden = shared_prompt_hidden_states(self.reward_model, batch)  # (B, T, H)
        rows = torch.arange(hidden.shape[0], device=hidden.device)

        def score(which: str) -> torch.Tensor:  # (B,)
            return read_rewards(self.reward_model, hidden, rows, batch[f"{which}_last"], batch[f"{which}_mask"])

        token_values = self.token_head(hidden).squeeze(-1).float() if self.token_head is not None else None  # (B, T)
        logit = self.length_heuristic_logit
        return PairRewards(
            score("chosen"), score("rejected"), token_values, None if logit is None else logit.sigmoid()[0]
        )


def fold_reward_offset(model: nn.Module, offset: float) -> float:
    """Make the saved model itself output reward - offset, so a plain
    `AutoModelForSequenceClassification.from_pretrained(path)` gives normalised scores.

    Returns the part of the offset that could not be folded into the weights (0 when folded).
    A head with a bias absorbs it directly. GPT-2's score head has no bias, but its input is the
    final LayerNorm, whose bias beta enters linearly: w . (g * x_hat + beta - delta) shifts the
    score by -w . delta, and delta = offset * w / |w|^2 removes exactly `offset`.
    """
    model = inner_model(model)
    head = model.head[-1] if isinstance(model, MeanPoolRewardModel) else model.score
    with torch.no_grad():
        if head.bias is not None:
            head.bias -= offset
            return 0.0
        final_norm = getattr(model.base_model, "ln_f", None)
        if final_norm is not None and getattr(final_norm, "bias", None) is not None and head.weight.shape[0] == 1:
            weight = head.weight[0]
            final_norm.bias -= offset * weight / weight.dot(weight)
            return 0.0
    return offset


# ----------------------------------------------------------------------------- PPO: value model


class ValueModel(nn.Module):
    """Per-position values head(h_t) (B, T) from a transformer backbone and a scalar head."""

    def __init__(self, backbone: nn.Module, head: nn.Module):
        super().__init__()
        self.backbone = backbone
        self.head = head

    def forward(self, input_ids, attention_mask, position_ids=None) -> torch.Tensor:
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state  # (B, T, H)
        return self.head(hidden).squeeze(-1).float()  # (B, T)


def value_model_from_reward(reward_model: nn.Module) -> ValueModel:
    """A critic initialised from a trained reward model, backbone and head, its head now read at
    every position rather than only the last (Huang et al. 2024: the value network is initialised
    from the reward model). Pass a copy: the critic trains, the reward model must stay frozen; or a
    LoRA reward model, whose adapters and head copy train while its base stays the frozen reward model."""
    reward_model = inner_model(reward_model)
    if isinstance(reward_model, MeanPoolRewardModel):
        return ValueModel(reward_model.backbone, reward_model.head)
    return ValueModel(reward_model.base_model, reward_model.score)


class PolicyAndValue(nn.Module):
    """PPO's two trainable roles in one module, so one optimizer, one `accelerator.prepare` and one
    checkpoint hold both (as the PolicyAndValueWrapper of Huang et al. 2024's code and TRL).

    value_model=None gives the shared-backbone option: a fresh scalar head, N(0, 1/sqrt(d+1)), on
    the policy's final hidden states, so the value loss also trains the policy's backbone.
    forward -> (logits (B, T, V), per-position values (B, T)); position ids come from the mask.
    """

    def __init__(self, policy: nn.Module, value_model: ValueModel | None = None):
        super().__init__()
        self.policy = policy
        self.value_model = value_model
        self.value_head = None
        if value_model is None:
            self.value_head = nn.Linear(policy.config.hidden_size, 1)
            init_reward_head(self.value_head)

    def forward(self, input_ids, attention_mask):
        position_ids = position_ids_from_mask(attention_mask)
        shared = self.value_head is not None
        out = self.policy(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            output_hidden_states=shared,
            use_cache=False,
        )
        if shared:
            values = self.value_head(out.hidden_states[-1]).squeeze(-1).float()  # (B, T)
        else:
            values = self.value_model(input_ids, attention_mask, position_ids)  # (B, T)
        return out.logits, values


def check_context(stage: str, longest_prompt: int, max_new_tokens: int, context: int | None) -> None:
    """The longest prompt plus the response budget must fit the model's positions."""
    if context is not None and longest_prompt + max_new_tokens > context:
        raise UserError(
            f"{stage}: the longest prompt ({longest_prompt} tokens) + {stage}.max_new_tokens={max_new_tokens} "
            f"exceeds the model's {context} positions; lower {stage}.max_new_tokens or data.max_prompt_tokens"
        )


def context_size(model_dir) -> int | None:
    """Positions the model can attend over, from its config.json (None when it has no limit)."""
    from transformers import AutoConfig

    with stage_model_errors(model_dir):
        config = AutoConfig.from_pretrained(str(model_dir))
    return context_length(config)
