"""The miles plug-in's process state: one :class:`MilesRuntime`, created once per process.

miles loads the plug-in's entry points by name (``post_save_hook``, ``CoreWeaveRolloutFn``),
so what must outlive one call lives in one object that they resolve with
:meth:`MilesRuntime.current`:

* the post-save publisher (a :class:`~cwtrain.integrations.miles.post_save.PostSavePublisher`:
  the previous HF export and the run's publisher), built on the first save;
* ``CoreWeaveRolloutFn``, derived from miles' ``InferenceRolloutFn`` when first asked for.

The post-write hook, the tokenizer and the rollout samplers are slime's (this plug-in reuses
them), so they live in :class:`cwtrain.integrations.slime.SlimeRuntime`. :func:`reset` starts
this object over::

    from cwtrain.integrations.miles import MilesRuntime, reset

    MilesRuntime.current().use_post_save(PostSavePublisher(settings, loader=my_loader))
    reset()   # a new run in the same process (tests)
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["MilesRuntime", "PostSaveTarget", "reset"]


class PostSaveTarget(Protocol):
    """What ``post_save_hook`` calls on each save (a ``PostSavePublisher``)."""

    @property
    def run_id(self) -> str:
        """The run id of the identities it publishes."""
        ...

    def publish(self, args: argparse.Namespace, rollout_id: int, hf_checkpoint_dir: str) -> list[dict[str, float]]:
        """Publish the HF export of ``rollout_id``; returns one ``hotload/*`` record per version handled."""
        ...


class MilesRuntime:
    """Everything the miles plug-in keeps for the life of a process (see the module docstring).

    The plug-in's entry points use the process's one instance, :meth:`current`.
    """

    @classmethod
    def current(cls) -> MilesRuntime:
        """The process's one runtime."""
        return _CURRENT

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._post_save: PostSaveTarget | None = None
        self._rollout_fn_cls: type[Any] | None = None

    def post_save(self, build: Callable[[], PostSaveTarget]) -> PostSaveTarget:
        """The post-save publisher, built with ``build`` on first use."""
        with self._lock:
            if self._post_save is None:
                self._post_save = build()
            return self._post_save

    def use_post_save(self, publisher: PostSaveTarget | None) -> None:
        """Make ``post_save_hook`` use ``publisher`` (a custom loader, tests); ``None`` forgets it."""
        with self._lock:
            self._post_save = publisher

    def rollout_fn_cls(self, build: Callable[[], type[Any]]) -> type[Any]:
        """``CoreWeaveRolloutFn``, built once with ``build`` (which imports miles)."""
        with self._lock:
            if self._rollout_fn_cls is None:
                self._rollout_fn_cls = build()
            return self._rollout_fn_cls

    def reset(self) -> None:
        """Forget the post-save publisher and the built rollout class."""
        with self._lock:
            self._post_save = None
            self._rollout_fn_cls = None


_CURRENT = MilesRuntime()


def reset() -> None:
    """Forget the post-save publisher and the built ``CoreWeaveRolloutFn`` (a new run, tests)."""
    _CURRENT.reset()
