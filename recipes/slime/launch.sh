#!/usr/bin/env bash
# cwtrain recipe launcher: GRPO on Qwen3-4B with slime, rollouts from a CoreWeave
# Dedicated Inference deployment, weights published by checkpoint hot-load.
#
# Runs inside the slimerl/slime image (job.yaml mounts it from the
# cwtrain-slime-launch ConfigMap, the patch from cwtrain-slime-patches). Settings
# come from the cwtrain-slime-config ConfigMap and the cwtrain-api-token Secret as
# environment variables. Steps:
#   1. refuse settings that still hold a <placeholder>
#   2. check out slime at SLIME_COMMIT, check and apply the recipe's patch
#      (--update-weight-standalone-publish: without local engines slime would skip
#      every weight update, so nothing would be published), install it
#   3. install cwtrain, check the snapshot prefix is writable (preflight)
#   4. fetch the base model and DAPO-Math-17k, convert the model for Megatron
#   5. start Ray on this node (secrets reach its workers through the environment,
#      never a command line) and run slime's synchronous train.py
# CWTRAIN_DRY_RUN=1 stops after the settings check and prints the training command as JSON
# ({"script", "argv", "runtime_env"}) instead: nothing is cloned, installed, fetched or
# started; FRAMEWORK_DIR must then hold a slime checkout (its model script gives the model
# flags). The contract tests run that command through slime's own argument parser.
set -euo pipefail

