"""slime.observability.logging_utils: init_tracking and log, recording what they are given."""

RECORDS = []  # (metrics, step_key) of every log call
INITS = []  # primary flag of every init_tracking call


def init_tracking(args, primary=True, **kwargs):
    INITS.append(primary)


def log(args, metrics, step_key):
    assert step_key in metrics, "slime's TensorBoard adapter reads the step from metrics[step_key]"
    RECORDS.append((dict(metrics), step_key))
