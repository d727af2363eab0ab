#!/usr/bin/env bash
# Run the pipeline's stages in order. See README.md, or: bash run_all.sh --help
#   bash run_all.sh --preset tiny                       the offline CPU run (minutes)
#   bash run_all.sh --preset gpt2-hh                    GPT-2 on Anthropic HH-RLHF, one CUDA GPU
#   bash run_all.sh --preset tiny --only data,sft       some stages;  --from reward: that stage onwards
#   RLHF_LAUNCH="accelerate launch --multi_gpu" bash run_all.sh --preset gpt2-hh    several GPUs
set -euo pipefail
export RLHF_CALLER_DIR="${RLHF_CALLER_DIR:-$PWD}"  # relative paths mean what they do where the command was typed
# Idle OpenMP threads sleep instead of spinning: beside another torch job on 2 cores a tiny SFT step took 0.34 s
# rather than 2.75 s, alone 0.198 s rather than 0.182 (bench/results/cpu-2core-2026-11-28-omp-wait.json); the
# arithmetic is the same (docs/performance.md). OMP_WAIT_POLICY=ACTIVE (or any value) keeps yours.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
cd "$(dirname "$0")"
source scripts/env.sh
exec "$PY" -m rlhf.pipeline "$@"
