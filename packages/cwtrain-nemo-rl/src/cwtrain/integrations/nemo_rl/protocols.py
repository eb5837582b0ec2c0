"""What the plug-in needs of NeMo-RL's objects, as small Protocols.

NeMo-RL is not importable everywhere cwtrain is type-checked or tested, so the plug-in
types the few members it uses of NeMo-RL's objects here instead of their classes.
NeMo-RL's own objects satisfy them structurally, and so do the stand-ins of the tests::

    from cwtrain.integrations.nemo_rl.protocols import WorkerGroup

    def publish(policy: WorkerGroup) -> None:
        policy.run_all_workers_single_data("cwtrain_commit_share")

- :class:`WorkerGroup`: NeMo-RL's ``Policy`` as the synchronizer drives it.
- :class:`Tokenizer`: the ids :class:`~cwtrain.integrations.nemo_rl.generation.CoreWeaveGeneration`
  pads with (a HuggingFace tokenizer).
- :class:`WeightSync`: what NeMo-RL's refit calls on ``policy_generation.weight_synchronizer``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

__all__ = ["Tokenizer", "WeightSync", "WorkerGroup"]


class WorkerGroup(Protocol):
    """NeMo-RL's ``Policy`` as the synchronizer uses it: one method run on every worker."""

    def run_all_workers_single_data(self, method_name: str, /, **kwargs: Any) -> Sequence[Any]:
        """Call ``method_name(**kwargs)`` on every worker; Ray futures or the results, in rank order."""
        ...


class Tokenizer(Protocol):
    """The special-token ids of the trainer's tokenizer (``None`` when it has none)."""

    @property
    def pad_token_id(self) -> int | None:
        """The padding token id."""
        ...

    @property
    def eos_token_id(self) -> int | None:
        """The end-of-sequence token id."""
        ...


class WeightSync(Protocol):
    """NeMo-RL's ``WeightSynchronizer.sync_weights`` as the refit calls it."""

    def sync_weights(
        self, *, timer: object | None = None, kv_scales: Mapping[str, float] | None = None
    ) -> Mapping[str, float] | None:
        """Bring the generation's weights up to the policy's; metrics or ``None``."""
        ...
