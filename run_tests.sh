#!/usr/bin/env bash
# The test suite: ruff (lint, then format check), unit tests of the math and contracts, and
# end-to-end runs of the stage scripts.
#   bash run_tests.sh                  everything
#   bash run_tests.sh -m "not slow"    lint + unit tests only (docs/performance.md has the last measured time)
#   ruff format . && ruff check --fix .    (from .venv/bin) fixes most lint and format findings
set -euo pipefail
cd "$(dirname "$0")"
# One worker per core (RLHF_TEST_WORKERS overrides; 0 runs in this process), each test file on one worker so
# that its module fixtures are built once, the files in collection order (the slowest first, tests/conftest.py;
# xdist would otherwise start the files with the most tests first), and one torch thread per worker: two
# workers' threads then never spin against each other on a small machine (docs/performance.md).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# Compiled test and library modules are kept between runs (in __pycache__, ignored by git) even where the
# environment sets PYTHONDONTWRITEBYTECODE: a worker's collection, which compiles them and rewrites every test
# module's asserts, then takes 8.5-9 s instead of 13-14.5 s (docs/performance.md).
unset PYTHONDONTWRITEBYTECODE
if [ $# -eq 0 ]; then
  # The whole suite: beside the main run in .venv, the vLLM engine's tests, in .venv-vllm with vLLM's CPU build
  # (scripts/env.sh, RLHF_VLLM=only; x86-64 Linux). That job starts first, so that its install runs while .venv's
  # does (each install is one pip process: one core each). The small tiny run that end-to-end tests copy, and
  # SmolLM2's dequantized weights, are built once for both (tests/conftest.py).
  RLHF_TEST_SHARED=$(mktemp -d)
  export RLHF_TEST_SHARED
  vllm_log=$(mktemp)
  (
    export RLHF_VLLM=only
    source scripts/env.sh
    if [ -n "${VLLM_PY:-}" ]; then
      RLHF_REQUIRE_VLLM=1 "$VLLM_PY" -m pytest -p no:cacheprovider --durations=5 -m vllm
    else
      echo "vLLM's CPU build has no wheel for $(uname -s)-$(uname -m): the vLLM engine's tests did not run"
    fi
  ) > "$vllm_log" 2>&1 &
  vllm_pid=$!
  # A lint or install failure stops the vLLM job too, and leaves no temporary folder behind.
  trap 'pkill -P "$vllm_pid" 2>/dev/null || true; kill "$vllm_pid" 2>/dev/null || true; rm -rf "$vllm_log" "$RLHF_TEST_SHARED"' EXIT
fi
source scripts/env.sh
"$PY" -m ruff check .
"$PY" -m ruff format --check .
# Every run ends with its wall time and its ten slowest items, so that a change that doubles the suite is seen the
# day it lands (docs/performance.md, "The test suite").
pytest_args=(-n "${RLHF_TEST_WORKERS:-auto}" --dist loadfile --no-loadscope-reorder --durations=10)
if [ $# -gt 0 ]; then
  status=0
  "$PY" -m pytest "${pytest_args[@]}" "$@" || status=$?
  echo "[tests] run_tests.sh $* took ${SECONDS} s (lint included)"
  exit "$status"
fi
status=0
"$PY" -m pytest "${pytest_args[@]}" -m "not vllm" || status=$?
main_seconds=$SECONDS
vllm_status=0
wait "$vllm_pid" || vllm_status=$?
echo "---------- the vLLM engine's tests, in .venv-vllm ----------"
cat "$vllm_log"
echo "[tests] the whole suite took ${SECONDS} s, the main pytest run ending at ${main_seconds} s (setup and lint included)"
[ "$status" -eq 0 ] && [ "$vllm_status" -eq 0 ]
