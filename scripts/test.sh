#!/usr/bin/env bash
# The whole test suite, with all set-up, on Python 3.12 and 3.13:
# creates .venv-3.12 and .venv-3.13, installs every package from its path, then runs
# ruff, ruff format --check, mypy (strict, every package in the list below) and pytest on each.
# Extra arguments go to pytest. CWTRAIN_PYTHONS="3.12" limits the versions.
#
# The interpreters run side by side: the suite waits on local servers (moto, replicas, the
# control plane) far more than it computes, so two runs at once take about as long as one.
# The first interpreter's output streams; the others' is printed when they end.
# CWTRAIN_TEST_SERIAL=1 runs them one after the other.
set -euo pipefail
cd "$(dirname "$0")/.."
versions="${CWTRAIN_PYTHONS:-3.12 3.13}"
for version in $versions; do
  bash scripts/setup-venv.sh "$version"
done
first=${versions%% *}
status=0
echo "== ruff" >&2
".venv-$first/bin/ruff" check . || status=1
".venv-$first/bin/ruff" format --check . || status=1
# mypy --strict in one run over every package's module listed here, plus the test stand-ins of
# core's types; the cwtrain namespace spans the packages' src folders, all of them on MYPYPATH.
mypy_targets=()
for module in cwtrain cwtrain.integrations.slime cwtrain.integrations.miles cwtrain.integrations.nemo_rl \
    cwtrain.integrations.gym cwtrain.local; do
  mypy_targets+=(-p "$module")
done
for helper in recording_loader slime_driver fake_openai; do mypy_targets+=(-m "$helper"); done
mypy_path="$(printf '%s:' packages/*/src)tests/slime:tests/core"

check_version() {  # mypy, then pytest, on one interpreter; returns non-zero when either fails
  local version=$1 venv=".venv-$1" result=0
  shift
  echo "== mypy (strict: ${mypy_targets[*]}) on Python $version" >&2
  MYPYPATH="$mypy_path" "$venv/bin/mypy" --config-file pyproject.toml --python-version "$version" \
      --cache-dir ".mypy_cache/$version" "${mypy_targets[@]}" || result=1
  echo "== pytest on Python $version" >&2
  "$venv/bin/python" -m pytest "$@" || result=1
  return $result
}

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
pids=()
for version in $versions; do
  if [ "${CWTRAIN_TEST_SERIAL:-0}" = 1 ] || [ "$version" = "$first" ]; then
    continue
  fi
  check_version "$version" "$@" >"$logs/$version.log" 2>&1 &
  pids+=("$version:$!")
done
check_version "$first" "$@" || status=1
if [ "${CWTRAIN_TEST_SERIAL:-0}" = 1 ]; then
  for version in $versions; do
    [ "$version" = "$first" ] || check_version "$version" "$@" || status=1
  done
fi
for entry in "${pids[@]}"; do
  version=${entry%%:*}
  wait "${entry#*:}" || status=1
  echo "== Python $version (ran beside Python $first)" >&2
  cat "$logs/$version.log" >&2
done
exit $status
