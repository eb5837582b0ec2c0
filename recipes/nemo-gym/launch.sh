#!/usr/bin/env bash
# cwtrain recipe launcher: a scored NeMo Gym evaluation against a temporary deployment.
#
# Runs in a plain Python 3.13 image (job.yaml) with the cwtrain-gym-launch ConfigMap at
# /opt/cwtrain (this script and deployment.json). Steps:
#   1. install cwtrain-gym and NeMo Gym (checked out at GYM_REF, so the benchmark
#      configs' relative paths resolve from its root)
#   2. prepare the benchmark's data (`gym eval prepare --benchmark GYM_BENCHMARK`)
#   3. `cwtrain gym eval`: create the deployment of deployment.json (placeholders are
#      refused), wait until READY, run Gym against its endpoint, print the scores as
#      JSON on stdout, delete the deployment whatever happens
set -euo pipefail

log() { printf '[cwtrain-gym %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
fail() {
  log "error: $*"
  exit 1
}

[[ -n "${COREWEAVE_API_TOKEN:-}" ]] || fail "COREWEAVE_API_TOKEN is empty: create the cwtrain-api-token Secret (README step 3)"
WORK_DIR=${WORK_DIR:-/work}
GYM_DIR="$WORK_DIR/gym"
mkdir -p "$WORK_DIR/results"

if [[ "${CWTRAIN_GIT:-}" =~ \<[A-Za-z][^\<\>]*\> ]] || [[ -z "${CWTRAIN_GIT:-}" ]]; then
  fail "CWTRAIN_GIT is '${CWTRAIN_GIT:-}': set it to cwtrain's repository in the cwtrain-gym-config ConfigMap"
fi
log "installing ${CWTRAIN_PACKAGES} from ${CWTRAIN_GIT} and NeMo Gym ${GYM_REF}"
cwtrain_reqs=()
for package in $CWTRAIN_PACKAGES; do cwtrain_reqs+=("$package @ ${CWTRAIN_GIT}#subdirectory=packages/$package"); done
python -m pip install --no-cache-dir --quiet "uv" "${cwtrain_reqs[@]}"
if [[ ! -d "$GYM_DIR/.git" ]]; then
  git clone --quiet --depth 1 --branch "$GYM_REF" "$GYM_REPO" "$GYM_DIR"
fi
python -m pip install --no-cache-dir --quiet -e "$GYM_DIR"

cd "$GYM_DIR"
log "preparing ${GYM_BENCHMARK}"
gym eval prepare --benchmark "$GYM_BENCHMARK"
[[ -f "$GYM_INPUT" ]] || fail "the prepared input $GYM_INPUT does not exist; set GYM_INPUT"

log "evaluating (the deployment is deleted afterwards)"
# exec: cwtrain becomes PID 1 and gets the Job's SIGTERM, so it can delete the deployment
exec cwtrain gym eval \
  --request /opt/cwtrain/deployment.json \
  --config "$GYM_CONFIG" \
  --input "$GYM_INPUT" \
  --output "$WORK_DIR/results/rollouts.jsonl" \
  --agent "$GYM_AGENT" \
  --num-repeats "$GYM_NUM_REPEATS" \
  --concurrency "$GYM_CONCURRENCY" \
  --timeout "$READY_TIMEOUT"
