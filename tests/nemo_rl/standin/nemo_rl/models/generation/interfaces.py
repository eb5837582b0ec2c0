from abc import ABC, abstractmethod
from typing import Any


class GenerationInterface(ABC):
    @abstractmethod
    def init_collective(self, ip: str, port: int, world_size: int) -> list[Any]: ...

    @abstractmethod
    def generate(self, data: Any, greedy: bool) -> Any: ...

    @abstractmethod
    def prepare_for_generation(self, *args: Any, **kwargs: Any) -> bool: ...

    @abstractmethod
    def finish_generation(self, *args: Any, **kwargs: Any) -> bool: ...

    def prepare_refit_info(self, state_dict_info: dict[str, Any]) -> None:
        raise NotImplementedError

    def update_weights_via_ipc_zmq(self) -> list[Any]:
        raise NotImplementedError

    def update_weights_from_collective(self) -> list[Any]:
        raise NotImplementedError

    def invalidate_kv_cache(self) -> bool:
        return False

    @property
    def requires_kv_scale_sync(self) -> bool:
        return False

    def clear_logger_metrics(self) -> None:
        pass

    def get_logger_metrics(self) -> dict[str, Any]:
        return {}
