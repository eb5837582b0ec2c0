"""The live-tensor actor: a ``MegatronTrainRayActor`` whose ``update_weights()`` hot-loads.

``python -m cwtrain.integrations.slime.launch train.py ARGS`` injects :func:`make_actor_cls`'s
subclass of slime's ``MegatronTrainRayActor`` through ``create_training_models(...,
actor_cls=...)``. Its ``update_weights()`` keeps the parts of slime's own that matter
without local engines and replaces the updater by a
:class:`~cwtrain.integrations.slime.tensors.TensorPublisher`:

* the tensors come from slime's own gather (``UpdateWeightFromDistributed``'s non-expert and
  expert passes, built for this purpose whichever updater slime chose for its flags), one
  chunk of at most ``--update-weight-buffer-size`` bytes at a time;
* with ``--offload-train`` (also set by ``--offload`` and by a critic) the actor wakes up
  first (memory resumed, process groups reloaded, the actor's weights in place) and goes
  back to sleep afterwards, as slime does for a critic run;
* ``--keep-old-actor`` moves its weight queue as slime's does;
* the time is recorded as slime's ``update_weights`` timer; the ``hotload/*`` metrics go to
  the run's logger (:mod:`~cwtrain.integrations.slime.tracking`).

Refused when the actor is created (:func:`check_live_tensor_args`): ``--colocate`` (it shares
the GPUs with local engines cwtrain does not have) and ``--release-train`` (it re-creates the
train actors, and the served copy with them). The gloo group the other ranks wait in gets
:func:`~cwtrain.integrations.slime.barrier.barrier_timeout` at every version.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import sys
from collections.abc import Iterator
from typing import Any

from cwtrain.errors import ConfigError, CWTrainError
from cwtrain.hotload import Collective, SingleProcess
from cwtrain.integrations.frameworks import install_line
from cwtrain.integrations.slime.framework import SLIME

from .barrier import extend_gloo_timeout
from .config import HookConfig
from .runtime import SlimeRuntime
from .tensors import Chunk, TensorPublisher, slime_collective
from .tracking import log_metrics

__all__ = ["ACTOR_MODULE", "GATHER_MODULE", "check_live_tensor_args", "make_actor_cls"]

log = logging.getLogger(__name__)

ACTOR_MODULE = "slime.backends.megatron_utils.actor"
"""Where slime's ``MegatronTrainRayActor`` lives."""

GATHER_MODULE = "slime.backends.megatron_utils.update_weight.update_weight_from_distributed"
"""Where slime's ``UpdateWeightFromDistributed`` (the chunked gather) lives."""

_FIXES = {
    "megatron": "put Megatron-LM on PYTHONPATH (the slime image keeps it in /root/Megatron-LM)",
    "torch_memory_saver": "install torch_memory_saver (the slime image ships it)",
}


def check_live_tensor_args(args: argparse.Namespace) -> None:
    """Refuse slime flags the live-tensor actor cannot publish with, naming the flag.

    Raises:
        ConfigError: ``--colocate`` or ``--release-train`` is set.
    """
    if getattr(args, "colocate", False):
        raise ConfigError(
            "--colocate shares the training GPUs with local SGLang engines, and cwtrain runs none (its "
            "updater reads CPU copies the live-tensor actor does not use): drop --colocate"
        )
    if getattr(args, "release_train", False):
        raise ConfigError(
            "--release-train re-creates the train actors after each step, and the copy of the served weights "
            "every rank keeps with them: drop --release-train"
        )


def _import_actor_module() -> Any:
    """slime's actor module, or ``ImportError`` naming what is really missing."""
    try:
        return importlib.import_module(ACTOR_MODULE)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        where = getattr(sys.modules.get("slime"), "__file__", None)  # None: a bare folder named slime, not slime
        if missing == "slime" or (missing.startswith("slime.") and where is None):
            raise ImportError(
                f"{ACTOR_MODULE} is not importable: slime is not installed in this process (the slime image ships "
                f"it); the plug-in itself comes from a cwtrain checkout: {install_line(SLIME.plugin)}"
            ) from exc
        if missing.startswith("slime."):
            raise ImportError(
                f"slime is installed ({where}) but has no module {missing}: cwtrain's live-tensor actor needs "
                f"{ACTOR_MODULE}.MegatronTrainRayActor (slime 624b824 / v0.3.1 have it); use a slime that does"
            ) from exc
        top = missing.split(".")[0]
        fix = _FIXES.get(top, f"install {top} in this process")
        raise ImportError(
            f"slime is installed, but {ACTOR_MODULE} needs the module {missing!r}, which is not importable: {fix}"
        ) from exc


def _is_pp_source() -> bool:
    """DP rank 0 and TP rank 0 of its pipeline stage (the ranks holding gathered HF tensors)."""
    try:
        from megatron.core import mpu  # type: ignore[import-not-found]
    except ImportError:
        return True
    return bool(
        mpu.get_data_parallel_rank(with_context_parallel=True) == 0 and mpu.get_tensor_model_parallel_rank() == 0
    )


