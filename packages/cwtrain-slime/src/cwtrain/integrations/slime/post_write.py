"""The post-write hooks slime calls after writing each weight version, and ``drain``.

``--custom-update-weight-post-write-path cwtrain.integrations.slime.hook`` makes slime's
``load_function`` import :mod:`cwtrain.integrations.slime` and take its attribute ``hook``
(this module's :func:`hook`, re-exported there). slime calls it with its delta root once on
rank 0 (the baseline) and with each ``weight_vNNNNNN`` directory on every rank; only rank 0
publishes, the other ranks give the gloo group its timeout
(:func:`~cwtrain.integrations.slime.barrier.extend_gloo_timeout`) and wait in slime's barrier.
slime discards what the hook returns, so rank 0 also hands the metrics to the run's logger
(:mod:`~cwtrain.integrations.slime.tracking`). A fork of slime that calls the hook the same way
(its plug-in reuses these functions) is served by its
:class:`~cwtrain.integrations.slime.dialect.Dialect`: its gloo group, its logger, its delta flag.

``...slime.actor_hook`` (:func:`actor_hook`) publishes one step ahead through the publishing
Ray actor (see :mod:`~cwtrain.integrations.slime.actor`); :func:`drain` waits for its last
publish at the end of the run.

Each hook resolves the process's :class:`~cwtrain.integrations.slime.runtime.SlimeRuntime`,
which keeps the run's publisher (the served identity and the served copy of the weights) or
the actor's client; ``cwtrain.integrations.slime.reset()`` starts it over.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from cwtrain.config import env_str
from cwtrain.errors import ConfigError

from .actor import actor_name, ray_module
from .barrier import extend_gloo_timeout
from .config import is_rank_zero
from .dialect import dialect_of
from .runtime import SlimeRuntime
from .tracking import log_metrics

__all__ = ["actor_hook", "drain", "hook"]


def hook(args: argparse.Namespace, version_dir: str, rollout_engines: Sequence[Any] = ()) -> dict[str, float] | None:
    """slime's post-write hook: publish what was just written, on rank 0 only.

    Args:
        args: slime's argument namespace (or a fork's, by its dialect).
        version_dir: the delta root (baseline call) or a ``weight_vNNNNNN`` directory.
        rollout_engines: slime's engine handles; ignored (the deployment replaces them).

    Returns:
        ``hotload/*`` metrics on rank 0 (also logged to the run's logger), ``None`` elsewhere.

    Raises:
        CWTrainError: publishing failed; slime stops the run rather than train on.
    """
    del rollout_engines
    dialect = dialect_of(args)  # slime's, or that of the fork whose namespace this is
    # every rank: a group slime re-created since start-up waits long enough too
    extend_gloo_timeout(args, dialect=dialect)
    if not is_rank_zero(args):
        return None
    publisher = SlimeRuntime.current().publisher(args)
    metrics = publisher(args, str(version_dir))
    log_metrics(args, metrics, run_id=publisher.config.run_id, dialect=dialect)
    return metrics


def actor_hook(
    args: argparse.Namespace, version_dir: str, rollout_engines: Sequence[Any] = ()
) -> dict[str, float] | None:
    """slime's post-write hook, publishing through the actor (one step ahead).

    Same contract as :func:`hook`; returns the previous version's metrics (a step late) on
    rank 0 and ``None`` elsewhere.

    Raises:
        ConfigError: full mode deletes each version before the actor could read it.
        CWTrainError: the previous publish failed.
    """
    del rollout_engines
    dialect = dialect_of(args)
    extend_gloo_timeout(args, dialect=dialect)
    if not is_rank_zero(args):
        return None
    if getattr(args, "update_weight_mode", None) == "full" and not getattr(args, "update_weight_disk_keep_files", True):
        raise ConfigError(
            "in --update-weight-mode full slime deletes each version directory after the hook returns, before the "
            "publishing actor reads it: pass --update-weight-disk-keep-files, or use cwtrain.integrations.slime.hook"
        )
    client = SlimeRuntime.current().actor_client(args)
    metrics = client.submit(args, str(version_dir))
    log_metrics(args, metrics, run_id=client.config.run_id, dialect=dialect)
    return metrics


def drain(deployment_id: str | None = None, *, timeout: float | None = None) -> str | None:
    """Wait for the publishing actor's last publish; raise its error if nobody saw it yet.

    Call it from the driver after the training loop. Returns the served identity, or ``None``
    when no publishing actor exists.

    Args:
        deployment_id: the deployment (default ``CWTRAIN_HOTLOAD_DEPLOYMENT_ID``).
        timeout: seconds to wait (default: forever).
    """
    client = SlimeRuntime.current().current_actor_client
    if client is not None:
        client.wait()
    ray = ray_module()
    deployment = deployment_id or env_str("CWTRAIN_HOTLOAD_DEPLOYMENT_ID") or ""
    try:
        handle = client.actor if client is not None else ray.get_actor(actor_name(deployment))
    except ValueError:
        return None
    identity: str | None = ray.get(handle.drain.remote(), timeout=timeout)
    return identity
