"""slime.utils.reloadable_process_group: re-creates the gloo group when the trainer wakes up.

Like slime's, it imported the group functions by name, so rebinding them in
distributed_utils alone does not reach it.
"""

from slime.utils.distributed_utils import get_gloo_group, init_gloo_group, set_gloo_group


def reload_process_groups():
    """What slime's _reload_default_process_group does to the gloo group: drop it, create a new one."""
    set_gloo_group(None)
    init_gloo_group()
    return get_gloo_group()
