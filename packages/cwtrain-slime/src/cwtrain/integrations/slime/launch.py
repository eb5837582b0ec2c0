"""``python -m cwtrain.integrations.slime.launch``: run slime's ``train.py`` with the publishing actor.

::

    cd /path/to/slime
    python -m cwtrain.integrations.slime.launch train.py \\
        --hf-checkpoint /models/Qwen3-4B --update-weight-disk-dir /shared/run1/weights \\
        --rollout-function-path cwtrain.integrations.slime.rollout.generate_rollout \\
        --rollout-num-gpus 0 ...   # slime's usual arguments

The first argument is slime's training script (``train.py`` or ``train_async.py``); the rest
are its arguments, unchanged. Before the script runs, ``slime.ray.placement_group.create_training_models``
is rebound so that its ``actor_cls`` defaults to :func:`~cwtrain.integrations.slime.train_actor.make_actor_cls`'s
``MegatronTrainRayActor`` subclass: every ``actor_model.update_weights()`` then publishes the
model's tensors by hot-load (baseline first, deltas, FULL cuts as ``CWTRAIN_HOTLOAD_FULL_EVERY`` says),
without slime's disk updaters, patches or local engines. The script runs as ``__main__``
with ``sys.argv`` set as if it had been started directly. After it returns, a publishing
actor (``...slime.actor_hook``), if one was used, is drained so the last publish is not lost.

Variables: the hook's ``CWTRAIN_HOTLOAD_*`` (see :mod:`cwtrain.integrations.slime.config`)
and the rollout function's ``CWTRAIN_ROLLOUT_*``.
"""

from __future__ import annotations

import argparse
import functools
import logging
import runpy
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cwtrain.integrations.frameworks import require
from cwtrain.integrations.slime.framework import SLIME

__all__ = ["inject_actor_cls", "main"]

log = logging.getLogger(__name__)

_USAGE = "usage: python -m cwtrain.integrations.slime.launch TRAIN_SCRIPT [slime arguments ...]"


def inject_actor_cls(actor_cls: type[Any] | None = None) -> Callable[..., Any]:
    """Rebind ``slime.ray.placement_group.create_training_models`` to default ``actor_cls``.

    Scripts that import the function afterwards (slime's ``train.py`` does, at its top) get
    the rebound one. Returns the original function.

    Raises:
        ImportError: slime is not installed.
    """
    placement = require(SLIME, "slime.ray.placement_group")
    from .train_actor import make_actor_cls

    original: Callable[..., Any] = getattr(placement.create_training_models, "__wrapped__", None) or (
        placement.create_training_models
    )
    cls = actor_cls if actor_cls is not None else make_actor_cls()

    @functools.wraps(original)
    def create_training_models(
        args: argparse.Namespace, pgs: Any, rollout_manager: Any, actor_cls: type[Any] | None = None
    ) -> Any:
        return original(args, pgs, rollout_manager, actor_cls=cls if actor_cls is None else actor_cls)

    setattr(placement, "create_training_models", create_training_models)  # noqa: B010 - a module of slime's
    return original


def main(argv: Sequence[str] | None = None) -> int:
    """Run slime's training script with the publishing actor injected; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_USAGE, file=sys.stderr)
        return 0 if args else 2
    script = Path(args[0])
    if not script.is_file():
        print(f"error: {script} is not a file: pass slime's train.py (or train_async.py) first", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    inject_actor_cls()
    log.info("running %s with cwtrain's publishing MegatronTrainRayActor", script)
    saved = sys.argv
    sys.argv = [str(script), *args[1:]]
    sys.path.insert(0, str(script.resolve().parent))
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = saved
    _drain_publishing_actor()
    return 0


def _drain_publishing_actor() -> None:
    """Wait for the publishing actor's last publish when the run used ``actor_hook``."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return
    from .post_write import drain

    identity = drain()
    if identity is not None:
        log.info("the deployment serves %s", identity)


if __name__ == "__main__":
    sys.exit(main())
