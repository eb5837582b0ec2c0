"""The sample canary on NeMo-RL: each served version judged from ``prev_logprobs`` against the generation's.

``grpo_train`` computes the policy's log-probs of every sampled token (``prev_logprobs``,
from the weights the last refit published) and keeps the log-probs the deployment returned
(``generation_logprobs``); it compares them itself in
``compute_and_apply_seq_logprob_error_masking``, which the setup wrapper rebinds
(:mod:`~cwtrain.integrations.nemo_rl.refit`) so that, before NeMo-RL's own masking,
:func:`judge_train_data` runs core's :class:`~cwtrain.integrations.rollout.sample_canary.SampleCanary`
on the batch: no forward pass of cwtrain's own.

Each assistant message of a row (a run of ``token_mask``) is one completion; the identity
that served it is the samplers' ledger's, by the row's tokens up to the message's end (its
request's prompt, then the completion) (the generation's sampler and,
with NeMo Gym, the model_server endpoint's share one). The identity the last refit published
is judged on its completions; a gap beyond ``CWTRAIN_HOTLOAD_CANARY_BOUND`` refuses it as a
failed hot-load (the fleet is brought back, the next refit publishes FULL), and every row
holding one of its completions gets ``sample_mask`` 0, before the advantages are computed.
``hotload/canary_*`` go to the run logger.

Not judged, said once at setup (:func:`announce`): ``loss_fn.force_on_policy_ratio`` without
``grpo.seq_logprob_error_threshold`` (``grpo_train`` then skips ``prev_logprobs``), a
generation ``temperature`` other than 1 (the served log-probs are of another distribution
than the policy's), ``CWTRAIN_HOTLOAD_CANARY_BOUND=off``. Pass a probe canary
(``HotLoadWeightSynchronizer.session.canary``) to check such runs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

import torch

from cwtrain.integrations.rollout import SampleCanary, SampleVerdict, ServedLedger

__all__ = ["announce", "arm", "judge_train_data", "not_judged", "segments"]

log = logging.getLogger(__name__)


def not_judged(master_config: Any, generation: Mapping[str, Any], bound: float | None) -> str | None:
    """Why this configuration's versions cannot be judged from its own log-probs, or ``None`` when they can."""
    if bound is None:
        return "CWTRAIN_HOTLOAD_CANARY_BOUND is off"
    configured = generation.get("temperature")
    temperature = 1.0 if configured is None else float(configured)
    if temperature != 1.0:
        return f"policy.generation.temperature is {temperature:g}, not 1 (the served log-probs are of another distribution)"
    loss_fn = _section(master_config, "loss_fn") or {}
    grpo = _section(master_config, "grpo") or {}
    if _get(loss_fn, "force_on_policy_ratio") and _get(grpo, "seq_logprob_error_threshold") is None:
        return "loss_fn.force_on_policy_ratio is set without grpo.seq_logprob_error_threshold (no prev_logprobs)"
    return None


def announce(reason: str | None) -> None:
    """Say once, at setup, that the sample canary does not run and why."""
    if reason is not None:
        log.warning(
            "the sample canary does not judge this run's versions: %s; a replica serving wrong weights under the new "
            "identity goes unseen unless a probe canary is set (HotLoadWeightSynchronizer.session.canary)",
            reason,
        )


def arm(generation: Any, master_config: Any, generation_config: Mapping[str, Any]) -> SampleCanary | None:
    """Give a coreweave generation's synchronizer its sample canary, or say once why it gets none.

    :meth:`GrpoHooks.arm_canary <cwtrain.integrations.nemo_rl.refit.GrpoHooks.arm_canary>` calls it
    (the setup wrapper does, for a coreweave generation) and rebinds ``grpo_train``'s masking
    step, which then judges every batch of ``generation``.

    Returns:
        the canary, or ``None`` (not a coreweave generation with cwtrain's synchronizer, or a
        configuration that cannot be judged).
    """
    from cwtrain.integrations.nemo_rl.generation import CoreWeaveGeneration
    from cwtrain.integrations.nemo_rl.synchronizer import HotLoadWeightSynchronizer

    if not isinstance(generation, CoreWeaveGeneration):
        return None
    sync = generation.weight_synchronizer
    if not isinstance(sync, HotLoadWeightSynchronizer):
        return None
    bound = sync.settings.canary_bound
    reason = not_judged(master_config, generation_config, bound)
    announce(reason)
    sync.sample_canary = SampleCanary(sync.session, bound=bound) if reason is None and bound is not None else None
    return sync.sample_canary


def segments(train_data: Mapping[str, Any]) -> Iterator[tuple[int, tuple[int, ...], list[float], list[float]]]:
    """``(row, tokens, served log-probs, trainer log-probs)`` of each assistant message of each row in the batch.

    ``tokens`` are the row's up to the message's end: the prompt its request sent, then the
    completion (what the samplers' ledger is keyed by).
    """
    ids = train_data["input_ids"].detach().cpu()
    mask = train_data["token_mask"].detach().cpu() > 0
    served = train_data["generation_logprobs"].detach().cpu().float()
    trainer = train_data["prev_logprobs"].detach().cpu().float()
    lengths = [int(x) for x in train_data["input_lengths"]]
    sample_mask = train_data["sample_mask"].detach().cpu()
    for row, length in enumerate(lengths):
        if not float(sample_mask[row]):
            continue
        flags = mask[row, :length].tolist()
        start = None
        for position, on in enumerate([*flags, False]):
            if on and start is None:
                start = position
            elif not on and start is not None:
                yield (
                    row,
                    tuple(ids[row, :position].tolist()),
                    served[row, start:position].tolist(),
                    trainer[row, start:position].tolist(),
                )
                start = None


def judge_train_data(canary: SampleCanary, ledger: ServedLedger, train_data: MutableMapping[str, Any]) -> SampleVerdict:
    """Judge the batch's newest version from its log-probs; a refused version's rows get ``sample_mask`` 0."""
    rows: list[tuple[int, str | None]] = []
    samples = []
    for row, tokens, served, trainer in segments(train_data):
        identity = ledger.identity_of(tokens)
        rows.append((row, identity))
        samples.append((identity, served, trainer))
    verdict = canary.check(samples)
    dropped = sorted({row for row, identity in rows if not verdict.keep(identity)})
    if dropped:
        sample_mask = train_data["sample_mask"].clone()
        sample_mask[torch.tensor(dropped, dtype=torch.long)] = 0
        train_data["sample_mask"] = sample_mask
        log.warning("left %d rows served by the refused %s out of the batch", len(dropped), verdict.identity)
    return verdict


def _section(config: Any, name: str) -> Any:
    if isinstance(config, Mapping):
        return config.get(name)
    return getattr(config, name, None)


def _get(section: Any, name: str) -> Any:
    if isinstance(section, Mapping):
        return section.get(name)
    return getattr(section, name, None)
