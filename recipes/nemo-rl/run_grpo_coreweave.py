"""Driver of the NeMo-RL recipe: NeMo-RL v0.7.0 GRPO with cwtrain's ``coreweave`` backend.

``launch.sh`` runs it on the Ray head after ``python -m cwtrain.integrations.nemo_rl.patch``
patched NeMo-RL in place::

    python run_grpo_coreweave.py --config grpo-coreweave.yaml [hydra overrides ...]

Before NeMo-RL's own script runs (unchanged, through :mod:`runpy`),
:func:`cwtrain.integrations.nemo_rl.install` registers cwtrain's policy worker
(``CWTRAIN_POLICY_WORKER``, default the DTensor worker) with the prebuilt environment of the
NeMo-RL worker it extends, wraps ``grpo.setup`` so the policy is built with that worker, the
generation gets a ``HotLoadWeightSynchronizer`` seeded from ``policy.model_name`` and the run's
logger writes the ``hotload/*`` metrics, and rebinds ``grpo.refit_policy_generation`` so a
``CoreWeaveGeneration`` syncs weights by hot-load. The script is ``examples/run_grpo.py``, or
``examples/nemo_gym/run_grpo_nemo_gym.py`` when the configuration sets
``env.should_use_nemo_gym: true`` (NeMo Gym environments; it binds the Gym actor as the
``nemo_gym`` task's environment).
"""

from __future__ import annotations

import os
import runpy
import sys


def uses_nemo_gym(argv: list[str]) -> bool:
    """Whether the configuration (``--config`` plus Hydra overrides, as NeMo-RL loads them) enables NeMo Gym."""
    from nemo_rl.utils.config import load_config, parse_hydra_overrides
    from omegaconf import OmegaConf

    args = list(argv)
    path = None
    if "--config" in args:
        at = args.index("--config")
        path = args[at + 1]
        del args[at : at + 2]
    else:
        path = next((a.split("=", 1)[1] for a in args if a.startswith("--config=")), None)
        args = [a for a in args if not a.startswith("--config=")]
    if path is None:
        return False
    config = load_config(path)
    if args:
        config = parse_hydra_overrides(config, args)
    return bool(OmegaConf.select(config, "env.should_use_nemo_gym", default=False))


def main() -> None:
    """Install cwtrain's rebindings, then run NeMo-RL's GRPO script with this process's arguments."""
    from cwtrain.integrations.nemo_rl import DTENSOR_WORKER_FQN, install

    install(os.environ.get("CWTRAIN_POLICY_WORKER") or DTENSOR_WORKER_FQN)
    examples = os.path.join(os.environ.get("NEMO_RL_DIR", "/opt/nemo-rl"), "examples")
    gym = uses_nemo_gym(sys.argv[1:])
    script = (
        os.path.join(examples, "nemo_gym", "run_grpo_nemo_gym.py") if gym else os.path.join(examples, "run_grpo.py")
    )
    sys.argv[0] = script
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
