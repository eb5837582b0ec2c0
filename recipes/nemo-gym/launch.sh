#!/usr/bin/env bash
# cwtrain recipe launcher: a scored NeMo Gym evaluation against a temporary deployment.
#
# Runs in a plain Python 3.13 image (job.yaml) with the cwtrain-gym-launch ConfigMap at
# /opt/cwtrain (this script and deployment.json). Steps:
#   1. install cwtrain-gym and NeMo Gym (GYM_VERSION, from the package index; Gym 0.5 and
#      later need Python >= 3.13.14)
#   2. prepare the benchmark's data in Gym's install root, where its built-in configs live
#      (`gym eval prepare --benchmark GYM_BENCHMARK` writes GYM_INPUT there)
#   3. `cwtrain gym eval`: create the deployment of deployment.json (placeholders are
#      refused), wait until READY, run Gym against its endpoint (the rows get their prompt
#      from GYM_PROMPT_CONFIG), print the scores as JSON on stdout (Gym's own output goes to
#      stderr), delete the deployment whatever happens
set -euo pipefail

log() { printf '[cwtrain-gym %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
fail() {
  log "error: $*"
  exit 1
}

[[ -n "${COREWEAVE_API_TOKEN:-}" ]] || fail "COREWEAVE_API_TOKEN is empty: create the cwtrain-api-token Secret (README step 3)"
WORK_DIR=${WORK_DIR:-/work}
mkdir -p "$WORK_DIR/results"

if [[ "${CWTRAIN_GIT:-}" =~ \<[A-Za-z][^\<\>]*\> ]] || [[ -z "${CWTRAIN_GIT:-}" ]]; then
  fail "CWTRAIN_GIT is '${CWTRAIN_GIT:-}': set it to cwtrain's repository in the cwtrain-gym-config ConfigMap"
fi
python -c 'import sys; sys.exit(sys.version_info < (3, 13, 14))' ||
  fail "NeMo Gym ${GYM_VERSION} needs Python >= 3.13.14, this image has $(python -V 2>&1): use a newer python:3.13 image"
log "installing ${CWTRAIN_PACKAGES} from ${CWTRAIN_GIT} and NeMo Gym ${GYM_VERSION}"
cwtrain_reqs=()
for package in $CWTRAIN_PACKAGES; do cwtrain_reqs+=("$package @ ${CWTRAIN_GIT}#subdirectory=packages/$package"); done
python -m pip install --no-cache-dir --quiet "uv" "nemo-gym==${GYM_VERSION}" "${cwtrain_reqs[@]}"

# Gym's benchmarks, prompts and server configs are installed beside its nemo_gym package
GYM_ROOT=$(python -c 'import os, nemo_gym; print(os.path.dirname(os.path.dirname(os.path.abspath(nemo_gym.__file__))))')
cd "$GYM_ROOT"
log "preparing ${GYM_BENCHMARK} in ${GYM_ROOT}"
gym eval prepare --benchmark "$GYM_BENCHMARK" >&2
[[ -f "$GYM_INPUT" ]] || fail "gym eval prepare did not write $GYM_INPUT; set GYM_INPUT to the file it wrote"

log "evaluating (the deployment is deleted afterwards)"
# exec: cwtrain becomes PID 1 and gets the Job's SIGTERM, so it can delete the deployment
exec cwtrain gym eval \
  --request /opt/cwtrain/deployment.json \
  --config "$GYM_CONFIG" \
  --input "$GYM_INPUT" \
  --prompt-config "$GYM_PROMPT_CONFIG" \
  --output "$WORK_DIR/results/rollouts.jsonl" \
  --agent "$GYM_AGENT" \
  --num-repeats "$GYM_NUM_REPEATS" \
  --concurrency "$GYM_CONCURRENCY" \
  --timeout "$READY_TIMEOUT"
