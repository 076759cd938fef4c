#!/usr/bin/env bash
# The project's test command (README and .ci/run): install, then lint, layering, types, tests.
#
#   bash infra/local/test.sh [--full] [PYTEST ARGS...]
#
# The default run leaves out the tests marked `full` (long scenarios that another default test
# already plays on a real cluster; the README says what each mode covers); --full runs them
# all. Extra arguments go to every pytest run.
#
# Phases: install (infra/local/install.sh; the dependencies come from a cache outside the
# clone), ruff and import-linter, then side by side the phases that start no Ray cluster
# (mypy, its cache outside the clone too; the unit tests; test_checkpoint_s3), then each
# integration module in a pytest process of its own: every module brings up its own local Ray
# cluster, and a Ray driver is process-wide state (as are the fake provider's node ids, which
# repeat from cluster to cluster), so one process per module keeps modules from seeing each
# other's clusters. Each pytest run names its slowest tests (over 5 s). The end is a table of
# each phase's seconds, the total, and the test counts.
set -uo pipefail
cd "$(dirname "$0")/../.."
full=0
if [ "${1:-}" = "--full" ]; then full=1; shift; fi
marker=()
if [ "$full" = 0 ]; then marker=(-m "not full"); fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
log="$work/all.log"
times="$work/times"
begun=$SECONDS
status=0
took() {  # took NAME START [RC]: one row of the closing table
  printf '%6d s  %-4s %s\n' "$((SECONDS - $2))" "${3:+rc=$3}" "$1" >>"$times"
}

start=$SECONDS
bash infra/local/install.sh || exit 1
took install "$start"
export RAY_USAGE_STATS_ENABLED=0

start=$SECONDS
echo "== ruff"; .venv/bin/ruff check . || exit 1
echo "== import-linter (layering)"; .venv/bin/lint-imports || exit 1
took "ruff, import-linter" "$start"

# mypy's cache lives beside the dependency cache, keyed as it is (a cache made against other
# stubs is not reused); mypy itself notices which sources changed. Without the cache, in the
# clone.
mypy_cache=.mypy_cache
mypy_lock="$work/mypy.lock"
if [ -f .venv/.rcp-deps ]; then
  mypy_cache="${RCP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rcp}/mypy-$(cat .venv/.rcp-deps)"
  mypy_lock="$mypy_cache.lock"  # two clones' runs take turns with the shared cache
fi

pytest_run() {  # pytest_run OUT ARGS...: one pytest process, its output to OUT
  local out=$1; shift
  .venv/bin/python -m pytest -p no:cacheprovider --durations=8 --durations-min=5 \
    "${marker[@]}" "$@" >"$out" 2>&1
}

# Side by side: the phases that start no Ray cluster, the unit tests in two halves (every
# other module, in name order). Each one's output is printed whole once all have ended.
no_ray_modules=(tests/integration/test_checkpoint_s3.py)
unit_a=(); unit_b=()
while IFS= read -r module; do
  if [ "${#unit_a[@]}" -le "${#unit_b[@]}" ]; then unit_a+=("$module"); else unit_b+=("$module"); fi
done < <(find tests/unit -name 'test_*.py' | sort)  # the tree mirrors the packages
echo "== side by side: mypy --strict, the unit tests (two halves), ${no_ray_modules[*]}"
start=$SECONDS
( flock 9; .venv/bin/mypy --cache-dir "$mypy_cache" >"$work/mypy.out" 2>&1
  echo $? >"$work/mypy.rc"; echo $((SECONDS - start)) >"$work/mypy.s" ) 9>"$mypy_lock" &
( pytest_run "$work/unit-a.out" "${unit_a[@]}" "$@"
  echo $? >"$work/unit-a.rc"; echo $((SECONDS - start)) >"$work/unit-a.s" ) &
( pytest_run "$work/unit-b.out" "${unit_b[@]}" "$@"
  echo $? >"$work/unit-b.rc"; echo $((SECONDS - start)) >"$work/unit-b.s" ) &
i=0
for module in "${no_ray_modules[@]}"; do
  ( pytest_run "$work/noray-$i.out" "$module" "$@"
    echo $? >"$work/noray-$i.rc"; echo $((SECONDS - start)) >"$work/noray-$i.s" ) &
  i=$((i + 1))
