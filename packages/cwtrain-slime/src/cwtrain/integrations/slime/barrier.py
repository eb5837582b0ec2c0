"""The ranks that wait while rank 0 publishes: the gloo group's timeout, and ``init_hook``.

::

    --custom-megatron-init-path cwtrain.integrations.slime.init_hook   # every rank

While rank 0 uploads and hot-loads a version, every other train rank waits in a barrier on
the framework's gloo group (``get_gloo_group()`` of ``slime.utils.distributed_utils``, or of
the modules a fork's :class:`~cwtrain.integrations.slime.dialect.Dialect` names). slime
creates that group without a timeout, so torch's default applies (30 minutes), not
``--distributed-timeout-minutes``: a publish longer than that kills the run. :func:`init_hook`,
which slime calls on every train rank once the process groups exist, gives the group
:func:`barrier_timeout`:

    max(``--distributed-timeout-minutes``, 2 × ``CWTRAIN_HOTLOAD_TIMEOUT``, torch's default)

(a publish spends at most ``CWTRAIN_HOTLOAD_TIMEOUT`` uploading and hot-loading; as much
again covers the local work around it: checksums, the served copy, staging). slime
re-creates the group when it offloads the trainer (``--offload-train``, a critic); the init
hook makes every re-created group get the same timeout, and the post-write hook re-applies
it on every rank at each version. Only the init hook covers the baseline, which slime hands
to rank 0 alone while the others already wait.

A run that already uses ``--custom-megatron-init-path`` for its own function calls
``cwtrain.integrations.slime.init_hook(args)`` from it.

The init hook also stops a slime run at start that could never publish: without local
engines slime skips every weight update unless the recipe's patch adds
``--update-weight-standalone-publish`` (see :func:`check_standalone_publish`), and installs
the sample canary (:func:`cwtrain.integrations.slime.canary.install`).
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from cwtrain.config import env_float
from cwtrain.errors import ConfigError
from cwtrain.hotload import DEFAULT_TIMEOUT

from .dialect import Dialect, dialect_of, gloo_group, hook_paths

__all__ = [
    "barrier_timeout",
    "check_standalone_publish",
    "extend_gloo_timeout",
    "gloo_group",
    "init_hook",
    "set_group_timeout",
]

log = logging.getLogger(__name__)

TORCH_DEFAULT_TIMEOUT = timedelta(minutes=30)
"""torch's default timeout of a gloo group created without one (``default_pg_timeout``)."""


def barrier_timeout(args: argparse.Namespace | None, environ: Mapping[str, str] | None = None) -> timedelta:
    """How long a rank may wait for rank 0's publish.

    ``max(--distributed-timeout-minutes, 2 × CWTRAIN_HOTLOAD_TIMEOUT, 30 minutes)``.

    Args:
        args: the framework's namespace (``distributed_timeout_minutes``).
        environ: the variables to read (default ``os.environ``).

    Raises:
        ConfigError: ``CWTRAIN_HOTLOAD_TIMEOUT`` is malformed.
    """
    publish = env_float("CWTRAIN_HOTLOAD_TIMEOUT", DEFAULT_TIMEOUT, environ)
    minutes = getattr(args, "distributed_timeout_minutes", None)
    configured = timedelta(minutes=float(minutes)) if isinstance(minutes, int | float) else timedelta(0)
    return max(configured, timedelta(seconds=2 * publish), TORCH_DEFAULT_TIMEOUT)


def _current_timeout(group: Any) -> timedelta | None:
    try:
        import torch

        timeout = group._get_backend(torch.device("cpu")).options._timeout
    except Exception:  # a group without a CPU backend, or torch moved the attribute
        return None
    return timeout if isinstance(timeout, timedelta) else None


