"""slime's UpdateWeightFromDistributed, reduced to its chunked gather.

The non-expert and expert passes yield lists of HF-named tensors bounded by
``args.update_weight_buffer_size`` as slime's do (a chunk is yielded before the tensor that
would overflow it is added; one bigger tensor goes alone). Each gathered tensor is a fresh
copy, as slime's all-gather and HF conversion produce; GATHER counts the bytes of gathered
tensors still alive, so a test can see how many the consumer holds at once.
"""

import weakref


class GatherStats:
    def __init__(self):
        self.reset()

    def reset(self):
        self.alive = 0
        self.peak = 0
        self.gathered = 0

    def track(self, tensor):
        nbytes = tensor.numel() * tensor.element_size()
        self.alive += nbytes
        self.gathered += nbytes
        self.peak = max(self.peak, self.alive)
        weakref.finalize(tensor, self._free, nbytes)
        return tensor

    def _free(self, nbytes):
        self.alive -= nbytes


GATHER = GatherStats()


class UpdateWeightFromDistributed:
    def __init__(self, args, model, weights_getter, *, model_name, quantization_config):
        self.args = args
        self.model = model
        self.model_name = model_name
        self.quantization_config = quantization_config
        self.weight_version = 0
        self.update_weight_metrics = {}

    def pop_metrics(self):
        out, self.update_weight_metrics = self.update_weight_metrics, {}
        return out

    def _named(self, experts):
        for name, param in self.model[0].named_parameters():
            if (".experts." in name) == experts:
                yield name, param

    def _chunks(self, experts):
        limit = getattr(self.args, "update_weight_buffer_size", 512 * 1024**2)
        buffer, size = [], 0
        for name, param in self._named(experts):
            gathered = GATHER.track(param.detach().clone())
            if not self._is_pp_src_rank:
                continue
            nbytes = gathered.numel() * gathered.element_size()
            if buffer and size + nbytes > limit:
                yield buffer
                buffer, size = [], 0
            buffer.append((name, gathered))
            size += nbytes
            del gathered
        if buffer:
            yield buffer

    def _iter_non_expert_chunks(self):
        yield from self._chunks(False)

    def _iter_expert_chunks(self):
        yield from self._chunks(True)

    def update_weights(self):
        raise AssertionError("the live-tensor actor must not run slime's own updater")


class UpdateWeightFromDiskDelta(UpdateWeightFromDistributed):
    """The delta updater (a subclass, as in slime)."""
