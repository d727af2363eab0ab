"""FSDP2 (torch's `fully_shard`) for the model a stage trains: sharding it where accelerate does not, and the full
weights and optimizer state that checkpoints, evaluation and sampling need from a sharded model.

Under `configs/accelerate/fsdp.yaml` accelerate shards the model on GPUs, but on a machine without one it builds a
MULTI_CPU (DDP) setup and ignores the FSDP plugin (docs/scaling.md). `prepare_trained_model` applies FSDP2 there
itself, as accelerate's TRANSFORMER_BASED_WRAP does on GPUs: `fully_shard` on each transformer block (the classes a
Hugging Face model lists in `_no_split_modules`), then on the root, over a 1-D gloo mesh of every process. Each
parameter becomes a DTensor holding 1/W of its rows; forward and backward all-gather a block's parameters when they
run it and reduce-scatter its gradients, averaged over processes as DDP's are; AdamW keeps state for its shard only.

Everything else reads full tensors, so nothing after training depends on how it was sharded:
- checkpoints hold the full trainable weights and the full optimizer state in the one-process layout
  (`training_state`, `load_training_state`): a run resumes on any number of processes, sharded or not;
- evaluation and sampling run on a full copy of the model (`FullView`), refreshed from the shards after the weights
  change. Its forward passes need no collective, so processes may run different numbers of them (generation stops
  at different lengths on each), which a sharded model's all-gathers could not survive.
A sharded model's gathered weights are equal to its shards, so the copy computes what the sharded model would.
"""

from __future__ import annotations

import copy
import os
import sys

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType

from rlhf.core.errors import UserError

# torch.distributed's tensor and checkpoint modules are imported only by a sharded run: together they take 0.7 s,
# which every stage process would pay otherwise.


def _dtensor_class():
    """torch's DTensor class, or None when nothing has imported it (then no tensor can be one)."""
    module = sys.modules.get("torch.distributed.tensor")
    return None if module is None else module.DTensor


def _is_dtensor(tensor) -> bool:
    dtensor = _dtensor_class()
    return dtensor is not None and isinstance(tensor, dtensor)


def _full(strict: bool = True):
    """State-dict options under which every process gets every tensor whole."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, strict=strict)


def fsdp_launched() -> bool:
    """Whether `accelerate launch` was given an FSDP config (it exports ACCELERATE_USE_FSDP=true)."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether the model's parameters are DTensor shards (FSDP2, applied here or by accelerate on GPUs)."""
    return any(_is_dtensor(param) for param in model.parameters())


def shards_here(accelerator: Accelerator) -> bool:
    """FSDP was asked for, and accelerate will not apply it: several processes on a machine without a GPU."""
    return fsdp_launched() and accelerator.distributed_type == DistributedType.MULTI_CPU


def block_classes(model: torch.nn.Module) -> set[str]:
    """Names of the transformer-block classes to shard one by one: every `_no_split_modules` the model or its
    submodules (a reward model's backbone, PEFT's base model) declare."""
    return {name for module in model.modules() for name in (getattr(module, "_no_split_modules", None) or [])}