def _distributed() -> bool:
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def make_actor_cls(base: type[Any] | None = None) -> type[Any]:
    """The ``MegatronTrainRayActor`` subclass whose ``update_weights()`` publishes live tensors.

    Args:
        base: the class to extend (default: slime's ``MegatronTrainRayActor``).

    Raises:
        ImportError: slime, or a module slime's actor needs, is not importable (named, with the fix).
    """
    if base is None:
        base = _import_actor_module().MegatronTrainRayActor
    slime_module = sys.modules.get(base.__module__)
    timer = getattr(slime_module, "timer", None)  # slime's @timer, where the base module has it
    memory_saver = getattr(slime_module, "torch_memory_saver", None)

    class CoreWeaveTrainRayActor(base):  # type: ignore[misc, valid-type]
        """slime's train actor publishing each weight version by hot-load from its tensors."""

        _cwtrain: TensorPublisher | None = None
        _cwtrain_gather: Any = None

        def init(self, args: argparse.Namespace, role: str, *rest: Any, **kwargs: Any) -> Any:
            if role != "critic":  # the critic never publishes
                check_live_tensor_args(args)
            return super().init(args, role, *rest, **kwargs)

        def cwtrain_publisher(self) -> TensorPublisher:
            """This rank's publisher (config built on rank 0 and broadcast)."""
            if self._cwtrain is None:
                collective: Collective = slime_collective() if _distributed() else SingleProcess()
                config: HookConfig | str | None = None
                if collective.rank == 0:
                    try:
                        config = SlimeRuntime.current().hook_config(self.args)
                    except Exception as exc:  # the other ranks wait in the broadcast: tell them
                        config = f"{type(exc).__name__}: {exc}"
                config = collective.broadcast_object(config)
                if not isinstance(config, HookConfig):
                    raise CWTrainError(f"cwtrain publishing is misconfigured: {config}")
                start = int(getattr(self.args, "update_weight_start_version", 0) or 0)
                self._cwtrain = TensorPublisher(config, collective, start_version=start)
            return self._cwtrain

        def cwtrain_gather(self) -> Any:
            """slime's ``UpdateWeightFromDistributed``, built for its chunked gather alone.

            slime picks its updater from its flags, and the full-disk and colocate updaters
            have no chunked gather; this one is never connected to engines and never sends.
            """
            if self._cwtrain_gather is None:
                updater = getattr(self, "weight_updater", None)
                hf_config = getattr(self, "hf_config", None)
                model_name = getattr(self.args, "model_name", None) or getattr(updater, "model_name", None)
                if model_name is None and hf_config is not None:
                    model_name = type(hf_config).__name__.lower()  # slime's own rule
                gather = importlib.import_module(GATHER_MODULE).UpdateWeightFromDistributed(
                    self.args,
                    self.model,
                    weights_getter=lambda: self.weights_backuper.get("actor"),
                    model_name=model_name,
                    quantization_config=getattr(hf_config, "quantization_config", None),
                )
                gather._is_pp_src_rank = _is_pp_source()  # what connect_rollout_engines would set
                self._cwtrain_gather = gather
            return self._cwtrain_gather

        def cwtrain_chunks(self) -> Iterator[Chunk]:
            """The HF-named tensors this rank holds, one ``--update-weight-buffer-size`` chunk at a time."""
            gather = self.cwtrain_gather()
            yield from gather._iter_non_expert_chunks()
            yield from gather._iter_expert_chunks()

        def update_weights(self) -> None:
            args = self.args
            if getattr(args, "debug_train_only", False) or getattr(args, "debug_rollout_only", False):
                return
            offload = bool(getattr(args, "offload_train", False))
            if offload:  # train() left the weights paused and the process groups destroyed
                self.wake_up()
            extend_gloo_timeout(args)  # the other ranks wait on it while rank 0 commits and hot-loads
            saver = memory_saver.disable() if offload and memory_saver is not None else contextlib.nullcontext()
            with saver:
                publisher = self.cwtrain_publisher()
                metrics = publisher.publish_chunks(args, self.cwtrain_chunks())
                if getattr(args, "keep_old_actor", False):  # slime's weight queue, as its update_weights moves it
                    if getattr(args, "update_weights_interval", 1) == 1:
                        self.weights_backuper.copy(src_tag="rollout_actor", dst_tag="old_actor")
                        self.weights_backuper.backup("rollout_actor")
                    else:
                        self.weights_backuper.backup("old_actor")
            if offload:
                self.sleep()
            if metrics is not None:
                log_metrics(args, metrics, run_id=publisher.config.run_id)

        if callable(timer):
            update_weights = timer(update_weights)

    CoreWeaveTrainRayActor.__qualname__ = CoreWeaveTrainRayActor.__name__
    return CoreWeaveTrainRayActor
