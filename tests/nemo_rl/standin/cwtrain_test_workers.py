"""Test-side policy workers for the distributed NeMo-RL test (run inside Ray workers).

Each holds one rank's share of a model as torch tensors, as a sharded policy would, and
publishes it through cwtrain's worker mixin.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from cwtrain.integrations.nemo_rl.publish import PublishPlan, ShareResult
from cwtrain.integrations.nemo_rl.worker_mixin import HotLoadWorkerMixin


class HalfWorker(HotLoadWorkerMixin):
    """Rank ``rank`` of ``world_size``: keeps tensors ``rank, rank + world_size, ...``."""

    def __init__(self, rank: int, world_size: int, weights: Mapping[str, torch.Tensor]) -> None:
        self.rank = rank
        self.world_size = world_size
        self.sizes = [(name, t.numel() * t.element_size()) for name, t in weights.items()]
        self.mine = {name: t.clone() for i, (name, t) in enumerate(weights.items()) if i % world_size == rank}

    def cwtrain_rank(self) -> tuple[int, int]:
        return self.rank, self.world_size

    def cwtrain_publish_share(self, plan: PublishPlan) -> ShareResult:
        return self.cwtrain_publisher().publish_share(self.sizes, self.mine, plan)

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
