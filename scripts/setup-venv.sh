#!/usr/bin/env bash
# Create (or refresh) .venv-<python version> with every cwtrain package installed
# editable from its path in this repository, plus the test tools.
# Usage: scripts/setup-venv.sh 3.12
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:?usage: scripts/setup-venv.sh PYTHON_VERSION}"
venv=".venv-$version"
export PIP_CACHE_DIR="${PIP_CACHE_DIR:-$HOME/.cache/cwtrain-pip}"
export PIP_DISABLE_PIP_VERSION_CHECK=1

find_python() {
  local v="$1" candidate
  for candidate in "python$v" "$(command -v pyenv >/dev/null 2>&1 && pyenv which "python$v" 2>/dev/null || true)" \
                   "$HOME"/.pyenv/versions/"$v"*/bin/python"$v"; do
    if [ -n "$candidate" ] && command -v "$candidate" >/dev/null 2>&1; then
      echo "$candidate"; return 0
    fi
  done
  echo "error: Python $v not found (install it with pyenv: pyenv install $v)" >&2
  return 1
}

# The install is redone only when a dependency list changed.
stamp_src=$(cat pyproject.toml requirements-dev.txt packages/*/pyproject.toml | sha256sum | cut -c1-16)
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.cwtrain-stamp" 2>/dev/null)" = "$stamp_src" ]; then
  exit 0
fi
python=$(find_python "$version")
echo "setting up $venv with $($python --version)" >&2
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
# Our packages by path only (never from an index); their pins to each other resolve
# against these local candidates.
"$venv/bin/python" -m pip install -q \
  -e "packages/cwtrain-core[torch]" \
  -e packages/cwtrain-local \
  -e packages/cwtrain-slime \
  -e packages/cwtrain-miles \
  -e packages/cwtrain-nemo-rl \
  -e packages/cwtrain-gym \
  -r requirements-dev.txt
# Refuse an environment where any cwtrain distribution came from somewhere else.
"$venv/bin/python" - <<'PY'
import importlib.metadata as md, json, sys
bad = []
for dist in md.distributions():
    name = (dist.metadata["Name"] or "").lower()
    if name == "cwtrain" or name.startswith("cwtrain-"):
        direct = dist.read_text("direct_url.json")
        url = json.loads(direct)["url"] if direct else ""
        if not url.startswith("file://"):
            bad.append(name)
if bad:
    sys.exit(f"error: not installed from this repository: {', '.join(bad)}")
PY
echo "$stamp_src" > "$venv/.cwtrain-stamp"
