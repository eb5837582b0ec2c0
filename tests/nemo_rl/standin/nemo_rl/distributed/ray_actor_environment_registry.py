ACTOR_ENVIRONMENT_REGISTRY: dict[str, str] = {}
