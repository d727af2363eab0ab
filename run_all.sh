#!/usr/bin/env bash
# Run the pipeline's stages in order. See README.md, or: bash run_all.sh --help
#   bash run_all.sh --preset tiny                       the offline CPU run (minutes)
#   bash run_all.sh --preset gpt2-hh                    GPT-2 on Anthropic HH-RLHF, one CUDA GPU
#   bash run_all.sh --preset tiny --only data,sft       some stages;  --from reward: that stage onwards
#   RLHF_LAUNCH="accelerate launch --multi_gpu" bash run_all.sh --preset gpt2-hh    several GPUs
#   RLHF_VLLM=1 bash run_all.sh --preset smollm2-ifeval ...   in .venv-vllm, with vLLM's CPU build (built once)
set -euo pipefail
export RLHF_CALLER_DIR="${RLHF_CALLER_DIR:-$PWD}"  # relative paths mean what they do where the command was typed
# Idle OpenMP threads spin 1,000 times, not 300,000, before they sleep (libgomp, torch's OpenMP on Linux): beside
# another torch job on 2 cores the tiny pipeline took 1.4x its time alone, not several times, and alone it keeps
# the default's speed, which sleeping at once (OMP_WAIT_POLICY=PASSIVE) lost (docs/performance.md, "Threads"). The
# arithmetic is the same. Setting OMP_WAIT_POLICY or GOMP_SPINCOUNT yourself keeps yours.
if [ -z "${OMP_WAIT_POLICY:-}" ] && [ -z "${GOMP_SPINCOUNT:-}" ]; then export GOMP_SPINCOUNT=1000; fi
cd "$(dirname "$0")"
source scripts/env.sh
# RLHF_VLLM=1: run in .venv-vllm, which scripts/env.sh builds once with vLLM's CPU build (x86-64 Linux), for
# rollout.engine=vllm (the smollm2-ifeval preset); elsewhere it has no wheel, and the run stays in .venv.
if [ "${RLHF_VLLM:-0}" = "1" ]; then
  if [ -n "${VLLM_PY:-}" ]; then PY="$VLLM_PY"
  else echo "[setup] RLHF_VLLM=1: vLLM's CPU build installs on x86-64 Linux only; running in .venv (add rollout.engine=hf)" >&2
  fi
fi
exec "$PY" -m rlhf.pipeline "$@"