def shard(model: torch.nn.Module, world_size: int) -> None:
    """`fully_shard` each transformer block, then the root, over a 1-D CPU mesh of `world_size` processes."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world_size,))
    blocks = block_classes(model)
    if not blocks:
        raise UserError(
            f"FSDP: {type(model).__name__} names no transformer blocks (`_no_split_modules`) to shard; "
            "launch with configs/accelerate/ddp.yaml instead"
        )
    name = type(model).__name__  # before fully_shard renames the class (FSDP<name>)
    sharded = [module for module in model.modules() if type(module).__name__ in blocks]
    for module in sharded:
        fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if torch.distributed.get_rank() == 0:
        print(
            f"[fsdp] {name} sharded over {world_size} processes: each of {len(sharded)} "
            f"{'/'.join(sorted(blocks))} blocks, then the root",
            flush=True,
        )


class FullView:
    """The trained model, whole: for evaluation, sampling and publishing. Unsharded, it is the model itself;
    sharded, a full copy made before sharding whose weights `of` refreshes from the shards (a collective: every
    process calls it at the same point)."""

    def __init__(self, accelerator: Accelerator, copy_of_model: torch.nn.Module | None):
        self.accelerator = accelerator
        self.copy = None if copy_of_model is None else copy_of_model.to(accelerator.device)  # where the shards are

    def of(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.copy is None or not is_sharded(model):
            return self.accelerator.unwrap_model(model)
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        self.copy.load_state_dict(get_model_state_dict(model, options=_full()))
        return self.copy


def prepare_trained_model(accelerator: Accelerator, model: torch.nn.Module, make_optimizer):
    """accelerate's `prepare` for the model a stage trains and its optimizer (`make_optimizer(model)`, built after
    any sharding, on the parameters that training will update); on a CPU under the FSDP launcher config, FSDP2 here
    instead of accelerate's DDP. -> (model, optimizer, FullView)."""
    if not shards_here(accelerator):
        whole = copy.deepcopy(model) if fsdp_launched() else None  # accelerate shards it on GPUs
        model, optimizer = accelerator.prepare(model, make_optimizer(model))
        return model, optimizer, FullView(accelerator, whole)
    if hasattr(model, "peft_config"):
        raise UserError(
            "FSDP on CPU shards the whole model and has not been tested with LoRA adapters; launch with "
            "configs/accelerate/ddp.yaml, or set model.lora.enabled=false"
        )
    with torch.no_grad():  # rank 0's weights everywhere, as DDP does when it wraps a model (a fresh random init
        for tensor in model.state_dict().values():  # differs per process: each one is seeded on its own)
            torch.distributed.broadcast(tensor, src=0)
    whole = copy.deepcopy(model)
    own_settings = {name: param._optim for name, param in model.named_parameters() if hasattr(param, "_optim")}
    shard(model, accelerator.num_processes)  # replaces every parameter by a DTensor one: their attributes go
    for name, param in model.named_parameters():
        if name in own_settings:  # a parameter's own optimizer settings (rlhf.models.training.build_optimizer)
            param._optim = own_settings[name]
    return model, accelerator.prepare(make_optimizer(model)), FullView(accelerator, whole)


def full_gradient_norm(norm: torch.Tensor) -> torch.Tensor:
    """`clip_grad_norm_`'s total norm as a plain tensor (over sharded gradients it is a DTensor)."""
    return norm.full_tensor() if _is_dtensor(norm) else norm


def trainable_names(model: torch.nn.Module) -> list[str]:
    """Names of the parameters that require grad, each shared one once (GPT-2's lm_head = wte, as wte)."""
    return [name for name, param in model.named_parameters() if param.requires_grad]


def _parameter_names(model: torch.nn.Module) -> dict[int, str]:
    """id(parameter) -> its name, each shared parameter under its first name (as `named_parameters` gives it)."""
    return {id(param): name for name, param in model.named_parameters()}


def training_state(model: torch.nn.Module, optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """The trainable weights (name -> full tensor) and the optimizer's state in `optimizer.state_dict()`'s own
    layout (parameters numbered in param-group order), whole even when the model is sharded: a collective then,
    which every process must call."""
    if not is_sharded(model):
        weights = {name: p.detach().contiguous() for name, p in model.named_parameters() if p.requires_grad}
        return weights, optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    trainable = set(trainable_names(model))
    full = get_model_state_dict(model, options=_full())
    weights = {name: tensor.contiguous() for name, tensor in full.items() if name in trainable}
    optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper holds the torch optimizer
    by_name = get_optimizer_state_dict(model, optimizer, options=_full())  # state and param groups keyed by name
    names = _parameter_names(model)
    order = [names[id(param)] for group in optimizer.param_groups for param in group["params"]]
    number = {name: i for i, name in enumerate(order)}
    groups = [{**group, "params": [number[name] for name in group["params"]]} for group in by_name["param_groups"]]
    state = {number[name]: value for name, value in by_name["state"].items()}
    return weights, {"state": state, "param_groups": groups}


def load_training_state(model: torch.nn.Module, optimizer, weights: dict[str, torch.Tensor], optimizer_state: dict):
    """Put `training_state`'s full tensors back into a model and optimizer, sharded or not: each process keeps
    its shard of them. Trainable weights only (`strict=False`); the rest come from the stage's inputs."""
    if not is_sharded(model):
        model.load_state_dict(weights, strict=False)
        optimizer.load_state_dict(optimizer_state)
        return
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    set_model_state_dict(model, weights, options=_full(strict=False))
    optimizer = getattr(optimizer, "optimizer", optimizer)
    names = _parameter_names(model)
    order = [names[id(param)] for group in optimizer.param_groups for param in group["params"]]
    groups = [{**group, "params": [order[i] for i in group["params"]]} for group in optimizer_state["param_groups"]]
    state = {order[i]: value for i, value in optimizer_state["state"].items()}
    set_optimizer_state_dict(model, optimizer, {"state": state, "param_groups": groups}, options=_full())
