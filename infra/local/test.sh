#!/usr/bin/env bash
# The project's test command (README and .ci/run): install, then lint, layering, types, tests.
#
# Unit tests run in one pytest process. Each integration module runs in a pytest process of
# its own: every module brings up its own local Ray cluster, and a Ray driver is process-wide
# state (as are the fake provider's node ids, which repeat from cluster to cluster), so one
# process per module keeps modules from seeing each other's clusters. Extra arguments go to
# every pytest run; each names its slowest tests (over 5 s), where the suite's time goes.
# The last line totals all runs.
set -uo pipefail
cd "$(dirname "$0")/../.."
bash infra/local/install.sh || exit 1
export RAY_USAGE_STATS_ENABLED=0
set -e
echo "== ruff"; .venv/bin/ruff check .
echo "== import-linter (layering)"; .venv/bin/lint-imports
echo "== mypy --strict (the packages in pyproject.toml)"; .venv/bin/mypy
set +e

log=$(mktemp)
times=$(mktemp)
status=0
run() {
  echo "== pytest $*"
  local start=$SECONDS
  .venv/bin/python -m pytest -p no:cacheprovider --durations=8 --durations-min=5 "$@" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then status=1; fi
  printf '%6d s  rc=%d  %s\n' "$((SECONDS - start))" "$rc" "$1" >>"$times"
}
run tests/unit "${@}"
for module in tests/integration/test_*.py; do
  run "$module" "${@}"
done
# Count from pytest's own closing lines ("==== 3 passed, 1 failed in 12.3s ===="), not from
# whatever the tests print (a load client's "0 failed" is not a failed test).
sum() {
  grep -E '^=+ .* in [0-9.]+s' "$log" | grep -oE "[0-9]+ $1" | awk '{s+=$1} END {print s+0}'
}
passed=$(sum passed); failed=$(sum failed); errors=$(sum error); skipped=$(sum skipped)
echo "== seconds per pytest run"; cat "$times"
rm -f "$log" "$times"
echo "tests: $passed passed, $((failed + errors)) failed, $skipped skipped"
exit "$status"
