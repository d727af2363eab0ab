"""Models and their training: building and loading them, adapters, sharding, the optimisation step, checkpoints.

modeling    tokenizers, policies, reward and value models; the forward passes stages share
sources     where a pretrained model comes from (a Hub id, a folder, a GGUF file)
lora        LoRA adapters (peft) per stage; a reference as the policy with its adapters off
sharding    FSDP2: training on shards, everything else on full tensors
roles       frozen roles (reference, reward model): set up, and checked unchanged at the end
memory      peak and resident memory of the models and optimizers
training    the Accelerator, batch-size plans, optimizer and schedule, train_step / fit
checkpoint  atomic checkpoints: written whole or not at all, read back only when complete
"""
