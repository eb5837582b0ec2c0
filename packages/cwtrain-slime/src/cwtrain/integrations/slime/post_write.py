"""The post-write hook slime and miles call after writing each weight version.

``--custom-update-weight-post-write-path cwtrain.integrations.slime.hook`` makes slime's
``load_function`` import :mod:`cwtrain.integrations.slime` and take its attribute ``hook``
(this module's :func:`hook`, re-exported there). slime calls it with its delta root once on
rank 0 (the baseline) and with each ``weight_vNNNNNN`` directory on every rank; only rank 0
acts, the other ranks return at once and wait in slime's barrier.

One :class:`~cwtrain.integrations.slime.publisher.SlimePublisher` per process keeps the
run's state (the served identity and the served copy of the weights); :func:`reset` drops it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from .config import HookConfig, default_run_id, is_rank_zero, reset_run_id
from .publisher import SlimePublisher

__all__ = ["current_publisher", "hook", "reset", "use_publisher"]

log = logging.getLogger(__name__)

_lock = threading.Lock()
_publisher: SlimePublisher | None = None


def current_publisher(args: Any = None) -> SlimePublisher:
    """The process's publisher, built from the environment and ``args`` on first use."""
    global _publisher
    with _lock:
        if _publisher is None:
            config = HookConfig.from_env(default_run_id=default_run_id(args))
            if args is not None:
                config = config.with_state_dir(args)
            log.info("publishing weight versions to deployment %s as %s-vNNNNNN", config.deployment_id, config.run_id)
            _publisher = SlimePublisher(config)
        return _publisher


def hook(args: Any, version_dir: str, rollout_engines: Sequence[Any] = ()) -> dict[str, float] | None:
    """slime's/miles' post-write hook: publish what was just written, on rank 0 only.

    Args:
        args: slime's or miles' argument namespace.
        version_dir: the delta root (baseline call) or a ``weight_vNNNNNN`` directory.
        rollout_engines: slime's engine handles; ignored (the deployment replaces them).

    Returns:
        ``hotload/*`` metrics on rank 0, ``None`` elsewhere.

    Raises:
        CWTrainError: publishing failed; slime stops the run rather than train on.
    """
    del rollout_engines
    if not is_rank_zero(args):
        return None
    return current_publisher(args)(args, str(version_dir))


def reset() -> None:
    """Forget the process's publisher and default run id (a new run in the same process, tests)."""
    global _publisher
    with _lock:
        if _publisher is not None:
            _publisher.close()
        _publisher = None
    reset_run_id()
    from . import actor, rollout

    actor.reset_client()
    rollout.reset_rollout()


def use_publisher(publisher: SlimePublisher | None) -> None:
    """Make :func:`hook` use ``publisher`` in this process (a custom loader, tests); ``None`` forgets it."""
    global _publisher
    with _lock:
        _publisher = publisher
