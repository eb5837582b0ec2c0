#!/usr/bin/env bash
# The whole test suite, with all set-up, on Python 3.12 and 3.13:
# creates .venv-3.12 and .venv-3.13, installs every package from its path, then runs
# ruff, mypy (strict, every package in the list below) and pytest on each. Extra arguments go to pytest.
# CWTRAIN_PYTHONS="3.12" limits the versions.
set -euo pipefail
cd "$(dirname "$0")/.."
versions="${CWTRAIN_PYTHONS:-3.12 3.13}"
status=0
for version in $versions; do
  bash scripts/setup-venv.sh "$version"
done
first=${versions%% *}
echo "== ruff" >&2
".venv-$first/bin/ruff" check . || status=1
# mypy --strict in one run over every package's module listed here, plus the test stand-ins of
# core's types; the cwtrain namespace spans the packages' src folders, all of them on MYPYPATH.
mypy_targets=()
for module in cwtrain cwtrain.integrations.slime cwtrain.integrations.miles cwtrain.integrations.nemo_rl \
    cwtrain.integrations.gym cwtrain.local; do
  mypy_targets+=(-p "$module")
done
for helper in recording_loader slime_driver fake_openai; do mypy_targets+=(-m "$helper"); done
mypy_path="$(printf '%s:' packages/*/src)tests/slime"
for version in $versions; do
  venv=".venv-$version"
  echo "== mypy (strict: ${mypy_targets[*]}) on Python $version" >&2
  MYPYPATH="$mypy_path" "$venv/bin/mypy" --config-file pyproject.toml --python-version "$version" \
      "${mypy_targets[@]}" || status=1
  echo "== pytest on Python $version" >&2
  "$venv/bin/python" -m pytest "$@" || status=1
done
exit $status
