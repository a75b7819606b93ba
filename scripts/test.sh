#!/usr/bin/env bash
# Set up argosy, lint it, and run the whole test suite on two workers.
# Exit code 5 from pytest (no tests collected) is an error here, not a success.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check --quiet .
set +e
.venv/bin/python -m pytest -n 2 -q --durations=30 "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "error: pytest collected no tests" >&2
  exit 1
fi
exit "$status"
