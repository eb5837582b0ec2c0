"""cwtrain's metrics in the run's NeMo-RL logger (TensorBoard, W&B, MLflow, ...).

NeMo-RL's ``grpo_train`` throws away what ``refit_policy_generation`` returns, and it logs
a generation backend's ``get_logger_metrics()`` as one nested value,
``train/generation_logger_metrics``, which its TensorBoard backend skips (only scalars
are written) and W&B stores unflattened. So, for the coreweave backend, the setup wrapper
(:mod:`cwtrain.integrations.nemo_rl.refit`) hands ``grpo_train`` a :class:`RunLogger`:
NeMo-RL's ``Logger``, unchanged, except that

- metrics recorded with :meth:`RunLogger.record` (the synchronizer's ``hotload/*``) are
  written just before the next ``log_metrics`` call, at that call's step: the refit at
  the start of step ``S`` lands at ``S``, the one before the first validation at 0;
- a ``generation_logger_metrics`` dict in the logged metrics is replaced by its scalar
  entries (``coreweave/*`` keys, so ``train/coreweave/...``).

::

    run_logger = RunLogger(logger)          # logger: the Logger that grpo.setup returned
    run_logger.record({"hotload/version": 3.0})
    run_logger.log_metrics({"reward": 0.5}, step=4, prefix="train")
    # -> hotload/version at step 4, then train/reward at step 4

Every other attribute is the wrapped logger's.
"""

from __future__ import annotations

import numbers
import threading
from collections.abc import Mapping
from typing import Any

__all__ = ["GENERATION_METRICS_KEY", "RunLogger"]

#: Where ``grpo_train`` puts ``policy_generation.get_logger_metrics()`` in its step metrics.
GENERATION_METRICS_KEY = "generation_logger_metrics"


class RunLogger:
    """NeMo-RL's ``Logger`` with cwtrain's metrics written through it (see the module docs).

    Args:
        logger: the run's logger (anything with NeMo-RL's ``log_metrics`` signature).
    """

    def __init__(self, logger: Any) -> None:
        self.logger = logger
        self._pending: dict[str, float] = {}
        self._lock = threading.Lock()

    def record(self, metrics: Mapping[str, float]) -> None:
        """Keep ``metrics`` (full names, e.g. ``hotload/version``) for the next ``log_metrics`` call."""
        with self._lock:
            self._pending.update({name: float(value) for name, value in metrics.items()})

    @property
    def pending(self) -> dict[str, float]:
        """The metrics recorded and not yet written."""
        with self._lock:
            return dict(self._pending)

    def log_metrics(
        self,
        metrics: dict[str, Any],
        step: int,
        prefix: str | None = "",
        step_metric: str | None = None,
        step_finished: bool = False,
    ) -> None:
        """NeMo-RL's ``Logger.log_metrics``, after writing the pending metrics at ``step``."""
        with self._lock:
            pending, self._pending = self._pending, {}
        if pending:
            self.logger.log_metrics(pending, step, prefix="")
        self.logger.log_metrics(flatten_generation_metrics(metrics), step, prefix, step_metric, step_finished)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.logger, name)


def flatten_generation_metrics(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """``metrics`` with a nested ``generation_logger_metrics`` dict replaced by its scalar entries.

    Entries that are not numbers (NeMo-RL's per-worker vLLM series, for instance) are
    dropped with it: the coreweave backend reports only scalars.
    """
    out = dict(metrics)
    nested = out.get(GENERATION_METRICS_KEY)
    if isinstance(nested, Mapping):
        del out[GENERATION_METRICS_KEY]
        for name, value in nested.items():
            if isinstance(value, numbers.Real):
                out.setdefault(str(name), value)
    return out
