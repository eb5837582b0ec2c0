"""Publishing metrics in the run's own logger, through the framework's logging module.

slime discards what a post-write hook returns, so the process that published hands its
``hotload/*`` metrics to the framework's logging function itself (:func:`log_metrics`; the
hooks and the live-tensor actor call it). Which module and which call is the namespace's
:class:`~cwtrain.integrations.slime.dialect.Dialect`: for slime,
``slime.observability.logging_utils.log`` (``slime.utils.logging_utils.log`` up to v0.3.1),
which writes to wandb (``--use-wandb``) and TensorBoard (``--use-tensorboard``); a fork's
plug-in registers its own (its tracking module, every backend its run enabled).

Each record carries its own step, ``hotload/step`` (the weight version), so it never
disturbs the framework's ``rollout/step``; with wandb the ``hotload/*`` metrics are plotted
against it and the served identity is kept in the run summary as
``hotload/served_identity``. A process with no tracker of its own (rank 0 is not the logging
rank when pipeline parallelism is above 1) joins the run as a secondary writer through the
framework's own ``init_tracking(args, primary=False)``, as slime's train ranks do.
Logging never fails a publish: an error is logged once and the record dropped.

The record is core's :meth:`~cwtrain.hotload.PublishOutcome.metrics` (every ``hotload/*``
name has one meaning for every publisher, documented there), plus ``hotload/step``: the
record's step, the version (0 = the baseline).
"""

from __future__ import annotations

import argparse
import importlib
import logging
from collections.abc import Mapping
from types import ModuleType

from cwtrain.hotload import version_identity

from .dialect import Dialect, dialect_of

__all__ = ["IDENTITY_KEY", "STEP_KEY", "log_metrics"]

log = logging.getLogger(__name__)

STEP_KEY = "hotload/step"
"""The step of every ``hotload/*`` record: the weight version."""

IDENTITY_KEY = "hotload/served_identity"
"""The wandb summary key of the identity the replicas serve."""

_warned = False


def _module(names: tuple[str, ...]) -> ModuleType | None:
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


def log_metrics(
    args: argparse.Namespace,
    metrics: Mapping[str, float] | None,
    *,
    run_id: str | None = None,
    dialect: Dialect | None = None,
) -> bool:
    """Hand one publish's ``hotload/*`` metrics to the run's logger (see the module docstring).

    Args:
        args: the framework's namespace (which backends; which framework, unless ``dialect``).
        metrics: what the publish returned; needs ``hotload/version``.
        run_id: the run id, to name the served identity in the wandb summary.
        dialect: the framework's dialect (default: :func:`~cwtrain.integrations.slime.dialect.dialect_of` ``args``).

    Returns:
        Whether a framework logging function took the record (``False`` outside the
        framework, or when logging failed).
    """
    global _warned
    if not metrics or "hotload/version" not in metrics:
        return False
    record = {key: float(value) for key, value in metrics.items()}
    record[STEP_KEY] = record["hotload/version"]
    served = record.get("hotload/served_version")
    identity = version_identity(run_id, int(served)) if run_id and served is not None and served >= 0 else None
    dialect = dialect if dialect is not None else dialect_of(args)
    module = _module(dialect.logging_modules)
    if module is None:
        log.debug("no %s logging module in this process; hotload metrics not logged", dialect.name)
        return False
    try:
        run = dialect.log(module, args, record, STEP_KEY)
        if run is not None and identity is not None:
            run.summary[IDENTITY_KEY] = identity
    except Exception as exc:  # never fail a publish because of its metrics
        if not _warned:
            _warned = True
            log.warning("could not log hotload metrics through %s: %s", module.__name__, exc)
        return False
    return True
