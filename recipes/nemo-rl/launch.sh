#!/usr/bin/env bash
# cwtrain recipe launcher: NeMo-RL v0.7.0 GRPO on DAPO-Math-17k with the `coreweave`
# generation backend (rollouts from a CoreWeave Dedicated Inference deployment,
# weights published by checkpoint hot-load).
#
# The RayJob's entrypoint, run on the Ray head (nvcr.io/nvidia/nemo-rl:v0.7.0) with
# the cwtrain-nemo-rl-launch ConfigMap at /opt/cwtrain. Settings come from the
# cwtrain-nemo-rl-config ConfigMap and the cwtrain-api-token Secret. Steps:
#   1. refuse settings that still hold a <placeholder>
#   2. check the snapshot prefix is writable (preflight; cwtrain was installed by the
#      pod's init container)
#   3. fetch the base model to the shared volume (DAPO-Math-17k is fetched by NeMo-RL's
#      DAPOMath17K dataset itself)
#   4. check and apply the recipe's patch (the `coreweave` branch of grpo.setup) to the
#      image's NeMo-RL in place: NeMo-RL finds its project, 3rdparty/ and the prebuilt
#      worker environments from where nemo_rl is imported, so it is not copied anywhere
#   5. run run_grpo_coreweave.py (NeMo-RL's run_grpo.py, or its NeMo Gym script when
#      env.should_use_nemo_gym is set, with cwtrain's workers, weight synchronizer, refit
#      and run logger), passing this script's arguments as Hydra overrides
set -euo pipefail

log() { printf '[cwtrain-nemo-rl %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
fail() {
  log "error: $*"
  exit 1
}

# ---------------------------------------------------------------- 1. settings
for name in CWTRAIN_HOTLOAD_DEPLOYMENT_ID CWTRAIN_ROLLOUT_BASE_URL CWTRAIN_ROLLOUT_MODEL AWS_REGION; do
  value="${!name:-}"
  [[ -n "$value" ]] || fail "$name is empty: set it in the cwtrain-nemo-rl-config ConfigMap"
  if [[ "$value" =~ \<[A-Za-z][^\<\>]*\> ]]; then
    fail "$name is still '$value': fill it in the cwtrain-nemo-rl-config ConfigMap"
  fi
done
[[ -n "${COREWEAVE_API_TOKEN:-}" ]] || fail "COREWEAVE_API_TOKEN is empty: create the cwtrain-api-token Secret (README step 4)"

SHARED_DIR=${SHARED_DIR:-/shared}
export NEMO_RL_DIR=${NEMO_RL_DIR:-/opt/nemo-rl} # the driver resolves the config's defaults: there
mkdir -p "$SHARED_DIR" "$CWTRAIN_HOTLOAD_STATE_DIR"

# ---------------------------------------------------------------- 2. cwtrain
python -c "import cwtrain.integrations.nemo_rl" ||
  fail "cwtrain's NeMo-RL integration is not importable: check the install-cwtrain init container (CWTRAIN_GIT, CWTRAIN_PACKAGES)"
log "checking that the trainer can list, read and write the snapshot prefix"
python -m cwtrain.integrations.preflight

# ---------------------------------------------------------------- 3. model
if [[ "$BASE_MODEL" == s3://* ]]; then # a copy in the bucket (the trainer may read under hotload/)
  python -m cwtrain.integrations.launch stage-model "$BASE_MODEL" "$SHARED_DIR/hf/base"
elif [[ ! -f "$SHARED_DIR/hf/base/config.json" ]]; then
  log "fetching ${BASE_MODEL}"
  python - <<'PY'
import os

from huggingface_hub import snapshot_download

shared = os.environ.get("SHARED_DIR", "/shared")
snapshot_download(os.environ["BASE_MODEL"], local_dir=f"{shared}/hf/base")
PY
fi

# ---------------------------------------------------------------- 4. patch NeMo-RL in place
# the patch ships in cwtrain-nemo-rl; the helper refuses a NeMo-RL other than v0.7.0 and says
# "already applied" after a restart of this container
log "patching NeMo-RL (${NEMO_RL_DIR}) with the coreweave backend"
python -m cwtrain.integrations.nemo_rl.patch --root "$NEMO_RL_DIR" >&2 ||
  fail "the coreweave patch does not apply to ${NEMO_RL_DIR} (it was written against NeMo-RL v0.7.0); see README 'Patch'"

# ---------------------------------------------------------------- 5. train
log "training (snapshots s3://<bucket>/hotload/${CWTRAIN_HOTLOAD_RUN_ID}-v*)"
cd "$NEMO_RL_DIR"
exec python /opt/cwtrain/run_grpo_coreweave.py --config /opt/cwtrain/grpo-coreweave.yaml "$@"
