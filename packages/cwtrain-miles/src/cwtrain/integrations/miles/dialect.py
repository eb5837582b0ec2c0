"""miles' words where they differ from slime's: :data:`MILES_DIALECT`, for slime's hooks.

miles is slime's fork: the same argument namespace, post-write hook call and delta format,
so ``cwtrain.integrations.miles.hook``, ``actor_hook`` and ``init_hook`` are slime's very
functions. What differs is this :class:`~cwtrain.integrations.slime.Dialect`, declared in the
``cwtrain.slime.dialects`` entry-point group of this package's ``pyproject.toml``, so slime's
hooks pick it for a miles namespace (``cwtrain.integrations.slime.hook`` serves a miles run
too, with this package installed):

* a miles namespace has ``--update-weight-transfer-mode`` (slime's has
  ``--update-weight-mode``);
* the gloo group the other ranks wait in is ``miles.utils.distributed_utils``';
* the ``hotload/*`` metrics go through ``miles.utils.tracking_utils.tracking.log``, which
  writes to every backend the run enabled (wandb, TensorBoard, MLflow, ...); a process with
  no backend joins the run through miles' ``init_tracking(args, primary=False)``, as miles'
  train ranks do, and the step ``hotload/step`` is declared once per process through
  ``define_step_key_metric_group``;
* ``--update-weight-transfer-mode disk-delta`` selects the delta updater.

The post-save hook passes :data:`MILES_DIALECT` to ``log_metrics`` itself.
"""

from __future__ import annotations

import argparse
import sys
import threading
from types import ModuleType
from typing import Any

from cwtrain.integrations.slime import Dialect

__all__ = ["MILES_DIALECT", "is_miles_namespace", "log_to_tracking"]

_lock = threading.Lock()


def is_miles_namespace(args: argparse.Namespace) -> bool:
    """Whether ``args`` is miles' namespace: it has ``--update-weight-transfer-mode``."""
    return hasattr(args, "update_weight_transfer_mode")


def log_to_tracking(module: ModuleType, args: argparse.Namespace, record: dict[str, float], step_key: str) -> Any:
    """Hand one ``hotload/*`` record to miles' tracking ``module``; returns the wandb run, if any."""
    backends = getattr(getattr(module, "_manager", None), "_backends", None)
    if backends is not None and not backends:
        module.init_tracking(args, primary=False)  # join the run as miles' train ranks do
    with _lock:
        if not getattr(module, "_cwtrain_hotload_step", False):  # once per process's tracking module
            module.define_step_key_metric_group("hotload", step_key)
            setattr(module, "_cwtrain_hotload_step", True)  # noqa: B010 - a marker on miles' module
    module.log(args, record, step_key=step_key)
    wandb = sys.modules.get("wandb")
    return getattr(wandb, "run", None) if wandb is not None else None


def _disk_delta(args: argparse.Namespace) -> bool:
    return getattr(args, "update_weight_transfer_mode", None) == "disk-delta"


MILES_DIALECT = Dialect(
    name="miles",
    matches=is_miles_namespace,
    gloo_modules=("miles.utils.distributed_utils",),
    logging_modules=("miles.utils.tracking_utils.tracking",),
    log=log_to_tracking,
    delta_mode=_disk_delta,  # --update-weight-transfer-mode disk-delta
    hook_paths=("cwtrain.integrations.miles.hook", "cwtrain.integrations.miles.actor_hook"),
    rollout_log_modules=("miles.backends.megatron_utils.actor",),
)
"""miles' dialect of slime's namespace (see the module docstring)."""
