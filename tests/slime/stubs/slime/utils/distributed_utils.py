"""slime.utils.distributed_utils: the all-ranks gloo group, created as slime creates it (no timeout)."""

import torch.distributed as dist

GLOO_GROUP = None


def init_gloo_group():
    global GLOO_GROUP
    if GLOO_GROUP is None:
        new_group = getattr(dist, "old_new_group", dist.new_group)
        GLOO_GROUP = new_group(backend="gloo")
    return GLOO_GROUP


def get_gloo_group():
    if GLOO_GROUP is None:
        raise RuntimeError("Gloo group has not been initialized. Call _init_gloo_group() first.")
    return GLOO_GROUP


def set_gloo_group(group):
    global GLOO_GROUP
    GLOO_GROUP = group
