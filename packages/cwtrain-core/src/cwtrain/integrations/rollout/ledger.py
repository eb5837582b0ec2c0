"""Which identity served each recent completion: the :class:`ServedLedger` every sampler keeps.

A framework's batch keeps a sample's tokens and served log-probs but not always the identity
that served it; the sampler records every completion it returns here (``sampler.ledger``),
keyed by its prompt's and its own token ids, and the framework asks with the sequence it trains
on (:mod:`cwtrain.integrations.rollout.sample_canary`). Equal sequences served by two identities
in one batch are ambiguous (:meth:`ServedLedger.identity_of` gives ``None``); in a later batch
the newer identity replaces the older. A ledger can be written
to a file and read in another process (a framework whose rollout and training run apart).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cwtrain.errors import UsageError

if TYPE_CHECKING:
    from cwtrain.integrations.rollout.responses import Completion

__all__ = ["DEFAULT_LEDGER_CAPACITY", "ServedLedger", "token_key"]

#: Completions a ledger remembers (the newest ones): a few batches of a large run.
DEFAULT_LEDGER_CAPACITY = 1 << 16

_AMBIGUOUS = ""  # two identities served equal tokens in one batch


def token_key(tokens: Sequence[int]) -> str:
    """A short digest of token ids (the ledger's key)."""
    return hashlib.blake2b(array("q", [int(t) for t in tokens]).tobytes(), digest_size=12).hexdigest()


class ServedLedger:
    """Which identity served each recent completion, by its token ids.

    Args:
        capacity: completions remembered; the oldest are forgotten first.
    """

    def __init__(self, capacity: int = DEFAULT_LEDGER_CAPACITY) -> None:
        if capacity < 1:
            raise UsageError(f"ledger capacity={capacity!r} must be at least 1")
        self.capacity = capacity
        self._entries: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def record(self, completions: Iterable[Completion]) -> None:
        """Remember who served each completion of one batch, by its prompt and completion tokens.

        A completion that named no identity is skipped. Equal tokens served by two identities
        within the batch are ambiguous (``identity_of`` gives ``None``); served again in a
        later batch, the newest batch's identity replaces the older one.
        """
        batch: dict[str, str] = {}
        for completion in completions:
            if completion.identity is None or not completion.response_ids:
                continue
            key = token_key((*completion.prompt_ids, *completion.response_ids))
            known = batch.get(key)
            batch[key] = completion.identity if known in (None, completion.identity) else _AMBIGUOUS
        with self._lock:
            for key, identity in batch.items():
                self._put(key, identity)

    def note(self, tokens: Sequence[int], identity: str) -> None:
        """``identity`` served ``tokens`` (the prompt's, then the completion's), newer than what was known."""
        with self._lock:
            self._put(token_key(tokens), identity)

    def _put(self, key: str, identity: str) -> None:
        self._entries.pop(key, None)
        self._entries[key] = identity
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def identity_of(self, tokens: Sequence[int]) -> str | None:
        """The identity that served ``tokens`` (prompt then completion), or ``None``: not recorded, or ambiguous."""
        with self._lock:
            identity = self._entries.get(token_key(tokens))
        return identity or None

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the ledger to ``path`` (atomically: a reader sees the old file or the new one)."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            body = json.dumps({"capacity": self.capacity, "entries": list(self._entries.items())})
        part = target.with_name(f".{target.name}.{os.getpid()}.part")
        part.write_text(body)
        os.replace(part, target)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ServedLedger:
        """The ledger :meth:`save` wrote at ``path`` (an empty one when there is no file).

        Raises:
            UsageError: the file is not a ledger.
        """
        try:
            body = json.loads(Path(path).read_text())
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError) as exc:
            raise UsageError(f"{path} is not a served-samples ledger: {exc}") from exc
        if not isinstance(body, dict) or not isinstance(body.get("entries"), list):
            raise UsageError(f"{path} is not a served-samples ledger (no entries list)")
        ledger = cls(int(body.get("capacity") or DEFAULT_LEDGER_CAPACITY))
        ledger._entries.update((str(k), str(v)) for k, v in body["entries"])
        return ledger
