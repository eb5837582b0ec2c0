#!/usr/bin/env bash
# The main job, with all set-up: creates .venv-3.12 with what the demo imports (cwtrain-core[torch]
# and cwtrain-local from their paths; scripts/test.sh adds the rest), then runs
# `cwtrain demo`: the local stack, a 2-replica hot-load deployment, and a GRPO run whose
# weights are hot-loaded after every step. Extra arguments go to `cwtrain demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
version="${CWTRAIN_DEMO_PYTHON:-3.12}"
bash scripts/setup-venv.sh "$version" --demo
exec ".venv-$version/bin/cwtrain" demo "$@"
