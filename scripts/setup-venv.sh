#!/usr/bin/env bash
# Create (or refresh) .venv-<python version> with every cwtrain package installed
# editable from its path in this repository, plus the test tools.
# Usage: scripts/setup-venv.sh 3.12
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:?usage: scripts/setup-venv.sh PYTHON_VERSION}"
venv=".venv-$version"
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
ours=("packages/cwtrain-core[torch]" packages/cwtrain-local packages/cwtrain-slime packages/cwtrain-miles
      packages/cwtrain-nemo-rl packages/cwtrain-gym)
# Third-party wheels are kept in a wheelhouse between runs (pip's own cache is not
# reliable on these machines): downloaded once per Python version and dependency set,
# then installed with --no-index.
wheelhouse="${CWTRAIN_WHEELHOUSE:-$HOME/.cache/cwtrain-wheels}"
mkdir -p "$wheelhouse"
if [ "$(cat "$wheelhouse/.stamp-$version" 2>/dev/null)" != "$stamp_src" ]; then
  echo "downloading dependencies into $wheelhouse" >&2
  "$venv/bin/python" -m pip download -q -d "$wheelhouse" "${ours[@]}" -r requirements-dev.txt hatchling editables
  echo "$stamp_src" > "$wheelhouse/.stamp-$version"
fi
editables=()
for package in "${ours[@]}"; do editables+=(-e "$package"); done
"$venv/bin/python" -m pip install -q --no-index --find-links "$wheelhouse" "${editables[@]}" -r requirements-dev.txt
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
