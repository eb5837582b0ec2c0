"""The NeMo-RL recipe's driver on a machine without GPUs (run by test_nemo_rl_real.py in a child process).

Runs ``recipes/nemo-rl/run_grpo_coreweave.py`` unchanged, with its arguments, after two
substitutions a GPU-less machine needs, and nothing else:

- NeMo-RL's ``init_ray`` starts a private local Ray instance that declares one GPU (NeMo-RL's
  placement groups ask for GPU bundles; nothing here uses a GPU), instead of attaching to any
  Ray instance already on the machine;
- NeMo-RL's ``Policy`` is :class:`cpu_policy.CpuPolicy`, the tiny model trained on the CPU.

Everything else is real: NeMo-RL's patched ``grpo.setup`` and ``grpo_train``, its NeMo Gym
example script, its ``NemoGym`` actor (in the environment NeMo-RL's venv lookup finds),
Gym's servers, cwtrain's generation, model_server endpoint, synchronizer and run logger.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RECIPE_DRIVER = HERE.parents[1] / "recipes" / "nemo-rl" / "run_grpo_coreweave.py"


def _private_ray(log_dir: Any = None) -> None:
    import ray

    if not ray.is_initialized():
        ray.init(
            num_cpus=int(os.environ.get("CWTRAIN_CONTRACT_RAY_CPUS", "6")),
            num_gpus=1,
            include_dashboard=False,
            runtime_env={"env_vars": dict(os.environ)},
        )
        # NeMo-RL's memory tracker looks Ray up by address: name ours (other Ray instances may run here)
        os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address


def main() -> None:
    import nemo_rl.distributed.virtual_cluster as virtual_cluster
    import nemo_rl.models.policy.lm_policy as lm_policy

    sys.path.insert(0, str(HERE))
    from cpu_policy import CpuPolicy

    virtual_cluster.init_ray = _private_ray
    lm_policy.Policy = CpuPolicy  # type: ignore[misc]
    sys.argv = [str(RECIPE_DRIVER), *sys.argv[1:]]
    runpy.run_path(str(RECIPE_DRIVER), run_name="__main__")


if __name__ == "__main__":
    main()
