#!/usr/bin/env bash
# The project's test command (README and .ci/run): install, then lint, layering, types, tests.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash infra/local/install.sh
export RAY_USAGE_STATS_ENABLED=0
echo "== ruff"; .venv/bin/ruff check .
echo "== import-linter (layering)"; .venv/bin/lint-imports
echo "== mypy --strict policies"; .venv/bin/mypy
echo "== pytest"; .venv/bin/python -m pytest -p no:cacheprovider "$@"
