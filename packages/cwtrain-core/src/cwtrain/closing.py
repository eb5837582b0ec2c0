"""One base for the objects that hold something until :meth:`~Closing.close`.

``with obj:`` returns ``obj`` and closes it on the way out, whatever happened inside. The
client, the encoders, checkpoint and snapshot readers, the weight mirror, the sampler and
object-store streams all close this way; each defines only ``close``.
"""

from __future__ import annotations

from typing import Self

__all__ = ["Closing"]


class Closing:
    """A context manager that returns itself and calls :meth:`close` when the block ends."""

    def close(self) -> None:
        """Release what the object holds (each subclass says what)."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
