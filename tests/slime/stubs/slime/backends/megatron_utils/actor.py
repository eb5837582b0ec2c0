"""slime's MegatronTrainRayActor, reduced to what the live-tensor path touches.

``init`` picks the weight updater from the flags as slime does (delta, full disk, colocate,
NCCL); only UpdateWeightFromDistributed and its delta subclass have the chunked gather.
The model is ``[view]`` over ``actor.weights`` (tests set it to CPU tensors).
``wake_up``/``sleep``, the weight backuper, ``timer`` and ``torch_memory_saver`` record
what they are asked, in ``actor.calls``.
"""

import contextlib
import functools

from slime.backends.megatron_utils.update_weight.update_weight_from_distributed import (
    UpdateWeightFromDiskDelta,
    UpdateWeightFromDistributed,
)

TIMED = []  # names of the functions slime's @timer timed


def timer(func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        TIMED.append(func.__name__)
        return func(*args, **kwargs)

    return wrapper


class _MemorySaver:
    def __init__(self):
        self.disabled = 0

    @contextlib.contextmanager
    def disable(self):
        self.disabled += 1
        try:
            yield
        finally:
            self.disabled -= 1


torch_memory_saver = _MemorySaver()


class _UpdaterWithoutGather:
    """UpdateWeightFromDisk / UpdateWeightFromTensor: no _iter_*_chunks."""

    def __init__(self, args, model, weights_getter, *, model_name, quantization_config):
        self.args = args
        self.weight_version = 0
        self.update_weight_metrics = {}

    def update_weights(self):
        raise AssertionError("the live-tensor actor must not run slime's own updater")


class UpdateWeightFromDisk(_UpdaterWithoutGather):
    pass


class UpdateWeightFromTensor(_UpdaterWithoutGather):
    pass


class _ModelView:
    def __init__(self, actor):
        self.actor = actor

    def named_parameters(self):
        return iter(list(self.actor.weights.items()))


class _Backuper:
    def __init__(self, calls):
        self.calls = calls

    def backup(self, tag):
        self.calls.append(("backup", tag))

    def copy(self, src_tag, dst_tag):
        self.calls.append(("copy", src_tag, dst_tag))

    def get(self, tag):
        return {}


class _HfConfig:  # slime names the model after the HF config class: "qwen3config"
    pass


Qwen3Config = _HfConfig


class MegatronTrainRayActor:
    def __init__(self, world_size, rank, master_addr, master_port):
        self._world_size = world_size
        self._rank = rank
        self.weights = {}
        self.calls = []

    def init(self, args, role, with_ref=False, with_opd_teacher=False):
        self.args = args
        self.role = role
        self.model = [_ModelView(self)]
        self.hf_config = Qwen3Config()
        self.weights_backuper = _Backuper(self.calls)
        mode = getattr(args, "update_weight_mode", "full")
        transport = getattr(args, "update_weight_transport", "nccl")
        if mode == "delta":
            cls = UpdateWeightFromDiskDelta
        elif transport == "disk":
            cls = UpdateWeightFromDisk
        elif getattr(args, "colocate", False):
            cls = UpdateWeightFromTensor
        else:
            cls = UpdateWeightFromDistributed
        self.weight_updater = cls(args, self.model, lambda: {}, model_name="qwen3config", quantization_config=None)
        self.weight_updater.weight_version = getattr(args, "update_weight_start_version", 0)
        return 0

    def wake_up(self):
        assert self.args.offload_train
        self.calls.append(("wake_up", torch_memory_saver.disabled))

    def sleep(self):
        assert self.args.offload_train
        self.calls.append(("sleep", torch_memory_saver.disabled))

    @timer
    def update_weights(self):
        raise AssertionError("slime's update_weights needs SGLang engines")
