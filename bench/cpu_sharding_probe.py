"""What accelerate builds from a sharded launcher config on a machine without a GPU: one training step of a small
GPT-2, printing per process the distributed type, the process index and count accelerate reports, the prepared
model's class and the shape each process holds of the embedding (a shard under FSDP or ZeRO-3, whole otherwise).

    accelerate launch --config_file configs/accelerate/fsdp.yaml --num_processes 2 bench/cpu_sharding_probe.py --cpu
    accelerate launch --config_file configs/accelerate/deepspeed_zero2.yaml --num_processes 2 \\
        bench/cpu_sharding_probe.py            # Accelerator(cpu=False): needs `pip install deepspeed`

`--cpu` builds the Accelerator as the stages do on a machine without a GPU (`rlhf.models.training.make_accelerator`).
Findings are in docs/scaling.md."""

from __future__ import annotations

import argparse

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from transformers import GPT2Config, GPT2LMHeadModel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="Accelerator(cpu=True), as the stages build it on CPU")
    args = parser.parse_args()
    accelerator = Accelerator(cpu=args.cpu)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if accelerator.distributed_type.name == "DEEPSPEED":  # DeepSpeed needs its batch sizes without a dataloader
        AcceleratorState().deepspeed_plugin.deepspeed_config.update(
            train_micro_batch_size_per_gpu=4, train_batch_size=4 * int(torch.distributed.get_world_size())
        )
    model, optimizer = accelerator.prepare(model, optimizer)
    embedding = next(iter(model.parameters()))
    held = tuple(getattr(embedding, "_local_tensor", embedding).shape)
    ids = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(1))
    loss = model(input_ids=ids, labels=ids).loss
    accelerator.backward(loss)
    optimizer.step()
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    print(
        f"[probe] rank {rank}/{world}: {accelerator.distributed_type.name}, accelerate process "
        f"{accelerator.process_index}/{accelerator.num_processes}, {type(model).__name__}, embedding held {held} "
        f"of {tuple(embedding.shape)}, loss {loss.item():.4f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
