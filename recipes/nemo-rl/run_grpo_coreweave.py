"""Driver of the NeMo-RL recipe: NeMo-RL v0.7.0 GRPO with cwtrain's ``coreweave`` backend.

``launch.sh`` runs it on the Ray head after ``python -m cwtrain.integrations.nemo_rl.patch``
patched a copy of NeMo-RL::

    python run_grpo_coreweave.py --config grpo-coreweave.yaml [hydra overrides ...]

Before NeMo-RL's own ``examples/run_grpo.py`` runs (unchanged, through :mod:`runpy`),
:func:`cwtrain.integrations.nemo_rl.install` registers cwtrain's policy worker
(``CWTRAIN_POLICY_WORKER``, default the DTensor worker), wraps ``grpo.setup`` so the
policy is built with that worker and the generation gets a ``HotLoadWeightSynchronizer``
seeded from ``policy.model_name``, and rebinds ``grpo.refit_policy_generation`` so a
``CoreWeaveGeneration`` syncs weights by hot-load.
"""

from __future__ import annotations

import os
import runpy
import sys


def main() -> None:
    """Install cwtrain's rebindings, then run NeMo-RL's ``examples/run_grpo.py`` with this process's arguments."""
    from cwtrain.integrations.nemo_rl import DTENSOR_WORKER_FQN, install

    install(os.environ.get("CWTRAIN_POLICY_WORKER") or DTENSOR_WORKER_FQN)
    script = os.path.join(os.environ.get("NEMO_RL_DIR", "/opt/nemo-rl"), "examples", "run_grpo.py")
    sys.argv[0] = script
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
