#!/usr/bin/env bash
# Install everything, start the services, run every check and the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip install --quiet --disable-pip-version-check -e '.[dev]'
bash scripts/services.sh

echo "== ruff";         python3 -m ruff check src tests benchmarks examples tools
echo "== ruff format";  python3 -m ruff format --check src tests benchmarks examples tools
echo "== mypy";         python3 -m mypy
echo "== import-linter"; lint-imports --no-cache
echo "== pytest";       python3 -m pytest "$@"
