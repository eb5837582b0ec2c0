"""slime.observability.train_metric_utils: log_rollout_data, which the actor calls by name once a batch's
log-probs and advantages are computed (slime after v0.3.1); records the batches it is given."""

CALLS = []  # (rollout_id, rollout_data) of every call


def log_rollout_data(rollout_id, args, rollout_data):
    CALLS.append((rollout_id, rollout_data))
