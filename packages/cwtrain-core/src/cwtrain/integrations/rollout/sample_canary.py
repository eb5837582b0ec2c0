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
sequence the framework trains on (prompt, then completion); equal sequences served by two
identities in one batch are not judged.

Temperature: served log-probs are of the distribution the engine sampled from; a trainer's
are at temperature 1 unless the framework scales them. The integrations judge only runs
that sample at temperature 1 and say once at start when they cannot judge.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cwtrain.errors import CWTrainError, UsageError
from cwtrain.integrations.rollout.canary import DEFAULT_CANARY_BOUND, CanaryAnswer, CanaryResult, IdentityGap

if TYPE_CHECKING:
    from cwtrain.hotload import Collective, PublishOutcome, PublishSession

__all__ = ["SampleCanary", "SampleGap", "SampleVerdict", "judge_gaps", "judge_on_every_rank", "sample_gap"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SampleGap:
    """One completion's log-prob gap, in the few numbers that cross between processes.

    Attributes:
        key: what tells completions apart (a framework's sample index; the part of it a rank
            holds): equal gaps from ranks holding the same part are counted once.
        identity: the identity that served it (``None``: not known).
        total: the sum of ``|served - trainer|`` over its tokens (nats).
        largest: the largest difference of one token.
        tokens: how many tokens.
    """

    key: Hashable
    identity: str | None
    total: float
    largest: float
    tokens: int

    @property
    def gap(self) -> float:
        """The mean absolute difference over its tokens."""
        return self.total / self.tokens


def sample_gap(
    key: Hashable, identity: str | None, served: Sequence[float], trainer: Sequence[float]
) -> SampleGap | None:
    """The gap of one completion's served and trainer log-probs of the same tokens (``None``: no token).

    Raises:
        UsageError: the two sequences differ in length.
    """
    if len(served) != len(trainer):
        raise UsageError(f"sample {key!r}: {len(served)} served log-probs but {len(trainer)} trainer log-probs")
    if not len(served):
        return None
    diffs = [abs(float(s) - float(t)) if math.isfinite(float(s)) else math.inf for s, t in zip(served, trainer)]
    return SampleGap(key, identity, sum(diffs), max(diffs), len(diffs))


def judge_gaps(gaps: Iterable[SampleGap], *, identity: str, bound: float = DEFAULT_CANARY_BOUND) -> CanaryResult | None:
    """The verdict on the completions ``identity`` served: the largest gap against ``bound`` (``None``: none).

    :func:`~cwtrain.integrations.rollout.canary.judge_samples` from gaps already reduced
    (``answers`` hold no log-probs).

    Raises:
        UsageError: ``bound`` is not a finite number >= 0.
    """
    if not math.isfinite(bound) or bound < 0:
        raise UsageError(f"canary bound={bound!r} must be a finite number of nats >= 0")
    mine = [g for g in gaps if g.identity == identity and g.tokens]
    if not mine:
        return None
    answers = tuple(CanaryAnswer(i, g.identity, "samples", (), (), g.gap, g.largest) for i, g in enumerate(mine))
    tokens = sum(g.tokens for g in mine)
    gap = max(g.gap for g in mine)
    mean = sum(g.total for g in mine) / tokens
    largest = max(g.largest for g in mine)
    return CanaryResult(
        passed=gap <= bound,
        bound=bound,
        gap=gap,
        mean_gap=mean,
        max_token_gap=largest,
        tokens=tokens,
        expected_identity=identity,
        answers=answers,
        by_identity={identity: IdentityGap(identity, len(mine), tokens, gap, mean, largest)},
    )


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
        gaps = (sample_gap(index, *sample) for index, sample in enumerate(samples))
        return self.check_gaps([g for g in gaps if g is not None])

    def check_gaps(self, gaps: Iterable[SampleGap]) -> SampleVerdict:
        """:meth:`check` on gaps already reduced (:func:`sample_gap`)."""
        identity = self.judged_identity()
        if identity is None:
            return SampleVerdict(skipped="the trainer's weights are not what the fleet serves")
        result = judge_gaps(gaps, identity=identity, bound=self.bound)
        if result is None:
            return SampleVerdict(identity=identity, skipped=f"no sample of {identity} had a token")
        if result.passed:
            return SampleVerdict(identity=identity, result=result)
        log.error("%s serves weights that are not the trainer's: %s", identity, result.summary())
        refused = self.session.refuse(identity, result.summary(), gap=result.gap)
        return SampleVerdict(identity=identity, result=result, refused=refused)


def judge_on_every_rank(
    collective: Collective, gaps: Sequence[SampleGap], canary: SampleCanary | None
) -> tuple[str | None, SampleVerdict | None]:
    """One verdict for a batch spread over ranks: every rank's gaps judged by the rank that holds the session.

    Every rank calls it with the gaps of the completions it holds (none where it computed
    no log-probs); the gaps are gathered (a rank holding the same part of a completion as
    another, a tensor-parallel peer, is counted once), rank 0 judges them with ``canary``
    (the one built on its publish session; ``None`` elsewhere, and on rank 0 when nothing
    is judged), and every rank learns the identity refused.

    Returns:
        the identity refused (``None``: none), and rank 0's verdict (``None`` on other ranks).

    Raises:
        CWTrainError: on the other ranks, when rank 0's judging failed (rank 0 raises its own error).
    """
    gathered = collective.all_gather_object([tuple(_plain(g)) for g in gaps])
    merged = sorted({SampleGap(*g) for part in gathered for g in part}, key=_order)
    verdict: SampleVerdict | None = None
    answer: tuple[str, Any] = ("refused", None)
    error: BaseException | None = None
    if collective.rank == 0 and canary is not None:
        try:
            verdict = canary.check_gaps(merged)
            answer = ("refused", verdict.identity if verdict.refused is not None else None)
        except Exception as exc:  # the other ranks wait in the broadcast: tell them
            error, answer = exc, ("error", f"{type(exc).__name__}: {exc}")
    kind, value = collective.broadcast_object(answer)
    if error is not None:
        raise error
    if kind == "error":
        raise CWTrainError(f"the sample canary failed on rank 0: {value}")
    return value, verdict


def _plain(gap: SampleGap) -> tuple[Any, ...]:
    return (gap.key, gap.identity, gap.total, gap.largest, gap.tokens)


def _order(gap: SampleGap) -> tuple[str, str, float]:
    return (repr(gap.key), gap.identity or "", gap.total)
