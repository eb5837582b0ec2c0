"""Test-side policy workers for the distributed NeMo-RL test (run inside Ray workers).

Each holds one rank's share of a model as torch tensors, as a sharded policy would, and
publishes it through cwtrain's worker mixin, unchanged: ``cwtrain_params`` yields every
tensor of the model in one order on every rank, as NeMo-RL's gathering generators do, with
the other ranks' tensors as ``meta`` tensors of their shape and dtype (a rank reads only
their sizes, to agree on the shard names).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from cwtrain.integrations.nemo_rl.worker_mixin import HotLoadWorkerMixin


class HalfWorker(HotLoadWorkerMixin):
    """Rank ``rank`` of ``world_size``: keeps tensors ``rank, rank + world_size, ...``."""

    def __init__(self, rank: int, world_size: int, weights: Mapping[str, torch.Tensor]) -> None:
        self.rank = rank
        self.world_size = world_size
        self.order = list(weights)
        self.others = {name: torch.empty(t.shape, dtype=t.dtype, device="meta") for name, t in weights.items()}
        self.mine = {name: t.clone() for i, (name, t) in enumerate(weights.items()) if i % world_size == rank}

    def cwtrain_rank(self) -> tuple[int, int]:
        return self.rank, self.world_size

    def cwtrain_params(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name in self.order:
            yield name, self.mine.get(name, self.others[name])

    def train_step(self, seed: int) -> int:
        """Change about half of this share's tensors a little (an optimizer step)."""
        gen = torch.Generator().manual_seed(seed * 100 + self.rank)
        changed = 0
        for i, name in enumerate(sorted(self.mine)):
            if (i + seed) % 2 == 0:
                t = self.mine[name]
                self.mine[name] = (t.float() + 0.01 * torch.randn(t.shape, generator=gen)).to(t.dtype)
                changed += 1
        return changed

    def weights(self) -> dict[str, Any]:
        return {name: t.clone() for name, t in self.mine.items()}
