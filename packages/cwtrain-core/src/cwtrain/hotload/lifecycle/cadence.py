"""When a publisher cuts its chain with a FULL snapshot: :class:`ChainCadence`.

One object per publisher (the session owns it; snapshot-format.md section 10, and issue 25
for ``auto``)::

    cadence = ChainCadence(settings.full_every)   # CWTRAIN_HOTLOAD_FULL_EVERY: auto (default) or 0-64
    reason = cadence.reason(version)              # before anything is measured: FIRST, FAILED,
                                                  # COUNT, CHAIN_LIMIT, or NONE (a delta, for now)
    limit = cadence.delta_limit()                 # auto: a delta of at least this many bytes is FULL
    reason = cadence.cost_reason(delta_bytes)     # SHARE, REPLAY or NONE, from the encoded size
    cadence.published(full=True, snapshot_bytes=n)  # after the hot-load of that version completed
    cadence.failed()                              # the replicas keep what they served: next is FULL

**A fixed count** (``full_every`` = N in 1..64): version ``V`` is FULL when ``V % N == 0``;
0 never cuts by count. **``auto``** weighs what each delta costs against a FULL snapshot,
from the sizes the publish path measures anyway (the last FULL's stored bytes, the deltas'
stored bytes since, this delta's compressed size before it is uploaded). A version is FULL
when:

* its delta is at least ``full_share`` (0.9) of the last FULL's bytes (``SHARE``): the FULL
  costs about the same upload, spares every replica the apply, and resets the chain;
* the chain's deltas with this one would make a cold replica replay more than
  ``replay_budget`` (2) FULLs' worth of bytes after the FULL (``REPLAY``): a cold start
  never reads more than ``1 + replay_budget`` FULLs;
* the chain already holds 19 deltas (``COUNT``: the 20th version after a FULL, as
  ``FULL_EVERY=20`` does);
* one more delta would pass the 63 a cold replica replays (``CHAIN_LIMIT``, in every mode).

In every mode the first version of a session and the one after a failed publish are FULL.
Every publisher drives the cadence through
:class:`~cwtrain.hotload.lifecycle.session.PublishSession`; none of them writes the rule again.

:class:`CutReason` is the ``hotload/cut_reason`` metric (metrics are floats):

==== =============== ==================================================================
code name            the version is FULL because
==== =============== ==================================================================
0    ``none``        it is not: a delta (or nothing was published)
1    ``first``       nothing of this session is served yet (the baseline, a new process)
2    ``requested``   the publisher asked for FULL (slime's full mode)
3    ``failed``      the previous publish failed: the replicas keep what they served
4    ``count``       the count: ``V % N == 0``, or with ``auto`` 19 deltas in the chain
5    ``chain_limit`` one more delta would pass 63
6    ``share``       ``auto``: the delta is at least ``full_share`` of a FULL
7    ``replay``      ``auto``: the chain's deltas would pass ``replay_budget`` FULLs
==== =============== ==================================================================
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from enum import IntEnum
from typing import Literal

from cwtrain.errors import ConfigError
from cwtrain.hotload.format.chain import MAX_CHAIN_DELTAS

__all__ = [
    "AUTO",
    "AUTO_COUNT_BOUND",
    "DEFAULT_FULL_EVERY",
    "DEFAULT_FULL_SHARE",
    "DEFAULT_REPLAY_BUDGET",
    "MAX_FULL_EVERY",
    "ChainCadence",
    "CutReason",
    "FullEvery",
    "check_full_every",
    "check_full_share",
    "check_replay_budget",
    "parse_full_every",
]

log = logging.getLogger(__name__)

#: The cadence value that weighs each delta against a FULL snapshot.
AUTO: Literal["auto"] = "auto"
FullEvery = int | Literal["auto"]
"""``CWTRAIN_HOTLOAD_FULL_EVERY``: ``"auto"`` or a count in 0..64."""

#: ``CWTRAIN_HOTLOAD_FULL_EVERY``'s default (the settings' field default is this constant).
DEFAULT_FULL_EVERY: FullEvery = AUTO
#: The largest FULL cadence: a chain then never holds more than 63 deltas.
MAX_FULL_EVERY = 64
#: With ``auto``, a chain holds at most this many versions (its FULL and 19 deltas), as with 20.
AUTO_COUNT_BOUND = 20
#: With ``auto``, a delta of at least this share of a FULL snapshot's bytes is published FULL.
DEFAULT_FULL_SHARE = 0.9
#: With ``auto``, the deltas of a chain hold at most this many FULL snapshots' bytes.
DEFAULT_REPLAY_BUDGET = 2.0


class CutReason(IntEnum):
    """Why a version is FULL (``NONE``: it is a delta); the value is the ``hotload/cut_reason`` metric."""

    NONE = 0
    FIRST = 1
    REQUESTED = 2
    FAILED = 3
    COUNT = 4
    CHAIN_LIMIT = 5
    SHARE = 6
    REPLAY = 7

    @property
    def label(self) -> str:
        """The lower-case name (``share``, ``chain_limit``, ...), as logs and reports show it."""
        return self.name.lower()


def check_full_every(full_every: FullEvery) -> FullEvery:
    """Validate a cadence value given explicitly: ``"auto"`` (any case) or an integer in 0..64.

    Raises:
        ConfigError: anything else.
    """
    if isinstance(full_every, str) and full_every.strip().lower() == AUTO:
        return AUTO
    if isinstance(full_every, bool) or not isinstance(full_every, int) or not 0 <= full_every <= MAX_FULL_EVERY:
        raise ConfigError(f"full_every={full_every!r} must be auto or an integer in 0..{MAX_FULL_EVERY}")
    return full_every


def parse_full_every(text: str, what: str = "CWTRAIN_HOTLOAD_FULL_EVERY") -> FullEvery:
    """Parse ``auto`` or an integer in 0..64 from text (a variable, a CLI option).

    Raises:
        ConfigError: naming ``what``.
    """
    value = text.strip()
    if value.lower() == AUTO:
        return AUTO
    try:
        number = int(value, 10)
    except ValueError:
        raise ConfigError(f"{what}={text!r} is not auto or an integer (0-{MAX_FULL_EVERY})") from None
    if not 0 <= number <= MAX_FULL_EVERY:
        raise ConfigError(f"{what}={text!r} is out of range (auto, or 0..{MAX_FULL_EVERY})")
    return number


def check_full_share(share: float, what: str = "full_share") -> float:
    """A share of a FULL snapshot in (0, 1].

    Raises:
        ConfigError: naming ``what``.
    """
    if isinstance(share, bool) or not isinstance(share, int | float) or not (math.isfinite(share) and 0 < share <= 1):
        raise ConfigError(f"{what}={share!r} must be a share of a FULL snapshot in (0, 1], e.g. 0.9")
    return float(share)


def check_replay_budget(budget: float, what: str = "replay_budget") -> float:
    """A number of FULL snapshots' bytes, finite and > 0.

    Raises:
        ConfigError: naming ``what``.
    """
    if isinstance(budget, bool) or not isinstance(budget, int | float) or not (math.isfinite(budget) and budget > 0):
        raise ConfigError(f"{what}={budget!r} must be a finite number of FULL snapshots > 0, e.g. 2")
    return float(budget)


@dataclass
class ChainCadence:
    """When a version must be published FULL (see the module docstring for the rules).

    Attributes:
        full_every: ``"auto"``, or FULL every this many versions (0 = never by count; warns once).
        full_share: ``auto``: a delta of at least this share of the last FULL's bytes is FULL.
        replay_budget: ``auto``: the chain's deltas hold at most this many FULLs' bytes.
        deltas_in_chain: deltas published since the chain's FULL root.
        force_full: the next version must be FULL (nothing published yet, or a failure).
        full_bytes: stored bytes of the chain's FULL snapshot (``None``: not known; the
            cost rules then wait for a FULL whose size is known).
        chain_bytes: stored bytes of the chain's deltas.
        after_failure: ``force_full`` was set by a failed publish.
    """

    full_every: FullEvery = DEFAULT_FULL_EVERY
    full_share: float = DEFAULT_FULL_SHARE
    replay_budget: float = DEFAULT_REPLAY_BUDGET
    deltas_in_chain: int = 0
    force_full: bool = True
    full_bytes: int | None = None
    chain_bytes: int = 0
    after_failure: bool = False

    def __post_init__(self) -> None:
        self.full_every = check_full_every(self.full_every)
        self.full_share = check_full_share(self.full_share)
        self.replay_budget = check_replay_budget(self.replay_budget)
        if self.full_every == 0:
            log.warning(
                "CWTRAIN_HOTLOAD_FULL_EVERY=0: chains are never cut by count; a replica starting cold replays "
                "at most %d deltas (the API accepts 128), so a FULL snapshot is still due before a chain passes it",
                MAX_CHAIN_DELTAS,
            )

    @property
    def auto(self) -> bool:
        """Whether the cost rules apply (``full_every="auto"``)."""
        return self.full_every == AUTO

    @property
    def replay_bytes(self) -> int:
        """Bytes a cold replica reads to serve the chain's head: its FULL and every delta since."""
        return (self.full_bytes or 0) + self.chain_bytes

    def reason(self, version: int) -> CutReason:
        """Why ``version`` must be FULL before anything is measured (``NONE``: a delta, unless its cost says otherwise)."""
        if self.force_full:
            return CutReason.FAILED if self.after_failure else CutReason.FIRST
        if self.auto:
            if self.deltas_in_chain + 1 >= AUTO_COUNT_BOUND:
                return CutReason.COUNT
        elif isinstance(self.full_every, int) and self.full_every > 0 and version % self.full_every == 0:
            return CutReason.COUNT
        if self.deltas_in_chain + 1 > MAX_CHAIN_DELTAS:
            return CutReason.CHAIN_LIMIT
        return CutReason.NONE

    def is_full(self, version: int) -> bool:
        """Whether ``version`` must be published FULL before anything is measured."""
        return self.reason(version) is not CutReason.NONE

    def _limits(self) -> tuple[int, int] | None:
        """``(share_at, replay_at)``: the smallest delta sizes that cut by each cost rule; ``None``: no cost rule."""
        if not self.auto or not self.full_bytes:
            return None
        share_at = max(1, math.ceil(self.full_share * self.full_bytes))
        replay_at = max(1, math.floor(self.replay_budget * self.full_bytes) - self.chain_bytes + 1)
        return share_at, replay_at

    def delta_limit(self) -> int | None:
        """With ``auto``: the smallest delta (bytes as stored) that is published FULL instead; ``None`` otherwise.

        The same integer on every rank of a distributed publish, so each can compare the
        all-gathered sizes with it and reach the committing process's verdict.
        """
        limits = self._limits()
        return min(limits) if limits is not None else None

    def cost_reason(self, delta_bytes: int) -> CutReason:
        """``SHARE``, ``REPLAY`` or ``NONE`` for a delta of ``delta_bytes`` (as it would be stored)."""
        limits = self._limits()
        if limits is None:
            return CutReason.NONE
        share_at, replay_at = limits
        if delta_bytes >= share_at:
            return CutReason.SHARE
        if delta_bytes >= replay_at:
            return CutReason.REPLAY
        return CutReason.NONE

    def describe(self, delta_bytes: int) -> str:
        """``delta 12.0 KiB = 5.6 % of a FULL; replay 1.3 FULLs with it`` (for the decision's log line)."""
        if not self.full_bytes:
            return f"delta {delta_bytes} B; the FULL's size is not known"
        share = delta_bytes / self.full_bytes
        replay = (self.chain_bytes + delta_bytes) / self.full_bytes
        return (
            f"delta {delta_bytes} B = {share:.1%} of the last FULL ({self.full_bytes} B); the chain's deltas with it "
            f"= {replay:.2f} FULLs (cuts at {self.full_share:.0%} and {self.replay_budget:g})"
        )

    def published(self, *, full: bool, snapshot_bytes: int | None = None) -> None:
        """Record a published snapshot (FULL resets the chain, a delta lengthens it).

        Args:
            full: FULL or delta.
            snapshot_bytes: its stored bytes (every object); ``None`` or 0 when not known
                (a FULL of unknown size leaves the cost rules off until one is known).
        """
        if full:
            self.deltas_in_chain = 0
            self.chain_bytes = 0
            self.full_bytes = snapshot_bytes or None
        else:
            self.deltas_in_chain += 1
            self.chain_bytes += snapshot_bytes or 0
        self.force_full = False
        self.after_failure = False

    def failed(self) -> None:
        """Record a failed publish: the next version is FULL."""
        self.force_full = True
        self.after_failure = True
