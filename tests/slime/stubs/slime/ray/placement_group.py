"""slime.ray.placement_group.create_training_models: the actor_cls injection point."""

from slime.backends.megatron_utils.actor import MegatronTrainRayActor

CREATED = []


def create_training_models(args, pgs, rollout_manager, actor_cls=None):
    cls = MegatronTrainRayActor if actor_cls is None else actor_cls
    actor = cls(1, 0, None, None)
    actor.init(args, "actor")
    CREATED.append(actor)
    return actor, None
