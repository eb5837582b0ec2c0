"""Publishing one step ahead through a long-lived Ray actor on the trainer node.

``--custom-update-weight-post-write-path cwtrain.integrations.slime.actor_hook`` selects it
(instead of ``...slime.hook``). On rank 0 the hook hands each version directory to a
:class:`PublishingActor` pinned to the same node and returns, so upload and hot-load of
version k overlap training step k+1:

* at most one step ahead: the next call first waits for the previous publish;
* failures are never silent: a failed publish raises in the next call (the next training
  step), or in :func:`drain` at the end of the run;
* the baseline call (slime's delta root) waits for its publish, so the first rollout sees it.

The actor is named ``cwtrain-publisher-<deployment id>`` in the job's namespace, so the
driver can :func:`drain` it after the training loop (``python -m cwtrain.integrations.slime.launch``
does). Ray is imported only when the hook first runs.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

from cwtrain.errors import ConfigError

from .config import HookConfig, default_run_id, is_rank_zero
from .publisher import SlimePublisher, version_of

__all__ = ["ActorPublishClient", "PublishingActor", "actor_hook", "actor_name", "drain", "reset_client"]

log = logging.getLogger(__name__)

_RAY_MISSING = 'the publishing actor needs Ray: pip install "ray>=2.30" (slime and miles images ship it)'


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError(_RAY_MISSING) from exc
    return ray


def actor_name(deployment_id: str) -> str:
    """The Ray name of the publishing actor of a deployment."""
    return f"cwtrain-publisher-{deployment_id}"


class PublishingActor:
    """Holds one :class:`SlimePublisher` for the run and publishes one version per call.

    Wrapped with ``ray.remote`` by :class:`ActorPublishClient`; calls run one at a time, so
    :meth:`drain` returns once every publish handed over before it has finished.
    """

    def __init__(self, config: HookConfig) -> None:
        self.publisher = SlimePublisher(config)
        self._last_error: BaseException | None = None

    def publish(self, args: Any, version_dir: str) -> dict[str, float]:
        """Publish one version (or the baseline); exceptions travel back to the caller."""
        try:
            return self.publisher(args, version_dir)
        except BaseException as exc:
            self._last_error = exc
            raise

    def served_identity(self) -> str | None:
        """The identity the deployment serves (or will once the last hot-load completes)."""
        return self.publisher.served_identity

    def drain(self) -> str | None:
        """Return the served identity once every earlier call finished; re-raise an unreported failure."""
        error, self._last_error = self._last_error, None
        if error is not None:
            raise error
        return self.publisher.served_identity

    def acknowledge(self) -> None:
        """The caller saw the last failure; :meth:`drain` need not raise it again."""
        self._last_error = None


class ActorPublishClient:
    """Rank 0's handle on the publishing actor: hand over, remember, surface failures.

    Args:
        config: the hook's settings (sent to the actor when it is created).
        actor: an existing actor handle (tests); else get-or-create the named actor on this node.
    """

    def __init__(self, config: HookConfig, actor: Any = None) -> None:
        self.config = config
        self._pending: Any = None
        self._pending_dir: str | None = None
        self.actor = actor if actor is not None else self._create_actor(config)

    @staticmethod
    def _create_actor(config: HookConfig) -> Any:
        ray = _ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from cwtrain.integrations.envforward import forwarded_env

        if not ray.is_initialized():
            ray.init()
        node_id = ray.get_runtime_context().get_node_id()
        remote_cls = ray.remote(PublishingActor)
        return remote_cls.options(
            name=actor_name(config.deployment_id),
            get_if_exists=True,
            num_cpus=0,
            max_concurrency=1,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
            # Ray workers do not inherit this process's environment: hand over what publishing reads
            runtime_env={"env_vars": forwarded_env()},
        ).remote(config)

    def wait(self) -> dict[str, float] | None:
        """Wait for the publish in flight, if any; return its metrics or raise its error."""
        if self._pending is None:
            return None
        pending, version_dir = self._pending, self._pending_dir
        self._pending = self._pending_dir = None
        ray = _ray()
        try:
            result: dict[str, float] = ray.get(pending)
        except Exception:
            log.error("publishing %s failed; stopping here rather than train on stale weights", version_dir)
            self.actor.acknowledge.remote()
            raise
        return result

    def submit(self, args: Any, version_dir: str) -> dict[str, float] | None:
        """Wait for the previous publish, then hand ``version_dir`` over.

        Returns the previous publish's metrics (the baseline's own, since it is waited for).
        """
        previous = self.wait()
        self._pending = self.actor.publish.remote(args, version_dir)
        self._pending_dir = version_dir
        if version_of(version_dir) is None:
            return self.wait()
        return previous


_client_lock = threading.Lock()
_client: ActorPublishClient | None = None


def reset_client() -> None:
    """Forget this process's actor client (the actor itself is left alone)."""
    global _client
    with _client_lock:
        _client = None


def _current_client(args: Any) -> ActorPublishClient:
    global _client
    with _client_lock:
        if _client is None:
            config = HookConfig.from_env(default_run_id=default_run_id(args)).with_state_dir(args)
            _client = ActorPublishClient(config)
        return _client


def actor_hook(args: Any, version_dir: str, rollout_engines: Sequence[Any] = ()) -> dict[str, float] | None:
    """slime's/miles' post-write hook, publishing through the actor (one step ahead).

    Same contract as :func:`cwtrain.integrations.slime.hook`; returns the previous version's
    metrics (a step late) on rank 0 and ``None`` elsewhere.
    """
    del rollout_engines
    if not is_rank_zero(args):
        return None
    if getattr(args, "update_weight_mode", None) == "full" and not getattr(args, "update_weight_disk_keep_files", True):
        raise ConfigError(
            "in --update-weight-mode full slime deletes each version directory after the hook returns, before the "
            "publishing actor reads it: pass --update-weight-disk-keep-files, or use cwtrain.integrations.slime.hook"
        )
    return _current_client(args).submit(args, str(version_dir))


def drain(deployment_id: str | None = None, *, timeout: float | None = None) -> str | None:
    """Wait for the publishing actor's last publish; raise its error if nobody saw it yet.

    Call it from the driver after the training loop. Returns the served identity, or ``None``
    when no publishing actor exists.

    Args:
        deployment_id: the deployment (default ``CWTRAIN_HOTLOAD_DEPLOYMENT_ID``).
        timeout: seconds to wait (default: forever).
    """
    with _client_lock:
        client = _client
    if client is not None:
        client.wait()
    ray = _ray()
    deployment = deployment_id or os.environ.get("CWTRAIN_HOTLOAD_DEPLOYMENT_ID", "")
    try:
        handle = client.actor if client is not None else ray.get_actor(actor_name(deployment))
    except ValueError:
        return None
    identity: str | None = ray.get(handle.drain.remote(), timeout=timeout)
    return identity
