"""When a publisher cuts its chain with a FULL snapshot: :class:`ChainCadence`.

One object per publisher (the session owns it; snapshot-format.md section 10)::

    cadence = ChainCadence(settings.full_every)   # CWTRAIN_HOTLOAD_FULL_EVERY, default 20, 0-64
    if cadence.is_full(version):                  # nothing served yet, a failed publish, N % F == 0,
        ...                                       # or one more delta would pass 63
    cadence.published(full=True)                  # after the hot-load of that version completed
    cadence.failed()                              # the replicas keep what they served: next is FULL

Every publisher drives it through :class:`~cwtrain.hotload.publish.session.PublishSession`;
none of them writes the rule again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from cwtrain.errors import ConfigError
from cwtrain.hotload.format.chain import MAX_CHAIN_DELTAS

__all__ = ["DEFAULT_FULL_EVERY", "MAX_FULL_EVERY", "ChainCadence", "check_full_every"]

log = logging.getLogger(__name__)

#: ``CWTRAIN_HOTLOAD_FULL_EVERY``'s default (the settings' field default is this constant).
DEFAULT_FULL_EVERY = 20
#: The largest FULL cadence: a chain then never holds more than 63 deltas.
MAX_FULL_EVERY = 64


def check_full_every(full_every: int) -> int:
    """Validate a cadence value given explicitly.

    Raises:
        ConfigError: not an integer in 0..64.
    """
    if isinstance(full_every, bool) or not isinstance(full_every, int) or not 0 <= full_every <= MAX_FULL_EVERY:
        raise ConfigError(f"full_every={full_every!r} must be an integer in 0..{MAX_FULL_EVERY}")
    return full_every


@dataclass
class ChainCadence:
    """When a version must be published FULL (snapshot-format.md section 10).

    A version is FULL when nothing was published yet, after a failed publish (the
    replicas keep what they served, which the next delta would not apply to), when
    ``full_every > 0`` and ``version % full_every == 0``, and in any case when one more
    delta would make the chain longer than :data:`MAX_CHAIN_DELTAS`.

    Attributes:
        full_every: FULL every this many versions (0 = never by count; warns once).
        deltas_in_chain: deltas published since the chain's FULL root.
        force_full: the next version must be FULL (nothing published yet, or a failure).
    """

    full_every: int = DEFAULT_FULL_EVERY
    deltas_in_chain: int = 0
    force_full: bool = True

    def __post_init__(self) -> None:
        check_full_every(self.full_every)
        if self.full_every == 0:
            log.warning(
                "CWTRAIN_HOTLOAD_FULL_EVERY=0: chains are never cut by count; a replica starting cold replays "
                "at most %d deltas (the API accepts 128), so a FULL snapshot is still due before a chain passes it",
                MAX_CHAIN_DELTAS,
            )

    def is_full(self, version: int) -> bool:
        """Whether ``version`` must be published FULL."""
        if self.force_full or (self.full_every > 0 and version % self.full_every == 0):
            return True
        return self.deltas_in_chain + 1 > MAX_CHAIN_DELTAS

    def published(self, *, full: bool) -> None:
        """Record a published snapshot (FULL resets the chain, a delta lengthens it)."""
        self.deltas_in_chain = 0 if full else self.deltas_in_chain + 1
        self.force_full = False

    def failed(self) -> None:
        """Record a failed publish: the next version is FULL."""
        self.force_full = True
