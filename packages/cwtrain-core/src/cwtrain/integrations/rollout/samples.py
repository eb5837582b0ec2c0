"""Filling slime/miles ``Sample`` objects from completions (frameworks.md §1.3, §2)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from cwtrain.errors import RolloutError
from cwtrain.integrations.rollout.responses import Completion

__all__ = ["fill_group", "served_version"]

_VERSION = re.compile(r"-v(\d{6,})$")


def served_version(identity: str | None) -> str | None:
    """The weight version an identity names: ``"7"`` for ``run-v000007``; other identities as they are."""
    if identity is None:
        return None
    match = _VERSION.search(identity)
    return str(int(match.group(1))) if match else identity


def fill_group[S](samples: Sequence[S], completions: Sequence[Completion]) -> list[S]:
    """Write one group's completions into its ``Sample`` objects, in order.

    Sets ``tokens`` (prompt + completion ids), ``response``, ``response_length``,
    ``status`` (``TRUNCATED`` iff ``finish_reason == "length"``, else ``COMPLETED``, from the
    sample class's ``Status``), ``rollout_log_probs`` (list or ``None``),
    ``rollout_routed_experts`` (int32 ``[len(tokens) - 1, layers, top_k]``, when routed) and
    appends the served version to ``weight_versions`` (``"7"`` for ``<run>-v000007``).

    Args:
        samples: the group's ``Sample`` objects (slime ``slime.utils.types.Sample`` or miles').
        completions: the group's completions, same count.

    Returns:
        the same sample objects, filled.

    Raises:
        RolloutError: the counts differ.
    """
    if len(samples) != len(completions):
        raise RolloutError(f"a group of {len(samples)} samples got {len(completions)} completions")
    for sample, completion in zip(samples, completions, strict=True):
        target: Any = sample
        target.tokens = completion.tokens
        target.response = completion.text
        target.response_length = len(completion.response_ids)
        status = getattr(type(sample), "Status", None)
        if status is not None:
            target.status = status.TRUNCATED if completion.truncated else status.COMPLETED
        target.rollout_log_probs = list(completion.logprobs) if completion.logprobs is not None else None
        if completion.routed_experts is not None:
            target.rollout_routed_experts = completion.routed_experts
        version = served_version(completion.identity)
        if version is not None:
            versions = getattr(sample, "weight_versions", None)
            if versions is None:
                target.weight_versions = [version]
            else:
                versions.append(version)
    return list(samples)
