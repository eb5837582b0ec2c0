#!/usr/bin/env bash
# The real-code contract suite (tests/contracts): cwtrain's slime and miles entry points
# against the frameworks' own parsers, loaders, weight updaters and rollout managers, on CPU.
#
#   scripts/contracts.sh --setup     # once: build .venv-contracts and fetch the pinned trees (needs network)
#   scripts/contracts.sh             # one pytest run per framework tree; extra arguments go to pytest
#
# Variables (defaults: what --setup put under .venv-contracts/):
#   CWTRAIN_CONTRACT_PYTHON  an interpreter with tests/contracts/requirements.txt
#   CWTRAIN_SLIME_SRCS       slime checkouts, space separated (default: 624b824 and v0.3.1)
#   CWTRAIN_SLIME_MEGATRON   the Megatron-LM tree slime's image pins (docker/Dockerfile MEGATRON_COMMIT)
#   CWTRAIN_SLIME_SGLANG     a folder with sglang's package at the version slime's image pins
#                            (pip install --no-deps --target DIR sglang==0.5.15.post1)
#   CWTRAIN_MILES_SRCS, CWTRAIN_MILES_MEGATRON, CWTRAIN_MILES_SGLANG   the same for miles
#                            (31f1ca9 and v0.1.0; radixark/Megatron-LM 37f9161; sglang 0.5.16)
# Set a *_SRCS variable to "" to leave that framework out. cwtrain comes from this checkout
# by PYTHONPATH, never from a package index. Exit status: 0 when every run passed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
base="$root/.venv-contracts"

SLIME_REPO=https://github.com/THUDM/slime.git
MILES_REPO=https://github.com/radixark/miles.git
SLIME_MEGATRON=(https://github.com/NVIDIA/Megatron-LM.git 1dcf0dafa884ad52ffb243625717a3471643e087)
MILES_MEGATRON=(https://github.com/radixark/Megatron-LM.git 37f91617b95c1ef4f01fc66210e502572ad97fda)

checkout() { # URL REF DIR
  [ -d "$3/.git" ] && return 0
  git clone --quiet "$1" "$3"
  git -C "$3" checkout --quiet "$2"
}

if [ "${1:-}" = "--setup" ]; then
  python=${CWTRAIN_PYTHON312:-python3.12}
  "$python" -m venv "$base"
  "$base/bin/python" -m pip install --quiet -U pip
  "$base/bin/python" -m pip install --quiet -r tests/contracts/requirements.txt
  "$base/bin/python" -m pip install --quiet --no-deps --target "$base/site/sglang-slime" sglang==0.5.15.post1
  "$base/bin/python" -m pip install --quiet --no-deps --target "$base/site/sglang-miles" sglang==0.5.16
  mkdir -p "$base/src"
  checkout "$SLIME_REPO" 624b824 "$base/src/slime-624b824"
  checkout "$SLIME_REPO" v0.3.1 "$base/src/slime-v0.3.1"
  checkout "$MILES_REPO" 31f1ca9 "$base/src/miles-31f1ca9"
  checkout "$MILES_REPO" v0.1.0 "$base/src/miles-v0.1.0"
  checkout "${SLIME_MEGATRON[@]}" "$base/src/megatron-slime"
  checkout "${MILES_MEGATRON[@]}" "$base/src/megatron-miles"
  echo "set up $base; now run scripts/contracts.sh" >&2
  exit 0
fi

python=${CWTRAIN_CONTRACT_PYTHON:-$base/bin/python}
[ -x "$python" ] || { echo "error: no $python: run scripts/contracts.sh --setup or set CWTRAIN_CONTRACT_PYTHON" >&2; exit 2; }
cwtrain_path=$(printf '%s:' "$root"/packages/*/src)
# cwtrain's code comes from this checkout's sources. Its entry points (a fork's slime dialect, the
# frameworks' records, the CLI groups) need installed distributions: the six packages are installed
# from their paths (never from an index) into a folder after the sources, which only their metadata
# is read from.
meta=$(mktemp -d)
trap 'rm -rf "$meta"' EXIT
"$python" -m pip install --quiet --no-deps --target "$meta" ./packages/cwtrain-core ./packages/cwtrain-local \
  ./packages/cwtrain-slime ./packages/cwtrain-miles ./packages/cwtrain-nemo-rl ./packages/cwtrain-gym
cwtrain_path="$cwtrain_path$meta"

run() { # FRAMEWORK TREE MEGATRON SGLANG [pytest args]
  local framework=$1 tree=$2 megatron=$3 sglang=$4 variable commit
  shift 4
  variable="CWTRAIN_$(echo "$framework" | tr '[:lower:]' '[:upper:]')_SRC"
  commit=$(git -C "$tree" rev-parse --short=9 HEAD 2>/dev/null || basename "$tree")
  echo "== $framework $commit ($tree)" >&2
  # each run holds one framework's suite (the NeMo-RL and Gym suites are scripts/contracts-nemo.sh's)
  if env -u CWTRAIN_SLIME_SRC -u CWTRAIN_MILES_SRC -u CWTRAIN_NEMO_RL_SRC -u CWTRAIN_GYM_VENV -u CUDA_DEVICE_MAX_CONNECTIONS \
      "$variable=$tree" CWTRAIN_CONTRACT_STRICT=1 PYTHONPATH="$tree:$megatron:$sglang:$cwtrain_path" \
      "$python" -m pytest tests/contracts -p no:cacheprovider -q "$@"; then
    results+=("passed: $framework $commit")
  else
    results+=("FAILED: $framework $commit")
    status=1
  fi
}

status=0
results=()
for tree in ${CWTRAIN_SLIME_SRCS-"$base/src/slime-624b824 $base/src/slime-v0.3.1"}; do
  run slime "$tree" "${CWTRAIN_SLIME_MEGATRON:-$base/src/megatron-slime}" \
    "${CWTRAIN_SLIME_SGLANG:-$base/site/sglang-slime}" "$@"
done
for tree in ${CWTRAIN_MILES_SRCS-"$base/src/miles-31f1ca9 $base/src/miles-v0.1.0"}; do
  run miles "$tree" "${CWTRAIN_MILES_MEGATRON:-$base/src/megatron-miles}" \
    "${CWTRAIN_MILES_SGLANG:-$base/site/sglang-miles}" "$@"
done
printf '%s\n' "${results[@]}" >&2
exit $status
