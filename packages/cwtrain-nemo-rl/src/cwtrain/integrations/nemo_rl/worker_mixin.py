"""The publishing half of cwtrain's NeMo-RL policy workers (framework-neutral, needs torch).

:class:`HotLoadWorkerMixin` adds to a policy worker the methods the driver's
:class:`~cwtrain.integrations.nemo_rl.synchronizer.HotLoadWeightSynchronizer` calls
through ``policy.run_all_workers_single_data(...)`` on every rank:

- ``cwtrain_encode_share(plan)`` — iterate the gathering generator (a collective, so every
  rank must) through core's ``RankShare.encode_owned``: tensor ``i`` is this rank's when
  ``i % world_size == rank``, XORed against its served copy on the device and kept; returns
  core's ``ShareResult`` with its shard bytes (an error is reported in it, not raised);
- ``cwtrain_cut_share(plan)`` — the driver cut the version FULL: the FULL share built from
  the served copy (nothing is gathered again);
- ``cwtrain_store_share(plan)`` — upload the kept share;
- ``cwtrain_commit_share()`` / ``cwtrain_discard_share()`` — after the hot-load
  completed / failed.

These are the steps of core's share protocol (:func:`cwtrain.hotload.publish_shares`), which
the driver runs through :class:`~cwtrain.integrations.nemo_rl.synchronizer.WorkerRanks`.
- ``export_hf_checkpoint(path, ...)`` — the same tensors as an HF checkpoint on disk, for
  users who want one (rank 0 writes; every rank iterates).

A subclass provides :meth:`cwtrain_params` (the generator) and may override
:meth:`cwtrain_rank`. Each worker keeps one ``RankShare(on_device=True)`` for the run
(:meth:`HotLoadWorkerMixin.cwtrain_share`): the served copy of its share stays where the
tensors live.

With ``policy.dtensor_cfg.cpu_offload`` the DTensor worker keeps its model in host memory
between phases; as NeMo-RL's own refit paths do, publishing and exporting first move it to
the GPU (``self.model = self.move_to_cuda(self.model)``) and put it back afterwards
(``move_to_cpu``), whether the publish succeeded or not (:meth:`HotLoadWorkerMixin.cwtrain_model_on_device`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from cwtrain.hotload import RankShare, SharePlan, ShareResult, side_files, tensor_data

__all__ = ["HotLoadWorkerMixin"]

_FOUR_GIB = 4 << 30


class HotLoadWorkerMixin:
    """Adds hot-load publishing to a NeMo-RL policy worker."""

    _cwtrain_share: RankShare | None = None

    def cwtrain_params(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every ``(hf_name, tensor)`` of the model, identical order on every rank."""
        raise NotImplementedError

    def cwtrain_rank(self) -> tuple[int, int]:
        """``(rank, world_size)`` from torch.distributed (``(0, 1)`` when it is not initialized)."""
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank(), torch.distributed.get_world_size()
        return 0, 1

    def cwtrain_share(self) -> RankShare:
        """This worker's ``RankShare``, served copy on the device (a new one when the rank or world size changed)."""
        rank, world = self.cwtrain_rank()
        share = self._cwtrain_share
        if share is None or (share.rank, share.world_size) != (rank, world):
            share = self._cwtrain_share = RankShare(rank, world, on_device=True)
        return share

    @contextmanager
    def cwtrain_model_on_device(self) -> Iterator[None]:
        """The model on the GPU for the duration, when the worker offloads it to the CPU.

        A worker with a true ``cpu_offload`` attribute (NeMo-RL's DTensor worker) has its
        model moved with its own ``move_to_cuda`` before and ``move_to_cpu`` after; any other
        worker is left alone.
        """
        if not getattr(self, "cpu_offload", False):
            yield
            return
        worker: Any = self
        worker.model = worker.move_to_cuda(worker.model)
        try:
            yield
        finally:
            worker.model = worker.move_to_cpu(worker.model)

    def cwtrain_encode_share(self, plan: SharePlan) -> ShareResult:
        """Encode this rank's share and keep it; report its shard bytes (the driver weighs the delta)."""
        with self.cwtrain_model_on_device():
            return self.cwtrain_share().encode_owned(plan, self.cwtrain_params())

    def cwtrain_cut_share(self, plan: SharePlan) -> ShareResult:
        """The driver cut the version FULL: build this rank's FULL share from its served copy."""
        return self.cwtrain_share().cut(plan)

    def cwtrain_store_share(self, plan: SharePlan) -> ShareResult:
        """Upload the share :meth:`cwtrain_encode_share` (or :meth:`cwtrain_cut_share`) kept; the object store from the environment."""
        return self.cwtrain_share().store_encoded(plan, (), None)

    def cwtrain_commit_share(self) -> None:
        """The hot-load completed: the published weights are now the served copy."""
        self.cwtrain_share().commit()

    def cwtrain_discard_share(self) -> None:
        """The hot-load failed: keep the previous served copy."""
        self.cwtrain_share().discard()

    def export_hf_checkpoint(
        self,
        path: str,
        allowed_names: Sequence[str] | None = None,
        config_dir: str | None = None,
        shard_bytes: int = _FOUR_GIB,
        dtypes: dict[str, Any] | None = None,
    ) -> str | None:
        """Write the weights as an HF safetensors checkpoint (rank 0 writes, all iterate).

        Args:
            path: the output directory.
            allowed_names: only these tensors (default all).
            config_dir: a directory whose config and tokenizer files
                (:func:`~cwtrain.hotload.side_files`) are copied beside the shards.
            shard_bytes: payload limit of one shard (HF-style 1-based names when several).
            dtypes: tensor name → torch dtype to cast to.

        Returns:
            ``path`` on rank 0, ``None`` elsewhere.
        """
        from cwtrain.hotload import DeltaEncoder

        rank, _ = self.cwtrain_rank()
        tensors = {}
        allowed = set(allowed_names) if allowed_names is not None else None
        with self.cwtrain_model_on_device():
            for name, tensor in self.cwtrain_params():
                if allowed is not None and name not in allowed:
                    continue
                if rank == 0:
                    cast = (dtypes or {}).get(name)
                    value = tensor.to(cast) if cast is not None else tensor
                    tensors[name] = tensor_data(value.detach().to("cpu").contiguous())
        if rank != 0:
            return None
        out = Path(path)
        if out.exists():
            raise FileExistsError(f"{out} already exists; export into a new directory")
        partial = out.with_name(out.name + ".partial")
        partial.mkdir(parents=True, exist_ok=True)
        with DeltaEncoder(shard_bytes=shard_bytes) as encoder:
            snap = encoder.encode_full(tensors)
        for file in snap.all_files:
            file.write_to(partial / file.name)
        if config_dir:
            for name, data in side_files(config_dir).items():
                (partial / name).write_bytes(data)
        os.replace(partial, out)  # all or nothing: a crash leaves only the .partial directory
        return str(out)
