#!/usr/bin/env bash
# Set up everything the tests need (venv, package, Chromium) and run lint, types and tests.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k store -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
bash scripts/install-browser.sh
.venv/bin/ruff check tunehub tests benchmarks
.venv/bin/ruff format --check tunehub tests benchmarks
.venv/bin/mypy
# Two workers (pyproject's addopts; -n 0 runs in one process); a line per test as it ends, so a
# CI log never goes quiet for long; the slowest tests at the end, to see where the time goes.
.venv/bin/pytest -v --durations=20 "$@"