def set_group_timeout(group: Any, timeout: timedelta) -> timedelta | None:
    """Raise ``group``'s timeout to ``timeout`` (never lowers it); returns the timeout now in force.

    A local setting: no collective, safe to call on any subset of ranks. ``None`` when torch
    offers no way to set it (the group keeps its own).
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None or group is None:
        return None
    current = _current_timeout(group)
    if current is not None and current >= timeout:
        return current
    setter: Callable[..., None] | None = getattr(dist, "set_timeout", None)
    if setter is None:  # torch < 2.14: the private setter Megatron uses too
        setter = getattr(getattr(dist, "distributed_c10d", None), "_set_pg_timeout", None)
    if setter is None:
        log.warning("this torch cannot change a process group's timeout; ranks wait at most %s", current)
        return current
    setter(timeout, group)
    return timeout


def extend_gloo_timeout(
    args: argparse.Namespace | None, environ: Mapping[str, str] | None = None, *, dialect: Dialect | None = None
) -> timedelta | None:
    """Give the framework's gloo group :func:`barrier_timeout` (when this process has one; see :func:`gloo_group`)."""
    group = gloo_group(args, dialect=dialect)
    if group is None:
        return None
    return set_group_timeout(group, barrier_timeout(args, environ))


def _keep_timeout(function: Callable[..., Any], args: argparse.Namespace, dialect: Dialect) -> Callable[..., Any]:
    """``function`` (the framework's ``init_gloo_group`` / ``set_gloo_group``), then the timeout on the group now set."""
    if getattr(function, "__cwtrain_timeout__", False):
        return function

    @functools.wraps(function)
    def wrapper(*call_args: Any, **kwargs: Any) -> Any:
        result = function(*call_args, **kwargs)
        extend_gloo_timeout(args, dialect=dialect)
        return result

    wrapper.__cwtrain_timeout__ = True  # type: ignore[attr-defined]
    return wrapper


def check_standalone_publish(args: argparse.Namespace) -> None:
    """Refuse a slime run with no local engine that could never reach cwtrain's post-write hook.

    slime's ``update_weights()`` returns before its updater runs when no SGLang engine is
    up, so with ``--rollout-num-gpus 0`` the hook is never called, unless slime carries the
    recipe's patch and ``--update-weight-standalone-publish`` is passed. An unpatched slime
    drops that flag silently (it ignores unknown flags), so the namespace lacks it.

    Raises:
        ConfigError: naming the patch or the flag.
    """
    if not hasattr(args, "update_weight_mode") or getattr(args, "rollout_num_gpus", None) != 0:
        return  # not slime's namespace (a fork without --update-weight-mode), or a run with local engines
    if getattr(args, "custom_update_weight_post_write_path", None) not in hook_paths():
        return
    if not hasattr(args, "update_weight_standalone_publish"):
        raise ConfigError(
            "this slime skips every weight update when no local engine runs (--rollout-num-gpus 0), so "
            "cwtrain's post-write hook would never publish, and it does not know --update-weight-standalone-publish "
            "(slime ignores unknown flags): apply recipes/slime/patches/slime-standalone-publish.patch to slime, "
            "or publish from live tensors with python -m cwtrain.integrations.slime.launch"
        )
    if not args.update_weight_standalone_publish:
        raise ConfigError(
            "slime skips every weight update when no local engine runs (--rollout-num-gpus 0), so cwtrain's "
            "post-write hook would never publish: pass --update-weight-standalone-publish"
        )


def init_hook(args: argparse.Namespace) -> None:
    """slime's ``--custom-megatron-init-path`` function (and its forks'): keep waiting ranks alive.

    Called on every train rank after the process groups exist. Gives the gloo group of the
    namespace's dialect :func:`barrier_timeout`, makes every group the framework re-creates
    later get it too, and checks that a slime run without local engines can publish
    (:func:`check_standalone_publish`).

    Args:
        args: the framework's namespace.

    Raises:
        ConfigError: the run could never publish, or ``CWTRAIN_HOTLOAD_TIMEOUT`` is malformed.
    """
    check_standalone_publish(args)
    dialect = dialect_of(args)
    timeout = extend_gloo_timeout(args, dialect=dialect)
    for name in dialect.gloo_modules:
        module = sys.modules.get(name)
        for attr in ("init_gloo_group", "set_gloo_group"):
            function = getattr(module, attr, None)
            if callable(function):
                setattr(module, attr, _keep_timeout(function, args, dialect))
    log.info("ranks waiting for rank 0's publish wait up to %s (the gloo group's timeout)", timeout)
    from .canary import install

    install(args, dialect=dialect)  # the sample canary, before the framework logs each batch
