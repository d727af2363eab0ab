"""LoRA (Hu et al. 2021, arXiv 2106.09685) with peft: adapters on the trained roles, and the frozen roles as
the same network with its adapters disabled.

Contracts:
- `with_lora` wraps a policy (causal LM) or a last-token reward model (sequence classification, its `score`
  head copied and trained in full through peft's modules_to_save) when `model.lora.enabled`; the base weights
  are frozen, so the optimizer (built from the parameters that require grad) holds only adapters and head;
- a frozen role that equals the base (the reference policy, pi_ref = pi_SFT, whose weights the policy started
  from; the reward model under PPO's LoRA critic) is `AdaptersDisabled(model)`: one copy of the weights;
- the final artifact is merged into plain Hugging Face weights, the adapters alone beside it
  (`rlhf.models.checkpoint.save_pretrained_atomic`), and a resumable checkpoint holds the trainable parameters only
  (`rlhf.models.checkpoint.save_training_state`).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from rlhf.core.errors import UserError
from rlhf.models.modeling import ValueModel, load_policy, load_reward_model, value_model_from_reward
from rlhf.models.roles import frozen
from rlhf.stage.schema import LoRAConfig

# Every attention and MLP projection: adapters on all linear layers match full fine-tuning far better than on
# the attention projections alone (Dettmers et al. 2023, QLoRA, arXiv 2305.14314, section 4).
_LLAMA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
DEFAULT_TARGETS = {
    "gpt2": ("c_attn", "c_proj", "c_fc"),  # c_proj: the attention output and the MLP down projection
    "gpt_neox": ("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"),
    "llama": _LLAMA_TARGETS,
    "mistral": _LLAMA_TARGETS,
    "qwen2": _LLAMA_TARGETS,
    "gemma": _LLAMA_TARGETS,
}
REWARD_HEAD = "score"  # the head of AutoModelForSequenceClassification, trained in full as modules_to_save


def is_lora(model: nn.Module) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def _linear_layers(backbone: nn.Module) -> dict[str, type]:
    """Leaf name -> class of every linear layer in the backbone (GPT-2's are transformers' Conv1D)."""
    from transformers.pytorch_utils import Conv1D

    return {
        name.rpartition(".")[2]: type(module)
        for name, module in backbone.named_modules()
        if isinstance(module, (nn.Linear, Conv1D))
    }


def lora_targets(model: nn.Module, spec: str) -> list[str]:
    """The leaf names of the backbone's linear layers that `model.lora.target_modules` selects; a one-line error
    for a name the architecture lacks. The heads (lm_head, score) are never targets: they sit outside the backbone."""
    layers = _linear_layers(model.base_model)
    model_type = model.config.model_type
    if spec == "all-linear":
        return sorted(layers)
    if spec == "auto":
        if model_type not in DEFAULT_TARGETS:
            raise UserError(
                f"model.lora.target_modules=auto has no default for model_type '{model_type}'; set it to some of "
                f"{', '.join(sorted(layers))} (comma-separated), or all-linear"
            )
        names = list(DEFAULT_TARGETS[model_type])
    else:
        names = [name.strip() for name in spec.split(",") if name.strip()]
    unknown = [name for name in names if name not in layers]
    if unknown:
        raise UserError(
            f"model.lora.target_modules: {', '.join(unknown)} is not a linear layer of this {model_type} model; "
            f"choose from {', '.join(sorted(layers))}, or use auto or all-linear"
        )
    return names


def with_lora(model: nn.Module, lora: LoRAConfig) -> nn.Module:
    """`model` with fresh adapters (B = 0, so it computes exactly what it did) and frozen base weights when
    `lora.enabled`; `model` itself otherwise. A sequence-classification model keeps a trainable copy of its
    `score` head (the original stays with the base)."""
    if not lora.enabled:
        return model
    import peft
    from transformers.pytorch_utils import Conv1D

    targets = lora_targets(model, lora.target_modules)
    classifier = hasattr(model, REWARD_HEAD)
    settings = peft.LoraConfig(
        task_type="SEQ_CLS" if classifier else "CAUSAL_LM",
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        fan_in_fan_out=_linear_layers(model.base_model)[targets[0]] is Conv1D,  # Conv1D stores W transposed
        modules_to_save=[REWARD_HEAD] if classifier else None,
    )
    with warnings.catch_warnings():  # peft reads a transformers attribute deprecated in v5; nothing for us to do
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return peft.get_peft_model(model, settings)


def load_trainable_policy(path: Path, lora: LoRAConfig) -> nn.Module:
    """The policy a stage trains, from a stage's model folder: all its weights, or adapters on the frozen weights."""
    return with_lora(load_policy(path), lora)


