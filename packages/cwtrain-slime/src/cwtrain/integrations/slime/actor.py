"""Publishing one step ahead through a long-lived Ray actor on the trainer node.

``--custom-update-weight-post-write-path cwtrain.integrations.slime.actor_hook`` selects it
(instead of ``...slime.hook``). On rank 0 the hook hands each version directory to a
:class:`PublishingActor` pinned to the same node and returns, so upload and hot-load of
version k overlap training step k+1:

* at most one step ahead: the next call first waits for the previous publish;
* failures are never silent: a failed publish raises in the next call (the next training
  step), or in ``cwtrain.integrations.slime.drain()`` at the end of the run;
* the baseline call (slime's delta root) waits for its publish, so the first rollout sees it.

The actor is named ``cwtrain-publisher-<deployment id>`` (:func:`actor_name`) in the job's
namespace, so the driver can drain it after the training loop
(``python -m cwtrain.integrations.slime.launch`` does). This module holds the actor and
rank 0's client of it (:class:`ActorPublishClient`); the hook and ``drain`` that use them are
in :mod:`~cwtrain.integrations.slime.post_write`. Ray is imported only when the hook first runs.
"""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING, Any, Protocol

from cwtrain.integrations.frameworks import require
from cwtrain.integrations.slime.framework import RAY

from .config import HookConfig
from .publisher import SlimePublisher, version_of

if TYPE_CHECKING:
    from types import ModuleType

__all__ = ["ActorHandle", "ActorPublishClient", "PublishingActor", "actor_name", "ray_module"]

log = logging.getLogger(__name__)


def ray_module() -> ModuleType:
    """``ray``, or ``ImportError`` naming the install (the framework images ship it)."""
    return require(RAY)


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

    def publish(self, args: argparse.Namespace, version_dir: str) -> dict[str, float]:
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


class _RemoteMethod(Protocol):
    def remote(self, *args: Any) -> Any:
        """Start the call; returns an object reference for ``ray.get``."""
        ...


class ActorHandle(Protocol):
    """A Ray handle on a :class:`PublishingActor`: each method is called as ``handle.method.remote(...)``."""

    @property
    def publish(self) -> _RemoteMethod:
        """:meth:`PublishingActor.publish`."""
        ...

    @property
    def drain(self) -> _RemoteMethod:
        """:meth:`PublishingActor.drain`."""
        ...

    @property
    def acknowledge(self) -> _RemoteMethod:
        """:meth:`PublishingActor.acknowledge`."""
        ...


class ActorPublishClient:
    """Rank 0's handle on the publishing actor: hand over, remember, surface failures.

    Args:
        config: the hook's settings (sent to the actor when it is created).
        actor: an existing actor handle (tests); else get-or-create the named actor on this node.
    """

    def __init__(self, config: HookConfig, actor: ActorHandle | None = None) -> None:
        self.config = config
        self._pending: Any = None  # the Ray object reference of the publish in flight
        self._pending_dir: str | None = None
        self.actor: ActorHandle = actor if actor is not None else self._create_actor(config)

    @staticmethod
    def _create_actor(config: HookConfig) -> ActorHandle:
        ray = ray_module()
        scheduling = require(RAY, "ray.util.scheduling_strategies")

        from cwtrain.integrations.envforward import forwarded_env

        if not ray.is_initialized():
            ray.init()
        node_id = ray.get_runtime_context().get_node_id()
        remote_cls = ray.remote(PublishingActor)
        handle: ActorHandle = remote_cls.options(
            name=actor_name(config.deployment_id),
            get_if_exists=True,
            num_cpus=0,
            max_concurrency=1,
            scheduling_strategy=scheduling.NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
            # Ray workers do not inherit this process's environment: hand over what publishing reads
            runtime_env={"env_vars": forwarded_env()},
        ).remote(config)
        return handle

    def wait(self) -> dict[str, float] | None:
        """Wait for the publish in flight, if any; return its metrics or raise its error."""
        if self._pending is None:
            return None
        pending, version_dir = self._pending, self._pending_dir
        self._pending = self._pending_dir = None
        ray = ray_module()
        try:
            result: dict[str, float] = ray.get(pending)
        except Exception:
            log.error("publishing %s failed; stopping here rather than train on stale weights", version_dir)
            self.actor.acknowledge.remote()
            raise
        return result

    def submit(self, args: argparse.Namespace, version_dir: str) -> dict[str, float] | None:
        """Wait for the previous publish, then hand ``version_dir`` over.

        Returns the previous publish's metrics (the baseline's own, since it is waited for).
        """
        previous = self.wait()
        self._pending = self.actor.publish.remote(args, version_dir)
        self._pending_dir = version_dir
        if version_of(version_dir) is None:
            return self.wait()
        return previous
