#!/usr/bin/env bash
# The test suite: ruff (lint, then format check), unit tests of the math and contracts, and
# end-to-end runs of the stage scripts.
#   bash run_tests.sh                  everything
#   bash run_tests.sh -m "not slow"    lint + unit tests only (about a minute)
#   ruff format . && ruff check --fix .    (from .venv/bin) fixes most lint and format findings
set -euo pipefail
cd "$(dirname "$0")"
source scripts/env.sh
"$PY" -m ruff check .
"$PY" -m ruff format --check .
exec "$PY" -m pytest "$@"
