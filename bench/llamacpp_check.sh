#!/usr/bin/env bash
# An exported GGUF file run by llama.cpp against its Hugging Face folder (bench/llamacpp_check.py): the same prompt
# tokens from the chat template in the file, and the same greedy answers.
#   bash bench/llamacpp_check.sh GGUF HF_DIR [--out FILE.json] [--weights-from-gguf] [--max-new-tokens N]
# The first run builds llama-cpp-python (requirements-llamacpp.txt) from source into .venv-llamacpp: about 5 min
# on 2 cores, with cmake and a C++ compiler.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: bash bench/llamacpp_check.sh GGUF HF_DIR [--out FILE.json] [--weights-from-gguf] [--max-new-tokens N]" >&2; exit 2; }
gguf=$1 hf_dir=$2
shift 2
[ -f "$gguf" ] || { echo "error: no GGUF file $gguf; write one with python part4_eval/export.py RUN MODEL" >&2; exit 2; }
source scripts/env.sh
if ! .venv-llamacpp/bin/python -c "import llama_cpp" 2>/dev/null; then
  echo "[llama.cpp] building llama-cpp-python into .venv-llamacpp (first use only; ~5 min on 2 cores)"
  "${PYTHON:-python3}" -m venv .venv-llamacpp
  .venv-llamacpp/bin/python -m pip install -q -r requirements-llamacpp.txt
fi
decoded=$(mktemp)
trap 'rm -f "$decoded"' EXIT
max=()
compare_args=()
while [ $# -gt 0 ]; do
  case $1 in
    --max-new-tokens) max=(--max-new-tokens "$2"); shift 2 ;;
    *) compare_args+=("$1"); shift ;;
  esac
done
.venv-llamacpp/bin/python bench/llamacpp_check.py decode "$gguf" --out "$decoded" "${max[@]}"
"$PY" bench/llamacpp_check.py compare "$hf_dir" --decoded "$decoded" "${max[@]}" "${compare_args[@]}"
