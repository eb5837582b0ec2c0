"""Publishing metrics in the run's own logger: slime's or miles' tracking.

slime and miles discard what a post-write or post-save hook returns, so the process that
published hands its ``hotload/*`` metrics to the framework's logging function itself
(:func:`log_metrics`; the hooks and the live-tensor actor call it):

* slime: ``slime.observability.logging_utils.log`` (``slime.utils.logging_utils.log`` up to
  v0.3.1), which writes to wandb (``--use-wandb``) and TensorBoard (``--use-tensorboard``);
* miles: ``miles.utils.tracking_utils.tracking.log``, which writes to every backend the run
  enabled (wandb, TensorBoard, MLflow, ...).

Each record carries its own step, ``hotload/step`` (the weight version), so it never
disturbs the framework's ``rollout/step``; with wandb the ``hotload/*`` metrics are plotted
against it and the served identity is kept in the run summary as
``hotload/served_identity``. A process with no tracker of its own (rank 0 is not the logging
rank when pipeline parallelism is above 1) joins the run as a secondary writer through the
framework's own ``init_tracking(args, primary=False)``, as slime's and miles' train ranks do.
Logging never fails a publish: an error is logged once and the record dropped.

The record is core's :meth:`~cwtrain.hotload.PublishOutcome.metrics` (every ``hotload/*``
name has one meaning for every publisher, documented there), plus ``hotload/step``: the
record's step, the version (0 = the baseline).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import threading
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from cwtrain.hotload import version_identity

__all__ = ["IDENTITY_KEY", "STEP_KEY", "log_metrics"]

log = logging.getLogger(__name__)

STEP_KEY = "hotload/step"
"""The step of every ``hotload/*`` record: the weight version."""

IDENTITY_KEY = "hotload/served_identity"
"""The wandb summary key of the identity the replicas serve."""

_SLIME_LOGGING = ("slime.observability.logging_utils", "slime.utils.logging_utils")
_MILES_TRACKING = "miles.utils.tracking_utils.tracking"

_lock = threading.Lock()
_defined: set[int] = set()
_warned = False


def _module(names: tuple[str, ...]) -> ModuleType | None:
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


def _wandb_run() -> Any:
    wandb = sys.modules.get("wandb")
    return getattr(wandb, "run", None) if wandb is not None else None


def _log_slime(module: ModuleType, args: argparse.Namespace, record: dict[str, float], identity: str | None) -> None:
    use_wandb = bool(getattr(args, "use_wandb", False))
    if use_wandb and _wandb_run() is None:
        module.init_tracking(args, primary=False)  # join the run as slime's train ranks do
    run = _wandb_run()
    if use_wandb and run is None:  # no run to join (no wandb_run_id): TensorBoard only
        args = argparse.Namespace(**{**vars(args), "use_wandb": False})
    if run is not None and use_wandb:
        with _lock:
            if id(run) not in _defined:  # once per wandb run
                sys.modules["wandb"].define_metric(STEP_KEY)
                sys.modules["wandb"].define_metric("hotload/*", step_metric=STEP_KEY)
                _defined.add(id(run))
    module.log(args, record, step_key=STEP_KEY)
    if run is not None and use_wandb and identity is not None:
        run.summary[IDENTITY_KEY] = identity


def _log_miles(module: ModuleType, args: argparse.Namespace, record: dict[str, float], identity: str | None) -> None:
    backends = getattr(getattr(module, "_manager", None), "_backends", None)
    if backends is not None and not backends:
        module.init_tracking(args, primary=False)  # join the run as miles' train ranks do
    with _lock:
        if not getattr(module, "_cwtrain_hotload_step", False):  # once per process's tracking module
            module.define_step_key_metric_group("hotload", STEP_KEY)
            setattr(module, "_cwtrain_hotload_step", True)  # noqa: B010 - a marker on miles' module
    module.log(args, record, step_key=STEP_KEY)
    run = _wandb_run()
    if run is not None and identity is not None:
        run.summary[IDENTITY_KEY] = identity


def log_metrics(args: argparse.Namespace, metrics: Mapping[str, float] | None, *, run_id: str | None = None) -> bool:
    """Hand one publish's ``hotload/*`` metrics to the run's logger (see the module docstring).

    Args:
        args: slime's or miles' namespace (which framework, which backends).
        metrics: what the publish returned; needs ``hotload/version``.
        run_id: the run id, to name the served identity in the wandb summary.

    Returns:
        Whether a framework logging function took the record (``False`` outside slime and
        miles, or when logging failed).
    """
    global _warned
    if not metrics or "hotload/version" not in metrics:
        return False
    record = {key: float(value) for key, value in metrics.items()}
    record[STEP_KEY] = record["hotload/version"]
    served = record.get("hotload/served_version")
    identity = version_identity(run_id, int(served)) if run_id and served is not None and served >= 0 else None
    miles = hasattr(args, "update_weight_transfer_mode")
    module = _module((_MILES_TRACKING,)) if miles else _module(_SLIME_LOGGING)
    if module is None:
        log.debug("no %s logging module in this process; hotload metrics not logged", "miles" if miles else "slime")
        return False
    try:
        (_log_miles if miles else _log_slime)(module, args, record, identity)
    except Exception as exc:  # never fail a publish because of its metrics
        if not _warned:
            _warned = True
            log.warning("could not log hotload metrics through %s: %s", module.__name__, exc)
        return False
    return True
