"""What differs between slime and a fork of it that reuses this plug-in: a :class:`Dialect`.

A fork of slime keeps slime's argument namespace, its post-write hook call and its delta
format, so its cwtrain plug-in reuses this one's hooks (``hook``, ``actor_hook``,
``init_hook``) and ``log_metrics`` as they are. A few words differ, and each is one field of
the fork's :class:`Dialect`:

* how to recognise the fork's argument namespace (:attr:`Dialect.matches`);
* the framework modules that hold the gloo group the other ranks wait in while rank 0
  publishes (:attr:`Dialect.gloo_modules`, read by :mod:`~cwtrain.integrations.slime.barrier`);
* the framework's logging module and the call that hands it a ``hotload/*`` record
  (:attr:`Dialect.logging_modules`, :attr:`Dialect.log`, used by
  :func:`~cwtrain.integrations.slime.tracking.log_metrics`);
* whether the arguments select the disk-delta updater (:attr:`Dialect.delta_mode`, read by
  :class:`~cwtrain.integrations.slime.publisher.SlimePublisher`);
* the fork plug-in's own names for the post-write hooks (:attr:`Dialect.hook_paths`).

:data:`SLIME_DIALECT` is slime's own. A fork's plug-in declares its dialect in the
``cwtrain.slime.dialects`` entry-point group of its ``pyproject.toml``::

    [project.entry-points."cwtrain.slime.dialects"]
    myfork = "cwtrain.integrations.myfork.dialect:MYFORK_DIALECT"

:func:`dialect_of` gives a namespace the first registered dialect (by entry-point name) whose
``matches`` accepts it, else slime's, so ``cwtrain.integrations.slime.hook`` serves a fork's
run whenever the fork's plug-in is installed. A fork's own entry points may pass their
dialect explicitly instead (``log_metrics(..., dialect=...)``).
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

__all__ = [
    "ENTRY_POINT_GROUP",
    "SLIME_DIALECT",
    "Dialect",
    "dialect_of",
    "gloo_group",
    "hook_paths",
    "registered_dialects",
]

log = logging.getLogger(__name__)

#: The entry-point group where the plug-ins of slime's forks declare their :class:`Dialect`.
ENTRY_POINT_GROUP = "cwtrain.slime.dialects"


@dataclass(frozen=True)
class Dialect:
    """The words of one framework of slime's family, where they differ from slime's (module docstring).

    Attributes:
        name: the framework, as messages name it (``"slime"``).
        matches: whether an argument namespace is this framework's (:func:`dialect_of`).
        gloo_modules: the modules holding the gloo group; the first one's ``get_gloo_group()``
            returns it, and every one's ``init_gloo_group`` / ``set_gloo_group`` is wrapped so
            a re-created group keeps the timeout.
        logging_modules: the framework's logging module, first importable wins.
        log: ``log(module, args, record, step_key)`` hands one ``hotload/*`` record (stepped by
            ``record[step_key]``) to that module; returns the wandb run to keep the served
            identity in (its summary), or ``None``. May raise: the caller logs and drops it.
        delta_mode: whether the arguments select the disk-delta updater (then the delta flags
            are checked at the baseline, and every version directory is a delta).
        hook_paths: the plug-in's ``--custom-update-weight-post-write-path`` values.
        rollout_log_modules: the modules whose ``log_rollout_data(rollout_id, args, rollout_data)``
            the actor calls by name once a batch's log-probs and advantages are computed (each
            one that has it is wrapped: :mod:`~cwtrain.integrations.slime.canary`).
    """

    name: str
    matches: Callable[[argparse.Namespace], bool]
    gloo_modules: tuple[str, ...]
    logging_modules: tuple[str, ...]
    log: Callable[[ModuleType, argparse.Namespace, dict[str, float], str], Any]
    delta_mode: Callable[[argparse.Namespace], bool]
    hook_paths: tuple[str, ...] = ()
    rollout_log_modules: tuple[str, ...] = ()


# ---------------------------------------------------------------------- slime's own

_lock = threading.Lock()
_defined: set[int] = set()


def _wandb_run() -> Any:
    wandb = sys.modules.get("wandb")
    return getattr(wandb, "run", None) if wandb is not None else None


def _log_slime(module: ModuleType, args: argparse.Namespace, record: dict[str, float], step_key: str) -> Any:
    """slime's ``logging_utils.log``: wandb (``--use-wandb``) and TensorBoard (``--use-tensorboard``)."""
    use_wandb = bool(getattr(args, "use_wandb", False))
    if use_wandb and _wandb_run() is None:
        module.init_tracking(args, primary=False)  # join the run as slime's train ranks do
    run = _wandb_run()
    if use_wandb and run is None:  # no run to join (no wandb_run_id): TensorBoard only
        args = argparse.Namespace(**{**vars(args), "use_wandb": False})
    if run is not None and use_wandb:
        with _lock:
            if id(run) not in _defined:  # once per wandb run
                sys.modules["wandb"].define_metric(step_key)
                sys.modules["wandb"].define_metric("hotload/*", step_metric=step_key)
                _defined.add(id(run))
    module.log(args, record, step_key=step_key)
    return run if use_wandb else None


def _any_namespace(args: argparse.Namespace) -> bool:
    del args
    return True  # slime's dialect is the fallback: every namespace no fork claims


def _slime_delta_mode(args: argparse.Namespace) -> bool:
    return getattr(args, "update_weight_mode", None) == "delta"


SLIME_DIALECT = Dialect(
    name="slime",
    matches=_any_namespace,
    gloo_modules=("slime.utils.distributed_utils", "slime.utils.reloadable_process_group"),
    # slime.utils.logging_utils up to v0.3.1
    logging_modules=("slime.observability.logging_utils", "slime.utils.logging_utils"),
    log=_log_slime,
    delta_mode=_slime_delta_mode,  # --update-weight-mode delta
    hook_paths=("cwtrain.integrations.slime.hook", "cwtrain.integrations.slime.actor_hook"),
    # train_metric_utils.log_rollout_data since 2026; the actor module's own import up to v0.3.1
    rollout_log_modules=("slime.observability.train_metric_utils", "slime.backends.megatron_utils.actor"),
)
"""slime's dialect: what :func:`dialect_of` gives every namespace no registered fork claims."""


def gloo_group(args: argparse.Namespace | None = None, *, dialect: Dialect | None = None) -> Any:
    """The framework's gloo group in this process, or ``None`` (no framework, or not created yet).

    The framework is ``dialect``, by default :func:`~cwtrain.integrations.slime.dialect.dialect_of` ``args``.
    """
    module = sys.modules.get((dialect or dialect_of(args)).gloo_modules[0])
    getter = getattr(module, "get_gloo_group", None)
    if getter is None:
        return None
    try:
        return getter()
    except RuntimeError:  # "Gloo group has not been initialized"
        return None


# ---------------------------------------------------------------------- the registry


@functools.cache
def registered_dialects() -> tuple[Dialect, ...]:
    """The dialects the installed plug-ins declare in :data:`ENTRY_POINT_GROUP`, by entry-point name.

    Read once per process. An entry point that fails to load, or names something that is
    not a :class:`Dialect`, is left out with a warning (its framework's runs are then taken
    for slime's).
    """
    found = []
    for entry_point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name):
        try:
            dialect = entry_point.load()
        except Exception as exc:
            log.warning("the %s dialect (%s) does not load: %s", entry_point.name, entry_point.value, exc)
            continue
        if not isinstance(dialect, Dialect):
            log.warning("the %s entry point (%s) is not a Dialect", entry_point.name, entry_point.value)
            continue
        found.append(dialect)
    return tuple(found)


def dialect_of(args: argparse.Namespace | None) -> Dialect:
    """The dialect of ``args``: the first registered one whose ``matches`` accepts it, else slime's.

    ``None`` (no namespace, as in the live-tensor collectives) is slime's.
    """
    if args is not None:
        for dialect in registered_dialects():
            if dialect.matches(args):
                return dialect
    return SLIME_DIALECT


def hook_paths() -> tuple[str, ...]:
    """Every ``--custom-update-weight-post-write-path`` value naming cwtrain's post-write hooks."""
    return tuple(path for dialect in (SLIME_DIALECT, *registered_dialects()) for path in dialect.hook_paths)
