"""slime's MegatronTrainRayActor, reduced to what the live-tensor path touches.

The weight updater yields HF-named chunks the way UpdateWeightFromDistributed does
(non-expert pass, then expert pass); tests set ``weights`` to CPU tensors.
"""


class _WeightUpdater:
    def __init__(self, actor):
        self.actor = actor
        self.weight_version = 0
        self.update_weight_metrics = {}
        self._is_pp_src_rank = True

    def pop_metrics(self):
        out, self.update_weight_metrics = self.update_weight_metrics, {}
        return out

    def _iter_non_expert_chunks(self):
        chunk = [(n, t) for n, t in self.actor.weights.items() if ".experts." not in n]
        if chunk:
            yield chunk

    def _iter_expert_chunks(self):
        chunk = [(n, t) for n, t in self.actor.weights.items() if ".experts." in n]
        if chunk:
            yield chunk

    def update_weights(self):
        raise AssertionError("the live-tensor actor must not run slime's own updater")


class MegatronTrainRayActor:
    def __init__(self, world_size, rank, master_addr, master_port):
        self._world_size = world_size
        self._rank = rank
        self.weights = {}

    def init(self, args, role, with_ref=False, with_opd_teacher=False):
        self.args = args
        self.role = role
        self.weight_updater = _WeightUpdater(self)
        self.weight_updater.weight_version = getattr(args, "update_weight_start_version", 0)
        return 0

    def update_weights(self):
        raise AssertionError("slime's update_weights needs SGLang engines")