log() { printf '[cwtrain-slime %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
fail() {
  log "error: $*"
  exit 1
}

# ---------------------------------------------------------------- 1. settings
for name in CWTRAIN_HOTLOAD_DEPLOYMENT_ID CWTRAIN_ROLLOUT_BASE_URL CWTRAIN_ROLLOUT_MODEL AWS_REGION CWTRAIN_GIT; do
  value="${!name:-}"
  [[ -n "$value" ]] || fail "$name is empty: set it in the cwtrain-slime-config ConfigMap"
  if [[ "$value" =~ \<[A-Za-z][^\<\>]*\> ]]; then
    fail "$name is still '$value': fill it in the cwtrain-slime-config ConfigMap"
  fi
done
[[ -n "${COREWEAVE_API_TOKEN:-}" ]] || fail "COREWEAVE_API_TOKEN is empty: create the cwtrain-api-token Secret (README step 4)"

WORK_DIR=${WORK_DIR:-/work}
HF_DIR="$WORK_DIR/hf/base"
DATA_DIR="$WORK_DIR/data"
TORCH_DIST="$WORK_DIR/torch_dist"
DISK_DIR="$WORK_DIR/weights"        # slime writes each weight version here
LOCAL_DIR="$WORK_DIR/weights-local" # the updater's local checkpoint
mkdir -p "$WORK_DIR"

TRAIN_SCRIPT=train.py
FRAMEWORK_DIR="${FRAMEWORK_DIR:-$WORK_DIR/slime}"
PATCH=/opt/cwtrain/patches/slime-standalone-publish.patch
DRY_RUN="${CWTRAIN_DRY_RUN:-0}"

# ---------------------------------------------------------------- 4. model and data (a function: after step 3)
fetch_model_and_data() {
  log "fetching ${BASE_MODEL} and ${DATASET_REPO}"
  if [[ "$BASE_MODEL" == s3://* ]]; then # a copy in the bucket (the trainer may read under hotload/)
    python3 -m cwtrain.integrations.launch stage-model "$BASE_MODEL" "$HF_DIR"
  fi
  python3 - <<'PY'
import os

from huggingface_hub import snapshot_download

work = os.environ.get("WORK_DIR", "/work")
if not os.environ["BASE_MODEL"].startswith("s3://"):
    snapshot_download(os.environ["BASE_MODEL"], local_dir=f"{work}/hf/base")
snapshot_download(os.environ["DATASET_REPO"], repo_type="dataset", local_dir=f"{work}/data")
PY
  [[ -f "$DATA_DIR/$DATASET_FILE" ]] || fail "the dataset has no $DATASET_FILE; set DATASET_FILE"
}

# ---------------------------------------------------------------- 2. slime, patched
if [[ "$DRY_RUN" == 1 ]]; then
  [[ -d "$FRAMEWORK_DIR" ]] || fail "CWTRAIN_DRY_RUN=1 needs a slime checkout in FRAMEWORK_DIR ($FRAMEWORK_DIR)"
elif [[ ! -d "$FRAMEWORK_DIR/.git" ]]; then
  log "checking out slime ${SLIME_COMMIT}"
  git clone --quiet "$SLIME_REPO" "$FRAMEWORK_DIR"
  git -C "$FRAMEWORK_DIR" checkout --quiet "$SLIME_COMMIT"
  if ! git -C "$FRAMEWORK_DIR" apply --check "$PATCH"; then
    fail "the recipe patch does not apply to slime ${SLIME_COMMIT} (it was written against 624b824 / v0.3.1); see README 'Patch'"
  fi
  git -C "$FRAMEWORK_DIR" apply "$PATCH"
fi
if [[ "$DRY_RUN" != 1 ]]; then
  python3 -m pip install --no-cache-dir --quiet --no-deps -e "$FRAMEWORK_DIR"

  # -------------------------------------------------------------- 3. cwtrain
  log "installing ${CWTRAIN_PACKAGES} from ${CWTRAIN_GIT}"
  cwtrain_reqs=()
  for package in $CWTRAIN_PACKAGES; do cwtrain_reqs+=("$package @ ${CWTRAIN_GIT}#subdirectory=packages/$package"); done
  python3 -m pip install --no-cache-dir --quiet "${cwtrain_reqs[@]}"
  log "checking that the trainer can list, read and write the snapshot prefix"
  python3 -m cwtrain.integrations.preflight
  fetch_model_and_data
fi

cd "$FRAMEWORK_DIR"
# shellcheck disable=SC1091
source scripts/models/qwen3-4B.sh # defines MODEL_ARGS
if [[ "$DRY_RUN" != 1 && ! -d "$TORCH_DIST" ]]; then
  log "converting the checkpoint for Megatron"
  CUDA_DEVICE_MAX_CONNECTIONS=1 PYTHONPATH="$MEGATRON_DIR" python3 tools/convert_hf_to_torch_dist.py \
    "${MODEL_ARGS[@]}" --hf-checkpoint "$HF_DIR" --save "$TORCH_DIST"
fi

# ---------------------------------------------------------------- 5. train
export CWTRAIN_HOTLOAD_STATE_DIR="${CWTRAIN_HOTLOAD_STATE_DIR:-$DISK_DIR-hotload}"
TRAIN_ARGS=(
  "${MODEL_ARGS[@]}"
  --hf-checkpoint "$HF_DIR" --ref-load "$TORCH_DIST" --save "$WORK_DIR/ckpt" --save-interval 100
  # DAPO-Math-17k
  --prompt-data "$DATA_DIR/$DATASET_FILE" --input-key prompt --label-key label
  --apply-chat-template --rollout-shuffle --rm-type deepscaler
  # GRPO
  --num-rollout "$NUM_ROLLOUT" --rollout-batch-size "$ROLLOUT_BATCH_SIZE"
  --n-samples-per-prompt "$N_SAMPLES_PER_PROMPT" --rollout-max-response-len "$ROLLOUT_MAX_RESPONSE_LEN"
  --rollout-temperature 1 --rollout-top-p 1.0
  --global-batch-size "$((ROLLOUT_BATCH_SIZE * N_SAMPLES_PER_PROMPT))"
  --advantage-estimator grpo --use-kl-loss --kl-loss-coef 0.00 --kl-loss-type low_var_kl
  --entropy-coef 0.00 --eps-clip 0.2 --eps-clip-high 0.28
  --optimizer adam --lr 1e-6 --lr-decay-style constant --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.98
  # Megatron on this node's GPUs; no rollout GPUs: the deployment samples
  --actor-num-nodes 1 --actor-num-gpus-per-node "$TRAIN_GPUS" --rollout-num-gpus 0
  --tensor-model-parallel-size 2 --sequence-parallel --pipeline-model-parallel-size 1
  --context-parallel-size 1 --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
  --use-dynamic-batch-size --max-tokens-per-gpu 9216
  --attention-dropout 0.0 --hidden-dropout 0.0 --accumulate-allreduce-grads-in-fp32
  --attention-softmax-in-fp32 --attention-backend flash
  # NCCL and WORLD groups; the gloo group the other ranks wait in while rank 0 publishes gets
  # max(this, 2 x CWTRAIN_HOTLOAD_TIMEOUT) from cwtrain's init hook (torch's default would be 30 minutes)
  --distributed-timeout-minutes "$DISTRIBUTED_TIMEOUT_MINUTES"
  --custom-megatron-init-path cwtrain.integrations.slime.init_hook
  # cwtrain: XOR+zstd deltas with Adler-32, published by the post-write hook even with
  # no local engine (the patch's flag); rollouts from the deployment
  --update-weight-mode delta --update-weight-transport disk --update-weight-disk-dir "$DISK_DIR"
  --update-weight-local-checkpoint-dir "$LOCAL_DIR"
  --update-weight-delta-encoding xor --update-weight-delta-checksum adler32
  --update-weight-standalone-publish
  --custom-update-weight-post-write-path cwtrain.integrations.slime.hook
  --rollout-function-path cwtrain.integrations.slime.rollout.generate_rollout
)

# Megatron's argument check (run by train.py itself) needs CUDA_DEVICE_MAX_CONNECTIONS=1 with tensor
# parallelism; the runtime environment reaches the job's entrypoint and every Ray worker
RUNTIME_ENV="{\"env_vars\": {\"PYTHONPATH\": \"${MEGATRON_DIR}\", \"CUDA_DEVICE_MAX_CONNECTIONS\": \"1\"}}"
if [[ "$DRY_RUN" == 1 ]]; then
  python3 - "$TRAIN_SCRIPT" "$RUNTIME_ENV" "${TRAIN_ARGS[@]}" <<'PY'
import json
import sys

script, runtime_env, *argv = sys.argv[1:]
print(json.dumps({"script": script, "argv": argv, "runtime_env": json.loads(runtime_env)}))
PY
  exit 0
fi

log "starting Ray (${TRAIN_GPUS} GPUs)"
ray start --head --node-ip-address 127.0.0.1 --num-gpus "$TRAIN_GPUS" --disable-usage-stats
trap 'ray stop --force >/dev/null 2>&1 || true' EXIT
log "training: ${TRAIN_SCRIPT} (snapshots s3://<bucket>/hotload/${CWTRAIN_HOTLOAD_RUN_ID}-v*)"
ray job submit --address http://127.0.0.1:8265 \
  --runtime-env-json "$RUNTIME_ENV" \
  -- python3 "$TRAIN_SCRIPT" "${TRAIN_ARGS[@]}"
