#!/usr/bin/env bash
# Run the pipeline's stages in order. See README.md, or: bash run_all.sh --help
#   bash run_all.sh --preset tiny                       the offline CPU run (minutes)
#   bash run_all.sh --preset gpt2-hh                    GPT-2 on Anthropic HH-RLHF, one CUDA GPU
#   bash run_all.sh --preset tiny --only data,sft       some stages;  --from reward: that stage onwards
#   RLHF_LAUNCH="accelerate launch --multi_gpu" bash run_all.sh --preset gpt2-hh    several GPUs
set -euo pipefail
export RLHF_CALLER_DIR="${RLHF_CALLER_DIR:-$PWD}"  # relative paths mean what they do where the command was typed
cd "$(dirname "$0")"
source scripts/env.sh
exec "$PY" -m rlhf.pipeline "$@"
