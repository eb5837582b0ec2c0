from typing import Any


class Policy:
    def __init__(self, cluster: Any = None, config: Any = None, tokenizer: Any = None, **kwargs: Any) -> None:
        self.kwargs = kwargs