class AdaptersDisabled(nn.Module):
    """A LoRA model seen with its adapters disabled: the frozen base it was built on, sharing its weights.

    Calls and generate() run inside peft's `disable_adapter()`; other attributes (config, reward_offset, ...)
    are the wrapped model's. Never pass it to `frozen()`: that would freeze the adapters too.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *args, **kwargs):
        with self.model.disable_adapter():
            return self.model(*args, **kwargs)

    def generate(self, *args, **kwargs):
        with self.model.disable_adapter():
            return self.model.generate(*args, **kwargs)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.model, name)


@torch.no_grad()
def plain_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights `model` computes with, as (name, tensor) pairs under the plain Hugging Face names of its
    architecture (what `from_pretrained` reads): for a LoRA model each adapted weight plus its adapters' update
    (peft's `get_delta_weight`, computed beside the model, which is left bit for bit as it was: merging and
    unmerging in place would not be), for `AdaptersDisabled` the base weights alone, otherwise the model's own
    state dict. Unchanged tensors are the live ones: read them, do not keep them."""
    peft_model = model.model if isinstance(model, AdaptersDisabled) else model
    if not is_lora(peft_model):
        yield from model.state_dict().items()
        return
    from peft.tuners.lora import LoraLayer

    base = peft_model.get_base_model()
    updates = {}
    if not isinstance(model, AdaptersDisabled):
        for name, module in base.named_modules():
            if isinstance(module, LoraLayer):
                adapters = [a for a in module.active_adapters if a in module.lora_A]
                if adapters:
                    updates[f"{name}.base_layer.weight"] = sum(module.get_delta_weight(a) for a in adapters)
    for name, tensor in base.state_dict().items():
        if "lora_" not in name:
            yield name.replace(".base_layer.", "."), tensor + updates[name] if name in updates else tensor


def reference_policy(policy: nn.Module, sft_dir: Path, device: torch.device) -> nn.Module:
    """The frozen reference pi_ref = pi_SFT: a LoRA policy (not wrapped for DDP) with its adapters disabled, since
    its base weights are the SFT weights; otherwise a frozen copy loaded from `sft_dir`."""
    if is_lora(policy):
        return AdaptersDisabled(policy.to(device))
    return frozen(load_policy(sft_dir), device)


def ppo_critic_and_reward(
    reward_dir: Path, value_model: str, lora: LoRAConfig, device: torch.device
) -> tuple[ValueModel | None, nn.Module]:
    """PPO's critic (None for the shared value head on the policy) and its frozen reward model.

    The separate critic is initialised from the reward model (Huang et al. 2024). With LoRA it is the reward
    model with adapters and a trainable head copy, and the frozen reward model is that same network with its
    adapters disabled, so one copy of the reward model serves both; without, two copies are loaded.
    """
    if value_model == "shared":
        return None, frozen(load_reward_model(reward_dir), device)
    if lora.enabled:
        reward_model = with_lora(load_reward_model(reward_dir), lora).to(device)
        return value_model_from_reward(reward_model), AdaptersDisabled(reward_model)
    return value_model_from_reward(load_reward_model(reward_dir)), frozen(load_reward_model(reward_dir), device)
