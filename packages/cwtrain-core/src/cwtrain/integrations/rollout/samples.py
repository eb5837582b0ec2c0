"""Filling slime/miles ``Sample`` objects from completions (frameworks.md §1.3, §2)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cwtrain.errors import RolloutError
from cwtrain.hotload.format.identity import identity_version
from cwtrain.integrations.rollout.responses import Completion

__all__ = ["fill_group", "version_tag"]


def version_tag(identity: str | None, run_id: str | None) -> str | None:
    """What a sample served by ``identity`` records as its weight version.

    ``"7"`` for ``<run_id>-v000007`` (:func:`cwtrain.hotload.format.identity.identity_version`);
    any other identity (another run's, ``initial``), or any identity when ``run_id`` is not
    known, as it is, so that it never passes for one of this run's versions; ``None`` for
    no identity.
    """
    if identity is None:
        return None
    version = identity_version(identity, run_id) if run_id is not None else None
    return str(version) if version is not None else identity


def fill_group[S](samples: Sequence[S], completions: Sequence[Completion]) -> list[S]:
    """Write one group's completions into its ``Sample`` objects, in order.

    Sets ``tokens`` (prompt + completion ids), ``response``, ``response_length``,
    ``status`` (``TRUNCATED`` iff ``finish_reason == "length"``, else ``COMPLETED``, from the
    sample class's ``Status``), ``rollout_log_probs`` (list or ``None``),
    ``rollout_routed_experts`` (int32 ``[len(tokens) - 1, layers, top_k]``, when routed) and
    appends the served weight version to ``weight_versions`` (slime's ``list[str]``): ``"7"``
    when the sampler that served it knew its run and ``<run>-v000007`` is a version of it
    (:attr:`Completion.version`), else the identity as it is (another run's, ``initial``), so
    a sample served by another run's weights never counts as one of this run's versions.
    Nothing is appended when the endpoint named no identity.

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
        tag = str(completion.version) if completion.version is not None else completion.identity
        if tag is not None:
            versions = getattr(sample, "weight_versions", None)
            if versions is None:
                target.weight_versions = [tag]
            else:
                versions.append(tag)
    return list(samples)
