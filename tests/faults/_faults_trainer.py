"""A tiny trainer for the fault suite: the local model's weights, changed a little per step."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import torch

from cwtrain.hotload.loader import HotLoader
from cwtrain.infra.models import HotLoad
from cwtrain.local.engine.model import ModelConfig, init_weights


@dataclass
class Trainer:
    """Publishes its weights to a deployment; keeps the byte-exact copy of what is served."""

    loader: HotLoader
    run: str
    weights: dict[str, torch.Tensor] = field(default_factory=lambda: init_weights(seed=0))
    served: dict[str, torch.Tensor] | None = None
    served_identity: str | None = None
    version: int = 0

    def step(self, scale: float = 0.02) -> None:
        """An optimizer step: perturb half of the tensors."""
        gen = torch.Generator().manual_seed(1000 + self.version)
        for i, name in enumerate(sorted(self.weights)):
            if (i + self.version) % 2 == 0:
                t = self.weights[name]
                self.weights[name] = (t.float() + scale * torch.randn(t.shape, generator=gen)).to(t.dtype)

    def identity(self, version: int | None = None) -> str:
        return f"{self.run}-v{self.version if version is None else version:06d}"

    def publish(self, *, full: bool = False, **kwargs: Any) -> HotLoad:
        """Publish the next version (a delta against the served copy unless ``full``)."""
        identity = self.identity()
        delta = not full and self.served is not None
        hot_load = self.loader.publish(
            dict(self.weights),
            identity,
            previous_identity=self.served_identity if delta else None,
            base=self.served if delta else None,
            extra_files=None if delta else {"config.json": json.dumps(ModelConfig().to_json()).encode()},
            **kwargs,
        )
        self.served = {k: v.clone() for k, v in self.weights.items()}
        self.served_identity = identity
        self.version += 1
        return hot_load
