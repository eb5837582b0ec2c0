#!/usr/bin/env bash
# The whole test suite, with all set-up, on Python 3.12 and 3.13:
# creates .venv-3.12 and .venv-3.13, installs every package from its path, then runs
# ruff, mypy (strict on core) and pytest on each. Extra arguments go to pytest.
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
for version in $versions; do
  venv=".venv-$version"
  echo "== mypy (strict, cwtrain-core) on Python $version" >&2
  (cd packages/cwtrain-core/src && "../../../$venv/bin/mypy" --config-file ../../../pyproject.toml \
      --python-version "$version" -p cwtrain) || status=1
  echo "== pytest on Python $version" >&2
  "$venv/bin/python" -m pytest "$@" || status=1
done
exit $status
