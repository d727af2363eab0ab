#!/usr/bin/env bash
# The prepared GPU check (bench/gpu_check.py): every gpt2-hh stage a few steps, then each training stage timed,
# with MFU, GRPO per-sample cost, peak memory and the projected pipeline time, written to bench/results/.
#   bash bench/gpu_check.sh                 GPT-2 124M shape, bf16 (one H100: a few minutes)
#   bash bench/gpu_check.sh --shape tiny    the tiny shape, one step each (CI runs this on CPU)
#   RLHF_NO_VENV=1 bash bench/gpu_check.sh  use the current interpreter (a CUDA image's torch) as it is
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
export PYTHONUNBUFFERED=1
exec "$PY" bench/gpu_check.py "$@"
