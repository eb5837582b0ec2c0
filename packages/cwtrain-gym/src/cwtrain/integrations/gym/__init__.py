"""cwtrain-gym: scored NeMo Gym evaluations on a temporary deployment (work in progress)."""
