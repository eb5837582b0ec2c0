from collections import UserDict
from typing import Any, Generic, TypeVar

DictT = TypeVar("DictT")


class BatchedDataDict(UserDict, Generic[DictT]):  # type: ignore[type-arg]
    """A dict of batched tensors (the real one adds slicing and sharding)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
