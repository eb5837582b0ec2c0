"""The canary every framework runs from the log-probs it computes anyway.

A framework that trains on remote samples computes its trainer's log-probs of the tokens it
sampled (for its loss, its importance ratios, its train–rollout mismatch metrics), and the
deployment returned the served log-probs of the same tokens with each sample. Compared per
served identity, they tell whether the fleet serves the weights the trainer published, at no
forward pass of cwtrain's own::

    from cwtrain.integrations.rollout.sample_canary import SampleCanary

    canary = SampleCanary(session)                       # the run's PublishSession
    verdict = canary.check(
        (ledger.identity_of(tokens), served, trainer)    # one per completion of the batch
        for tokens, served, trainer in segments
    )
    metrics.update(verdict.metrics())                    # hotload/canary_gap, ...
    keep = [verdict.keep(identity) for identity in sample_identities]   # leave the refused version out

**What is judged.** Only samples served by the identity the trainer's log-probs come from:
the session's served identity, when it is also the newest version the session attempted
(after a failed publish the trainer holds weights the fleet never served: nothing is
judged). Older samples carry the steps since and are left out; so are samples whose
identity is not known. The verdict is :func:`~cwtrain.integrations.rollout.canary.judge_samples`'s:
the largest sample gap (mean absolute log-prob difference over its tokens) against the bound.

**A refusal.** A gap beyond the bound is answered as a failed hot-load
(:meth:`PublishSession.refuse <cwtrain.hotload.lifecycle.session.PublishSession.refuse>`):
with ``on_failure="reactivate"`` the fleet is brought back to the newest other identity
whose chain can be replayed, the version is burned (the samplers re-request what it
serves), the next version is FULL, and :meth:`SampleVerdict.keep` is false for its samples;
with ``on_failure="stop"`` the error is raised.

**Which identity served a sample.** The sampler's
:class:`~cwtrain.integrations.rollout.ledger.ServedLedger` (``sampler.ledger``), asked with the
tokens the framework trains on; completions of equal tokens served by two identities are
not judged.

Temperature: served log-probs are of the distribution the engine sampled from; a trainer's
are at temperature 1 unless the framework scales them. The integrations judge only runs
that sample at temperature 1 and say once at start when they cannot judge.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cwtrain.integrations.rollout.canary import DEFAULT_CANARY_BOUND, CanaryResult, judge_samples

if TYPE_CHECKING:
    from cwtrain.hotload import PublishOutcome, PublishSession

__all__ = ["SampleCanary", "SampleVerdict"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SampleVerdict:
    """What one :meth:`SampleCanary.check` found.

    Attributes:
        identity: the identity judged (``None``: nothing was, see ``skipped``).
        result: the verdict on its samples (``None``: no sample of it had a token).
        refused: the refusal's outcome when the gap was beyond the bound.
        skipped: why nothing was judged, else ``None``.
    """

    identity: str | None = None
    result: CanaryResult | None = None
    refused: PublishOutcome | None = None
    skipped: str | None = None

    def keep(self, identity: str | None) -> bool:
        """Whether a sample served by ``identity`` stays in the batch (false for the refused identity's)."""
        return self.refused is None or identity != self.identity

    def metrics(self) -> dict[str, float]:
        """``hotload/canary_*`` of the verdict (none when nothing was judged)."""
        if self.result is None:
            return {}
        return {**self.result.metrics(), "hotload/canary_refused": 1.0 if self.refused is not None else 0.0}


class SampleCanary:
    """Judges each version the fleet serves from a framework's own log-probs, and refuses a wrong one.

    Args:
        session: the run's publish session (its served identity, and the refusal).
        bound: the bound on a sample's mean absolute log-prob gap, in nats.
    """

    def __init__(self, session: PublishSession, *, bound: float = DEFAULT_CANARY_BOUND) -> None:
        self.session = session
        self.bound = bound

    def judged_identity(self) -> str | None:
        """The identity the trainer's log-probs come from and the fleet serves, or ``None`` when they differ."""
        from cwtrain.hotload import identity_version

        served = self.session.served_identity
        if served is None:
            return None
        version = identity_version(served, self.session.run_id)
        if version is not None and version != self.session.last_attempted:
            return None  # the trainer holds a version the fleet does not serve (a failed publish)
        return served

    def check(self, samples: Iterable[tuple[str | None, Sequence[float], Sequence[float]]]) -> SampleVerdict:
        """Judge the samples served by the judged identity; refuse it when their gap is beyond the bound.

        Args:
            samples: ``(served identity, served log-probs, trainer log-probs)`` per completion.

        Raises:
            HotLoadVerificationError: refused, with ``on_failure="stop"``.
            CWTrainError: the re-activation after a refusal failed.
        """
        identity = self.judged_identity()
        if identity is None:
            return SampleVerdict(skipped="the trainer's weights are not what the fleet serves")
        result = judge_samples(samples, identity=identity, bound=self.bound)
        if result is None:
            return SampleVerdict(identity=identity, skipped=f"no sample of {identity} had a token")
        if result.passed:
            return SampleVerdict(identity=identity, result=result)
        log.error("%s serves weights that are not the trainer's: %s", identity, result.summary())
        refused = self.session.refuse(identity, result.summary(), gap=result.gap)
        return SampleVerdict(identity=identity, result=result, refused=refused)
