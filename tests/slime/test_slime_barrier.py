"""No rank times out while rank 0 publishes: the gloo group's timeout, on two real gloo ranks.

slime (and its forks) make the other ranks wait in a barrier on a gloo group created without a
timeout, so torch's default applies. Here torch's default is shortened to one second (it
stands in for the real 30 minutes), rank 0's publish takes 2.5 s, within
``CWTRAIN_HOTLOAD_TIMEOUT=3``, and the ranks follow slime's call order: the baseline on
rank 0 alone, then a version on every rank, each followed by the barrier. The stand-in's
``slime.utils.distributed_utils`` creates the group as slime does.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

HERE = Path(__file__).parent
PUBLISH_SECONDS = 2.5


def _slow_publisher(rank: int) -> Any:
    from cwtrain.integrations.slime import HookConfig, SlimePublisher

    class SlowPublisher(SlimePublisher):
        """Rank 0's publish, taking PUBLISH_SECONDS (upload plus hot-load)."""

        def __call__(self, args: argparse.Namespace, version_dir: str) -> dict[str, float]:
            time.sleep(PUBLISH_SECONDS)
            return {}

    return SlowPublisher(HookConfig("dep", "run", full_every=0, timeout=3.0, state_dir="/tmp/unused"))


def _worker(rank: int, port: int, case: str, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    sys.path[:0] = [str(HERE / "stubs"), str(HERE)]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), CWTRAIN_HOTLOAD_TIMEOUT="3")
    result = "ok"
    try:
        dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(minutes=1))  # WORLD, as slime
        c10d.default_pg_timeout = timedelta(seconds=1)  # stands in for torch's 30-minute default
        import slime.utils.distributed_utils as du
        import slime.utils.reloadable_process_group as reloadable
        from slime.utils.misc import load_function

        from cwtrain.integrations.slime import SlimeRuntime

        du.init_gloo_group()
        args = argparse.Namespace(rank=rank, distributed_timeout_minutes=1, update_weight_mode="delta")
        hook = load_function("cwtrain.integrations.slime.hook")
        SlimeRuntime.current().use_publisher(_slow_publisher(rank))
        if case == "init-hook":  # --custom-megatron-init-path, on every rank once the groups exist
            load_function("cwtrain.integrations.slime.init_hook")(args)
            dist.barrier()  # (WORLD) creating a group takes its timeout too: start together
            reloadable.reload_process_groups()  # an offload cycle: slime creates a new gloo group
        if case != "hook-only":
            if rank == 0:  # the baseline: rank 0 alone calls the hook while the others wait
                hook(args, "/shared/weights", [])
            dist.barrier(group=du.get_gloo_group())
        if case == "init-hook":  # a group set where nothing wrapped it: the hook itself re-applies
            dist.barrier()
            du.GLOO_GROUP = dist.new_group(backend="gloo")
        hook(args, "/shared/weights/weight_v000001", [])  # a version: every rank calls the hook
        dist.barrier(group=du.get_gloo_group())
    except Exception as exc:
        result = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    Path(out, f"rank{rank}").write_text(result)
    os._exit(0)  # a rank that timed out leaves the other's gloo pairs broken: do not tear down


def _run(case: str, tmp_path: Path) -> dict[int, str]:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_worker, args=(port, case, str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    return {rank: (tmp_path / f"rank{rank}").read_text() for rank in (0, 1)}


@pytest.mark.slow
def test_without_the_init_hook_a_waiting_rank_times_out(tmp_path: Path) -> None:
    """The control: the stand-in default is short enough to matter."""
    results = _run("none", tmp_path)
    assert "Timed out" in results[1] or "timeout" in results[1].lower(), results


@pytest.mark.slow
def test_the_init_hook_keeps_waiting_ranks_alive_through_baseline_and_versions(tmp_path: Path) -> None:
    assert _run("init-hook", tmp_path) == {0: "ok", 1: "ok"}


@pytest.mark.slow
def test_the_post_write_hook_alone_covers_versions(tmp_path: Path) -> None:
    """Every rank calls the hook for a version, so it can extend the group itself (not for the baseline)."""
    assert _run("hook-only", tmp_path) == {0: "ok", 1: "ok"}


def test_the_barrier_timeout_covers_the_publish_budget() -> None:
    from cwtrain.integrations.slime.barrier import barrier_timeout

    args = argparse.Namespace(distributed_timeout_minutes=60)
    assert barrier_timeout(args, {}) == timedelta(hours=1)  # 60 minutes > 2 x 1800 s
    assert barrier_timeout(args, {"CWTRAIN_HOTLOAD_TIMEOUT": "3600"}) == timedelta(hours=2)
    assert barrier_timeout(argparse.Namespace(distributed_timeout_minutes=10), {}) == timedelta(hours=1)
    assert barrier_timeout(None, {"CWTRAIN_HOTLOAD_TIMEOUT": "60"}) == timedelta(minutes=30)  # never below torch's


def test_a_group_timeout_is_never_lowered(tmp_path: Path) -> None:
    import torch.distributed as dist

    from cwtrain.integrations.slime.barrier import set_group_timeout

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, 1, True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        group = dist.new_group(backend="gloo", timeout=timedelta(hours=3))
        assert set_group_timeout(group, timedelta(hours=1)) == timedelta(hours=3)
        assert set_group_timeout(group, timedelta(hours=4)) == timedelta(hours=4)
        assert set_group_timeout(group, timedelta(hours=2)) == timedelta(hours=4)
    finally:
        dist.destroy_process_group()
