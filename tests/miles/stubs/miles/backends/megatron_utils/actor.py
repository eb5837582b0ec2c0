"""miles.backends.megatron_utils.actor, reduced to the module global its train step calls by name once a batch's
log-probs and advantages are computed (``log_rollout_data``, imported from training_utils.log_utils); records them."""

CALLS = []  # (rollout_id, rollout_data) of every call


def log_rollout_data(rollout_id, args, rollout_data):
    CALLS.append((rollout_id, rollout_data))
