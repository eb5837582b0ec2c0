"""Two CPU ranks over gloo running slime's or miles' REAL ``UpdateWeightFromDiskDelta`` with cwtrain's hooks.

:func:`run` spawns the ranks; each one does what a train actor does around the updater:
``init_process_group`` (WORLD with ``--distributed-timeout-minutes``), the framework's own
``init_gloo_group``, optionally cwtrain's ``--custom-megatron-init-path`` function loaded by
the framework's ``load_function``, then the baseline ``update_weights()`` and one per
version. The framework's updater writes the delta files and calls the post-write hook it
loads from ``--custom-update-weight-post-write-path``, exactly as in a run.

Replaced, because they need a GPU model: the gather of the model's HF tensors (each rank
yields its share of a small checkpoint, moved a little each version, as pipeline stages
hold disjoint tensors), the device of the metrics tensor (CPU), which ranks are sources
(both), and ``ray.get`` of the engines' pulls (there are no engines). With
``short_default`` torch's default group timeout is cut to a few seconds before the gloo
group is created (it stands in for the real 30 minutes); with ``slow_publish`` rank 0's
publish takes longer than that (the publisher is replaced by one that sleeps).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

SHORT_DEFAULT_SECONDS = 2.0
SLOW_PUBLISH_SECONDS = 4.5


def _slow_publisher() -> Any:
    from cwtrain.integrations.slime import HookConfig, SlimePublisher

    class SlowPublisher(SlimePublisher):
        def __call__(self, args: argparse.Namespace, version_dir: str) -> dict[str, float]:
            time.sleep(SLOW_PUBLISH_SECONDS)
            return {}

    return SlowPublisher(HookConfig("dep", "slow", full_every=0, timeout=5.0, state_dir="/tmp/cwtrain-unused"))


def _weights(hf: str) -> dict[str, Any]:
    import safetensors.torch

    out: dict[str, Any] = {}
    for path in sorted(Path(hf).glob("*.safetensors")):
        out.update(safetensors.torch.load_file(str(path)))
    return out


def _moved(tensor: Any, step: int, name: str, names: list[str]) -> Any:
    """Version ``step``'s value: two tensors move each version, the rest stay."""
    moving = {names[step % len(names)], names[(3 * step) % len(names)]}
    if step == 0 or name not in moving:
        return tensor.clone()
    return (tensor.float() + 0.01 * step).to(tensor.dtype)


def _worker(rank: int, config: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    framework = config["framework"]
    out = Path(config["out"])
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(config["port"]))
    record: dict[str, Any] = {"rank": rank, "result": "ok"}
    try:
        dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(minutes=5))
        if config.get("short_default"):
            c10d.default_pg_timeout = timedelta(seconds=SHORT_DEFAULT_SECONDS)
        if framework == "slime":
            import slime.backends.megatron_utils.update_weight.update_weight_from_disk_delta as module
            from slime.utils.distributed_utils import init_gloo_group
            from slime.utils.misc import load_function

            if hasattr(module, "accelerator"):
                module.accelerator.current_device = lambda: "cpu"
            else:  # v0.3.1
                torch.cuda.current_device = lambda: "cpu"
        else:
            import miles.backends.megatron_utils.update_weight.update_weight_from_distributed.delta as module
            from miles.utils.distributed_utils import init_gloo_group
            from miles.utils.misc import load_function

            torch.cuda.current_device = lambda: "cpu"
        module.ray.get = lambda refs, **kwargs: [] if not refs else None  # no engines to pull
        dist.barrier()  # (WORLD) creating a group waits its timeout for the others: start together
        init_gloo_group()
        args = argparse.Namespace(**config["args"], rank=rank)
        if config.get("init_hook"):
            load_function(args.custom_megatron_init_path)(args)
        if config.get("slow_publish"):
            from cwtrain.integrations.slime import SlimeRuntime

            SlimeRuntime.current().use_publisher(_slow_publisher())

        base = _weights(args.hf_checkpoint)
        names = sorted(base)
        mine = names[rank::2]  # disjoint shares, as pipeline stages hold
        state = {"step": 0}

        def tensors() -> list[tuple[str, Any]]:
            return [(n, _moved(base[n], state["step"], n, names)) for n in mine]

        if framework == "slime":

            def iter_hf(self: Any) -> Any:
                yield from tensors()
                dist.barrier(group=module.get_gloo_group())

            module.UpdateWeightFromDiskDelta._iter_hf_tensors = iter_hf
        else:

            def for_each(self: Any, bucket_func: Any) -> None:
                bucket_func(tensors(), None)
                dist.barrier(group=module.get_gloo_group())
                dist.barrier(group=module.get_gloo_group())

            module.UpdateWeightFromDiskDelta._for_each_hf_bucket = for_each
            module.UpdateWeightFromDiskDelta._is_source = property(lambda self: True)
        updater = module.UpdateWeightFromDiskDelta(
            args, model=[], weights_getter=lambda: {}, model_name="qwen3", quantization_config=None
        )
        if framework == "slime":
            updater.rollout_engines, updater._is_pp_src_rank = [], True  # what connect_rollout_engines sets
        else:
            updater.connect_rollout_engines([], None)  # what miles' actor does with zero engines
        for step in range(config["versions"] + 1):
            state["step"] = step
            dist.barrier()  # the driver starts every rank's update_weights together
            updater.update_weights()
        record["weight_version"] = updater.weight_version
        record["framework_metrics"] = updater.pop_metrics()
    except BaseException as exc:
        record["result"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
    (out / f"rank{rank}.json").write_text(json.dumps(record, default=str))
    os._exit(0)  # a rank that timed out leaves the other's gloo pairs broken: no teardown


def run(framework: str, out: Path, args: dict[str, Any], *, versions: int = 2, **options: Any) -> dict[int, Any]:
    """Spawn the two ranks; returns each rank's record (``result`` is ``"ok"`` or the error)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out.mkdir(parents=True, exist_ok=True)
    config = {"framework": framework, "out": str(out), "port": port, "args": args, "versions": versions, **options}
    mp.start_processes(_worker, args=(config,), nprocs=2, join=True, start_method="spawn")
    return {rank: json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)}
