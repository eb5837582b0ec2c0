"""miles.utils.tracking_utils.tracking: log() fans out to the backends this process initialised.

Backends are recorded by name; a process that never called init_tracking logs nowhere, as
miles' TrackingManager does.
"""


class _Manager:
    def __init__(self):
        self._backends = []


_manager = _Manager()
RECORDS = []  # (metrics, step, step_key) of every log call that reached a backend
INITS = []  # primary flag of every init_tracking call
DEFINED = []  # (prefix, step_key)


def init_tracking(args, primary=True, **kwargs):
    INITS.append(primary)
    if getattr(args, "use_wandb", False):
        _manager._backends.append("wandb")


def define_step_key_metric_group(prefix, step_key):
    DEFINED.append((prefix, step_key))


def log(args, metrics, step_key):
    if _manager._backends:
        RECORDS.append((dict(metrics), metrics.get(step_key), step_key))


def reset():
    _manager._backends.clear()
    RECORDS.clear()
    INITS.clear()
    DEFINED.clear()
