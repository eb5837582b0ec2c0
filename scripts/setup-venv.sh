#!/usr/bin/env bash
# Create (or refresh) .venv-<python version> with the cwtrain packages installed editable from
# their paths in this repository.
# Usage: scripts/setup-venv.sh 3.12           every package plus the test tools (scripts/test.sh)
#        scripts/setup-venv.sh 3.12 --demo    only what `cwtrain demo` imports: cwtrain-core[torch]
#                                             and cwtrain-local with their dependencies, and the openai
#                                             client the local quick start uses (scripts/demo.sh)
# A full environment serves the demo as well (--demo then does nothing); the full set-up on a
# demo environment adds the rest.
#
# torch is installed without triton: triton compiles GPU kernels for torch.compile, which
# cwtrain never calls, and torch imports and runs (CPU and CUDA) without it; it is 0.9 GB of
# the environment. pip cannot leave out one dependency, so the third-party requirements are
# resolved once into exact pins (kept in the wheelhouse with the wheels), triton is dropped
# from them, and everything is installed with --no-deps.
#
# pip's own warnings about this machine's configured index locations that hold nothing for a
# package ("WARNING: Location '...' is ignored", one per package and location) are counted, not
# printed: a line at the end gives their number. Every other line of pip's reaches the terminal.
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:?usage: scripts/setup-venv.sh PYTHON_VERSION [--demo]}"
profile=full
case "${2:-}" in
  "") ;;
  --demo) profile=demo ;;
  *) echo "error: unknown option ${2}; usage: scripts/setup-venv.sh PYTHON_VERSION [--demo]" >&2; exit 2 ;;
esac
venv=".venv-$version"
export PIP_DISABLE_PIP_VERSION_CHECK=1
started=$(date +%s)
say() { echo "setup-venv: $*" >&2; }
ignored_locations=0
pip_() {  # pip in the environment, with the "Location ... is ignored" warnings counted (see above)
  local err status=0 count
  err=$(mktemp)
  "$venv/bin/python" -m pip "$@" 2>"$err" || status=$?
  count=$(grep -c "^WARNING: Location '.*' is ignored" "$err" || true)
  ignored_locations=$((ignored_locations + count))
  grep -v "^WARNING: Location '.*' is ignored" "$err" >&2 || true
  rm -f "$err"
  return $status
}

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

# The install is redone only when a dependency list changed (or a demo environment is asked
# for everything).
stamp_src=$(cat pyproject.toml requirements-dev.txt packages/*/pyproject.toml scripts/setup-venv.sh \
    scripts/profile_requirements.py | sha256sum | cut -c1-16)
have=$(cat "$venv/.cwtrain-stamp" 2>/dev/null || true)
if [ -x "$venv/bin/python" ] && { [ "$have" = "full $stamp_src" ] || [ "$have" = "$profile $stamp_src" ]; }; then
  exit 0
fi
python=$(find_python "$version")
say "setting up $venv ($profile set: $([ "$profile" = demo ] && echo "what the demo and the local quick start import" || echo "every package and the test tools")) with $($python --version)"
"$python" -m venv "$venv"
pip_ install -q --upgrade pip
# Our packages (installed from their paths) and the third-party requirements of the profile:
# those of our packages (cwtrain-core with its torch extra, which cwtrain-local needs), what the
# profile's guides import (the openai client for the local quick start), and for the full
# set-up the test tools; scripts/profile_requirements.py says which.
mapfile -t ours < <("$venv/bin/python" scripts/profile_requirements.py --packages "$profile")
requirements="$venv/.cwtrain-requirements.txt"
"$venv/bin/python" scripts/profile_requirements.py "$profile" > "$requirements"
# Third-party wheels are kept in a wheelhouse between runs (pip's own cache is not reliable
# on these machines): resolved and downloaded once per Python version, profile and dependency
# set, then installed with --no-index. The build backend of our editables comes from there too.
wheelhouse="${CWTRAIN_WHEELHOUSE:-$HOME/.cache/cwtrain-wheels}"
mkdir -p "$wheelhouse"
pins="$wheelhouse/pins-$version-$profile-$stamp_src.txt"
if [ ! -s "$pins" ]; then
  say "resolving and downloading the dependencies into $wheelhouse (once per Python version and dependency set; about 2.7 GB the first time)"
  report="$venv/.cwtrain-resolve.json"
  pip_ install -q --dry-run --ignore-installed --report "$report" -r "$requirements"
  skip_packages=$("$venv/bin/python" scripts/profile_requirements.py --left-out)  # triton (see above)
  "$venv/bin/python" - "$report" "$skip_packages" > "$pins.tmp" <<'PY'
import json, sys
skip = set(sys.argv[2].split())
for item in json.load(open(sys.argv[1]))["install"]:
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    if name.lower() not in skip:
        print(f"{name}=={version}")
PY
  pip_ download -q --no-deps -d "$wheelhouse" -r "$pins.tmp"
  pip_ download -q -d "$wheelhouse" hatchling editables
  mv "$pins.tmp" "$pins"
fi
editables=()
for package in "${ours[@]}"; do editables+=(-e "$package"); done
say "installing from the wheelhouse"
pip_ install -q --no-deps --no-index --find-links "$wheelhouse" -r "$pins" "${editables[@]}"
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
echo "$profile $stamp_src" > "$venv/.cwtrain-stamp"
packages=$("$venv/bin/python" -m pip list --format=freeze 2>/dev/null | wc -l)
if [ "$ignored_locations" -gt 0 ]; then
  say "($ignored_locations pip warnings about configured index locations with nothing for a package were left out)"
fi
say "$venv ready ($profile set, $packages packages) in $(( $(date +%s) - started )) s"
