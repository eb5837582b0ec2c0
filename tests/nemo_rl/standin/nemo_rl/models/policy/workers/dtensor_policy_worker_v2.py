from collections.abc import Generator
from typing import Any

import torch


def dtensor_params_generator(model: Any, target_dtype: torch.dtype) -> Generator[tuple[str, torch.Tensor], None, None]:
    for name, tensor in model.state_dict().items():
        yield name, tensor.to(target_dtype).contiguous()


class DTensorPolicyWorkerV2Impl:
    def __init__(self, model: Any = None, dtype: torch.dtype = torch.bfloat16, rank: int = 0) -> None:
        self.model = model
        self.dtype = dtype
        self.rank = rank
        self.cpu_offload = False

    def move_to_cuda(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.to("cuda")

    def move_to_cpu(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.to("cpu")
