from abc import ABC, abstractmethod
from typing import Any


class WeightSynchronizer(ABC):
    @abstractmethod
    def sync_weights(self, *, timer: Any = None, kv_scales: Any = None) -> None: ...

    @property
    @abstractmethod
    def is_stale(self) -> bool: ...

    @abstractmethod
    def mark_stale(self) -> None: ...

    @abstractmethod
    def init_communicator(self) -> None: ...

    @abstractmethod
    def shutdown(self) -> None: ...