done
wait
side() {  # side NAME FILE-STEM: print one side-by-side phase's output and record it
  echo "== $1"
  cat "$work/$2.out"
  cat "$work/$2.out" >>"$log"
  local rc; rc=$(cat "$work/$2.rc")
  [ "$rc" -eq 0 ] || status=1
  printf '%6d s  %-4s %s\n' "$(cat "$work/$2.s")" "rc=$rc" "$1" >>"$times"
}
side "mypy --strict (the packages in pyproject.toml)" mypy
side "pytest tests/unit (first half: ${unit_a[0]##*/} ...)" unit-a
side "pytest tests/unit (second half: ${unit_b[0]##*/} ...)" unit-b
i=0
for module in "${no_ray_modules[@]}"; do side "pytest $module" "noray-$i"; i=$((i + 1)); done
took "(the side-by-side phases, wall-clock)" "$start"

# The integration modules with a test to run in this mode, from one collection (a module whose
# every test is marked full is left out without a pytest run of its own). If the collection
# itself fails, every module runs, so its own run shows the error.
collected=$(.venv/bin/python -m pytest -p no:cacheprovider --collect-only -q "${marker[@]}" \
  tests/integration "$@" 2>&1)
crc=$?
if [ "$crc" -eq 0 ] || [ "$crc" -eq 5 ]; then
  selected=$(grep -oE '^tests/integration/test_[a-z0-9_]+\.py' <<<"$collected" | sort -u)
else
  selected=$(printf '%s\n' tests/integration/test_*.py)
fi
for module in tests/integration/test_*.py; do
  case " ${no_ray_modules[*]} " in *" $module "*) continue ;; esac
  if ! grep -qxF "$module" <<<"$selected"; then
    echo "== $module: every test is marked full (bash infra/local/test.sh --full runs it)"
    continue
  fi
  echo "== pytest $module"
  start=$SECONDS
  .venv/bin/python -m pytest -p no:cacheprovider --durations=8 --durations-min=5 \
    "${marker[@]}" "$module" "$@" 2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then status=1; fi
  took "pytest $module" "$start" "$rc"
done

# Count from pytest's own closing lines ("==== 3 passed, 1 failed in 12.3s ===="), not from
# whatever the tests print (a load client's "0 failed" is not a failed test).
sum() {
  grep -E '^=+ .* in [0-9.]+s' "$log" | grep -oE "[0-9]+ $1" | awk '{s+=$1} END {print s+0}'
}
passed=$(sum passed); failed=$(sum failed); errors=$(sum error); skipped=$(sum skipped)
# Deselected: the unit runs' own count, and the integration modules' from their one collection
# ("120/153 tests collected (33 deselected)"), modules left out whole included.
unit_deselected=$(cat "$work"/unit-*.out | grep -E '^=+ .* in [0-9.]+s' | grep -oE '[0-9]+ deselected' \
  | awk '{s+=$1} END {print s+0}')
it_deselected=$(grep -oE '\([0-9]+ deselected\)' <<<"$collected" | grep -oE '[0-9]+' | head -1)
deselected=$((unit_deselected + ${it_deselected:-0}))
# -ra's summary: "SKIPPED [2] tests/unit/test_x.py:12: reference data missing: ..."
no_refdata=$(grep -E '^SKIPPED \[[0-9]+\] .*reference data missing' "$log" \
  | grep -oE '^SKIPPED \[[0-9]+\]' | grep -oE '[0-9]+' | awk '{s+=$1} END {print s+0}')
echo "== seconds per phase"
cat "$times"
printf '%6d s  total (%s)\n' "$((SECONDS - begun))" "$([ "$full" = 1 ] && echo --full || echo default)"
echo "tests: $passed passed, $((failed + errors)) failed, $skipped skipped, $deselected deselected (marked full)"
if [ "$no_refdata" -gt 0 ]; then
  echo "reference data: $no_refdata tests skipped for missing reference data (fetch it: bash infra/local/fetch-reference-data.sh)"
fi
exit "$status"
