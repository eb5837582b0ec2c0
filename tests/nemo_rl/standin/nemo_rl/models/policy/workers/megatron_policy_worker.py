import os
from collections.abc import Iterator
from typing import Any

# NEMO_RL_STANDIN_MEGATRON: "missing" (ModuleNotFoundError for megatron, as in NeMo-RL's
# DTensor environment), "broken" (an AssertionError, as a broken Transformer Engine raises),
# anything else: importable.
_MODE = os.environ.get("NEMO_RL_STANDIN_MEGATRON", "missing")
if _MODE == "missing":
    raise ModuleNotFoundError("No module named 'megatron'", name="megatron")
if _MODE == "broken":
    raise AssertionError("libtransformer_engine.so not found")


class MegatronPolicyWorkerImpl:
    def __init__(self, params: dict[str, Any] | None = None) -> None:
        self.params = params or {}

    def _iter_params_with_optional_kv_scales(self) -> Iterator[tuple[str, Any]]:
        yield from self.params.items()
