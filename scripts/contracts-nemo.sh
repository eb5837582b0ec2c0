#!/usr/bin/env bash
# The NeMo-RL and NeMo Gym real-code contract suite (tests/contracts/test_nemo_rl_real.py and
# test_gym_real.py): cwtrain's entry points against the real NeMo-RL v0.7.0 and the real NeMo Gym,
# end to end on cwtrain-local. Not part of CI (see docs/nemo-rl.md, "Tested against"). One command:
#
#   CWTRAIN_NEMO_RL_SRC=/path/to/RL CWTRAIN_NEMO_RL_PYTHON=/path/to/venv/bin/python bash scripts/contracts-nemo.sh
#
# CWTRAIN_NEMO_RL_SRC     a NeMo-RL v0.7.0 checkout with its Automodel submodule (git submodule update --init)
# CWTRAIN_NEMO_RL_PYTHON  a virtual environment's python (3.13) with NeMo-RL's dependencies (torch, ray,
#                         transformers, ... as its pyproject.toml lists them, plus Automodel's) and pytest,
#                         moto[server], httpx, boto3, zstandard, safetensors, PyYAML (cwtrain's). cwtrain
#                         itself comes from this checkout through PYTHONPATH, never from a package index.
# CWTRAIN_GYM_VERSIONS    the NeMo Gym releases test_gym_real.py runs against (default "0.6.0 0.7.0")
# CWTRAIN_GYM_PYTHON      a Python 3.13 for the Gym environments (default python3.13 on PATH)
# CWTRAIN_CONTRACTS_DIR   where the Gym environments are kept between runs (default ~/.cache/cwtrain-contracts)
#
# The environments this script creates from the package index: one per Gym release (nemo-gym plus
# math-verify, for Gym's math servers), and NeMo-RL's Gym actor environment: CWTRAIN_NEMO_RL_PYTHON's
# packages plus nemo-gym 0.4.0, the Gym NeMo-RL v0.7.0 pins. Gym 0.5 and later declare Python >= 3.13.14:
# on an older 3.13 they install with pip's --ignore-requires-python and run. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${CWTRAIN_NEMO_RL_SRC:?set it to a NeMo-RL v0.7.0 checkout with its Automodel submodule}"
: "${CWTRAIN_NEMO_RL_PYTHON:?set it to a python with the dependencies of NeMo-RL and pytest}"
versions=${CWTRAIN_GYM_VERSIONS:-0.6.0 0.7.0}
gym_python=${CWTRAIN_GYM_PYTHON:-python3.13}
cache=${CWTRAIN_CONTRACTS_DIR:-$HOME/.cache/cwtrain-contracts}
mkdir -p "$cache"

gym_venv() { # gym_venv DIR VERSION [BASE_SITE_PACKAGES]: a venv with nemo-gym VERSION (on top of BASE)
  local dir=$1 version=$2 base=${3:-}
  if [[ ! -x "$dir/bin/gym" ]]; then
    echo "== creating $dir (nemo-gym $version)" >&2
    rm -rf "$dir"
    "$gym_python" -m venv "$dir"
    if [[ -n "$base" ]]; then # reuse NeMo-RL's packages: a .pth after the venv's own site-packages
      local site
      site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
      echo "$base" >"$site/zz-cwtrain-contracts-base.pth"
    fi
    "$dir/bin/python" -m pip install --quiet --ignore-requires-python "nemo-gym==$version" "math-verify==0.8.0"
  fi
}

nemo_rl_site=$("$CWTRAIN_NEMO_RL_PYTHON" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
gym_venv "$cache/nemo-rl-gym-0.4.0" 0.4.0 "$nemo_rl_site"
for version in $versions; do gym_venv "$cache/gym-$version" "$version"; done

# cwtrain's code comes from this checkout's sources (every package: the folder's conftest loads cwtrain-slime
# too). Its entry points (the `gym` and `local` CLI groups, the plug-ins) need installed distributions: the six
# packages are installed from their paths here (never from an index) into a folder after the sources, which
# only their metadata is read from.
meta="$cache/cwtrain-metadata"
rm -rf "$meta"
"$CWTRAIN_NEMO_RL_PYTHON" -m pip install --quiet --no-deps --target "$meta" ./packages/cwtrain-core ./packages/cwtrain-local \
  ./packages/cwtrain-slime ./packages/cwtrain-miles ./packages/cwtrain-nemo-rl ./packages/cwtrain-gym
PYTHONPATH=$(printf '%s:' "$PWD"/packages/*/src)
export PYTHONPATH="${PYTHONPATH}$meta"
export CWTRAIN_NEMO_RL_SRC
status=0
echo "== NeMo-RL v0.7.0 ($CWTRAIN_NEMO_RL_SRC), its Gym actor on nemo-gym 0.4.0" >&2
CWTRAIN_NEMO_GYM_PYTHON="$cache/nemo-rl-gym-0.4.0/bin/python" \
  "$CWTRAIN_NEMO_RL_PYTHON" -m pytest tests/contracts/test_nemo_rl_real.py -p no:cacheprovider -rs "$@" || status=1
for version in $versions; do
  echo "== NeMo Gym $version" >&2
  CWTRAIN_GYM_VENV="$cache/gym-$version" \
    "$CWTRAIN_NEMO_RL_PYTHON" -m pytest tests/contracts/test_gym_real.py -p no:cacheprovider -rs "$@" || status=1
done
exit $status
