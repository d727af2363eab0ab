"""A vLLM engine colocated with the trainer: built once per stage in the training process, weights pushed in
place before each sampling call (the interface is `rlhf.rollout.engines`).

- vLLM's in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0), so a weight push is a `reload_weights` call on the
  worker with the trainer's tensors, with no save or reload from disk.
- Several processes (DDP or FSDP through `accelerate launch`): one engine per process, on that process's device,
  each sampling its own share of the rows, as `hf` does. vLLM joins the process group the launcher set up
  (its `external_launcher` backend, tensor parallel size 1), so each process's engine is a one-device engine that
  never waits for another's; the pushed weights are the full ones on every process (`rlhf.models.sharding.FullView`
  under FSDP).
- Sampling matches `rlhf.rollout.generate.generate_rollout`: temperature, top-p and top-k; `max_new_tokens`; stop at
  the tokenizer's EOS (kept in the response); the pad token never sampled (a -inf logit bias); one seed per
  request, so a row's response does not depend on the batch it shares.
- Log-probs are the engine's "processed" ones: of the distribution it sampled from (temperature, top-k/p and
  the pad ban applied), one per sampled token, in `Rollout.generation_logprobs`.
- Dtype follows the trainer's mixed precision (bf16 -> bfloat16, else float32), so the two differ only by
  kernels. On CPU the KV cache gets `rollout.cpu_kv_cache_mb`; on GPU the engine takes
  `rollout.gpu_memory_utilization` of the device, and with `rollout.sleep` frees it while the trainer runs.
"""

from __future__ import annotations

import os

import torch

from rlhf.core.errors import UserError
from rlhf.models.lora import plain_weights
from rlhf.rollout.batch import Rollout, SamplingConfig, pack_rollout


def _quiet_vllm() -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine lives in this process
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # the stage's own log stays readable
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "1")


class VLLMEngine:
    name = "vllm"

    def __init__(self, rollout_cfg, stage: str, model_dir, tokenizer, device, mixed_precision: str, seed: int = 0):
        _quiet_vllm()
        from vllm import LLM
        from vllm.inputs import TokensPrompt

        from rlhf.models.modeling import context_size

        self.stage, self.tokenizer, self.device = stage, tokenizer, torch.device(device)
        self.sleep = rollout_cfg.sleep
        if self.sleep and self.device.type != "cuda":
            raise UserError(f"{stage}: rollout.sleep=true needs a CUDA device; set rollout.sleep=false")
        dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(mixed_precision, "float32")
        # On CPU, prompts are prefilled whole: vLLM 0.32's CPU worker rewinds a request's random generator when it
        # drops a token sampled mid-prefill, which a CPU generator cannot do ("CPU Generator does not use offset").
        memory = (
            {"gpu_memory_utilization": rollout_cfg.gpu_memory_utilization, "enable_sleep_mode": self.sleep}
            if self.device.type == "cuda"
            else {
                "kv_cache_memory_bytes": rollout_cfg.cpu_kv_cache_mb << 20,
                "enforce_eager": True,
                "enable_chunked_prefill": False,
            }
        )
        try:
            self.llm = LLM(
                model=str(model_dir),
                tokenizer=str(model_dir),
                dtype=dtype,
                max_model_len=context_size(model_dir),
                seed=seed,
                logprobs_mode="processed_logprobs",
                trust_remote_code=False,
                use_tqdm_on_load=False,  # the stage's own progress bars only
                **memory,
                **_process_group(),
            )
            # One token now: a model the engine loads but cannot run (an attention shape its kernels lack) fails
            # here, at start-up, rather than at the first rollout.
            self.llm.generate([TokensPrompt(prompt_token_ids=[tokenizer.eos_token_id])], use_tqdm=False)
        except Exception as error:  # vLLM raises plain ValueError/RuntimeError; name the setting to change
            raise UserError(_build_error(stage, model_dir, error, self.device)) from error
        self.ban_pad = {tokenizer.pad_token_id: float("-inf")}
        self.asleep = False

    def load(self, model) -> None:
        """Push `model`'s current weights (adapters merged, for a LoRA model) into the engine in place."""
        self._wake()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": plain_weights(model)})
        self.llm.reset_prefix_cache()  # cached prompt blocks were computed with the old weights

    def sample(
        self,
        prompt_ids: list[list[int]],
        sampling: SamplingConfig,
        row_seeds: list[int] | None,
        with_logprobs: bool = True,
    ) -> Rollout:
        """The engine's log-probs come with every rollout (`with_logprobs` is the interface's; always True here)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self._wake()
        greedy = sampling.temperature == 0
        params = [
            SamplingParams(
                n=1,
                max_tokens=sampling.max_new_tokens,
                temperature=0.0 if greedy else sampling.temperature,
                top_p=1.0 if greedy else sampling.top_p,
                top_k=0 if greedy else sampling.top_k,
                seed=None if row_seeds is None else row_seeds[i],
                stop_token_ids=[self.tokenizer.eos_token_id],
                logit_bias=self.ban_pad,
                logprobs=0,  # the sampled token's log-prob
                detokenize=False,  # texts are decoded by the caller's tokenizer, as for hf
            )
            for i in range(len(prompt_ids))
        ]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids], params, use_tqdm=False)
        eos = self.tokenizer.eos_token_id
        responses, finished, logprobs = [], [], []
        for output in outputs:
            completion = output.outputs[0]
            ids = list(completion.token_ids)
            done = bool(ids) and ids[-1] == eos
            responses.append(ids)
            finished.append(done)
            logprobs.append([step[token].logprob for step, token in zip(completion.logprobs, ids)])
        if self.sleep:
            self.llm.sleep(level=1)  # weights to CPU, KV cache freed while the trainer runs
            self.asleep = True
        return pack_rollout(prompt_ids, responses, finished, self.tokenizer.pad_token_id, logprobs).to(self.device)

    def _wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False


def _process_group() -> dict:
    """The engine arguments that let one engine per process live beside a launched process group: vLLM's
    `external_launcher` backend reuses the group, and reads the process's rank and local rank from the environment
    that `accelerate launch` and `torch.distributed.run` set. Nothing for a single process."""
    if not (torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1):
        return {}
    os.environ.setdefault("RANK", str(torch.distributed.get_rank()))
    os.environ.setdefault("LOCAL_RANK", os.environ["RANK"])
    return {"distributed_executor_backend": "external_launcher"}


def _build_error(stage: str, model_dir, error: Exception, device) -> str:
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    lowered = text.lower()
    setting = "rollout.gpu_memory_utilization" if device.type == "cuda" else "rollout.cpu_kv_cache_mb"
    if "kv cache" in lowered:  # too small a cache for one sequence of the model's context
        return f"{stage}: vLLM's KV cache is too small ({text}); raise {setting}, or set rollout.engine=hf"
    if "memory" in lowered or isinstance(error, torch.OutOfMemoryError):
        return f"{stage}: vLLM ran out of memory building its engine ({text}); lower {setting}, or rollout.engine=hf"
    if "architecture" in lowered or "not supported" in lowered or "unsupported" in lowered:
        return f"{stage}: vLLM cannot load the model in {model_dir} ({text}); set rollout.engine=hf"
    return f"{stage}: vLLM failed to build its engine from {model_dir} ({text}); set rollout.engine=hf"
