"""cwtrain's slime entry points against the REAL slime: its parser, loaders, updater, rollout manager.

Run with ``scripts/contracts.sh`` (it points ``CWTRAIN_SLIME_SRC`` at a slime checkout and
puts slime, its Megatron-LM and sglang's argument parser on ``PYTHONPATH``); without them
every test skips, saying why. CI runs the stand-ins of tests/slime instead. Paths covered:

* the recipe's command (``launch.sh`` with ``CWTRAIN_DRY_RUN=1``, the model flags from slime's
  own script) through slime's ``parse_args`` on slime carrying the recipe's patch, up to
  where GPUs are needed, with zero local engines; and why ``CUDA_DEVICE_MAX_CONNECTIONS=1``
  must be in the job's environment;
* an unpatched slime drops ``--update-weight-standalone-publish`` silently: cwtrain's init
  hook and rollout function stop such a run at start;
* every flag cwtrain names (refused, checked, the stand-ins' namespace) is slime's;
* every dotted path resolves through slime's ``load_function``;
* ``generate_rollout`` through slime's data source and ``RolloutManager`` conversion;
* the post-write hook driven by slime's ``UpdateWeightFromDiskDelta`` on two gloo ranks,
  publishing the baseline and deltas to cwtrain-local, metrics in slime's TensorBoard log;
* waiting ranks outlive torch's default group timeout with the init hook (and not without);
* the live-tensor actor subclasses slime's actor and uses its gather, timer and backups.
"""

from __future__ import annotations

import importlib
import inspect
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import real_frameworks as rf
import updater_ranks

from cwtrain.errors import ConfigError

PATCH = rf.ROOT / "recipes" / "slime" / "patches" / "slime-standalone-publish.patch"


@pytest.fixture(scope="module")
def command(slime_src: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("slime-work")
    return {**rf.recipe_command("slime", slime_src, work), "work": work}


@pytest.fixture(scope="module")
def patched(slime_src: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """slime's package with the recipe's patch applied (as launch.sh applies it)."""
    root = tmp_path_factory.mktemp("slime-patched")
    shutil.copytree(slime_src / "slime", root / "slime")
    for step in (["--check"], []):
        done = subprocess.run(["git", "apply", *step, str(PATCH)], cwd=root, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    return root


def _runtime_env(command: dict[str, Any]) -> dict[str, str]:
    """The job's runtime environment, but this machine's PYTHONPATH (the image's is /root/...)."""
    return {k: v for k, v in command["runtime_env"]["env_vars"].items() if k != "PYTHONPATH"}


@pytest.fixture(scope="module")
def parsed(command: dict[str, Any], patched: Path) -> dict[str, Any]:
    return rf.parse(
        "slime", command["argv"], env=_runtime_env(command), pythonpath=[str(patched)], checks=("zero-engines",)
    )


@pytest.fixture(scope="module")
def parsed_unpatched(command: dict[str, Any]) -> dict[str, Any]:
    return rf.parse("slime", command["argv"], env=_runtime_env(command))


def test_the_recipe_command_parses_up_to_the_gpus_with_zero_engines(parsed: dict[str, Any]) -> None:
    assert parsed["ok"], parsed["error"] + parsed.get("traceback", "")
    args = parsed["args"]
    assert args["update_weight_standalone_publish"] is True  # the patch's flag reached slime
    assert (args["update_weight_mode"], args["update_weight_transport"]) == ("delta", "disk")
    assert (args["update_weight_delta_encoding"], args["update_weight_delta_checksum"]) == ("xor", "adler32")
    assert args["custom_update_weight_post_write_path"] == "cwtrain.integrations.slime.hook"
    assert args["custom_megatron_init_path"] == "cwtrain.integrations.slime.init_hook"
    assert args["rollout_function_path"] == "cwtrain.integrations.slime.rollout.generate_rollout"
    assert args["rollout_num_gpus"] == 0 and args["tensor_model_parallel_size"] == 2
    # slime's own zero-engine path: one model without server groups, no engine to size anything by
    assert parsed["checks"]["zero-engines"] == {"models": [["default", 0]], "num_engines": 0}


def test_megatron_needs_cuda_device_max_connections_from_the_runtime_env(
    command: dict[str, Any], patched: Path
) -> None:
    """Megatron's check runs in train.py itself: the variable must be in the job's environment."""
    assert _runtime_env(command) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    result = rf.parse("slime", command["argv"], pythonpath=[str(patched)])
    assert not result["ok"] and "CUDA_DEVICE_MAX_CONNECTIONS" in result["error"], result["error"]


def test_an_unpatched_slime_drops_the_flag_and_cwtrain_stops_the_run_at_start(
    parsed_unpatched: dict[str, Any],
) -> None:
    from slime.utils.misc import load_function

    from cwtrain.integrations.slime import init_hook

    assert parsed_unpatched["ok"], parsed_unpatched["error"]
    args = rf.namespace(parsed_unpatched["args"])
    assert not hasattr(args, "update_weight_standalone_publish")  # slime ignores flags it does not know
    with pytest.raises(ConfigError, match=r"slime-standalone-publish\.patch"):
        init_hook(args)  # --custom-megatron-init-path: every train rank, at start
    generate_rollout = load_function(args.rollout_function_path)
    with pytest.raises(ConfigError, match=r"slime-standalone-publish\.patch"):
        generate_rollout(args, 0, None)  # the first rollout, before any training step


def test_every_flag_cwtrain_names_is_slimes(parsed_unpatched: dict[str, Any], tmp_path: Path) -> None:
    from slime_driver import slime_args

    from cwtrain.integrations.slime.rollout import REFUSED_FLAGS

    names = set(parsed_unpatched["args"])
    for flag in REFUSED_FLAGS:
        assert flag[2:].replace("-", "_") in names, flag
    assert "use_session_server" not in names  # miles' flag: slime has none
    checked = [
        "colocate", "release_train", "offload_train", "use_critic", "keep_old_actor", "update_weights_interval",
        "update_weight_buffer_size", "debug_train_only", "debug_rollout_only",
        "distributed_timeout_minutes", "custom_megatron_init_path", "wandb_run_id", "use_wandb", "use_tensorboard",
        "over_sampling_batch_size", "use_tis", "use_rollout_logprobs", "get_mismatch_metrics", "rollout_top_p",
    ]  # fmt: skip
    assert not [name for name in checked if name not in names]
    stand_in = set(vars(slime_args(tmp_path, tmp_path / "hf")))  # tests/slime's namespace mirrors slime's
    assert not stand_in - names - {"rank"}, stand_in - names


def test_every_cwtrain_path_resolves_through_slimes_load_function(command: dict[str, Any]) -> None:
    from slime.utils.misc import load_function

    import cwtrain.integrations.slime as plugin
    from cwtrain.integrations.slime import rollout

    argv = command["argv"]
    paths = {value for value in argv if value.startswith("cwtrain.")}
    assert paths == {
        "cwtrain.integrations.slime.hook",
        "cwtrain.integrations.slime.init_hook",
        "cwtrain.integrations.slime.rollout.generate_rollout",
    }
    expected = {
        "cwtrain.integrations.slime.hook": plugin.hook,
        "cwtrain.integrations.slime.actor_hook": plugin.actor_hook,
        "cwtrain.integrations.slime.init_hook": plugin.init_hook,
        "cwtrain.integrations.slime.rollout.generate_rollout": rollout.generate_rollout,
    }
    for path, function in expected.items():
        assert load_function(path) is function, path


def test_generate_rollout_through_slimes_data_source_and_rollout_manager(
    parsed: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fake_openai import FakeCompletions
    from slime.ray.rollout import RolloutManager
    from slime.utils.misc import load_function
    from slime.utils.types import Sample

    args = rf.namespace(parsed["args"], rollout_batch_size=2, over_sampling_batch_size=2, n_samples_per_prompt=3)
    monkeypatch.setenv("CWTRAIN_HOTLOAD_RUN_ID", "contract")
    manager = object.__new__(RolloutManager.__ray_metadata__.modified_class)  # the class, without Ray
    manager.args = args
    manager.data_source = load_function(args.data_source_path)(args)  # slime's, over the recipe's data
    manager.generate_rollout = load_function(args.rollout_function_path)
    manager.custom_reward_post_process_func = manager.custom_convert_samples_to_train_data_func = None
    with FakeCompletions(identity="contract-v000004", length=5) as fake:
        monkeypatch.setenv("CWTRAIN_ROLLOUT_BASE_URL", fake.base_url)
        monkeypatch.setenv("CWTRAIN_ROLLOUT_MODEL", "Qwen3-4B")
        samples, metrics = manager._get_rollout_data(0)  # slime's call_rollout_fn, then its flattening
        assert len(fake.bodies) == 2 and all(body["n"] == 3 for body in fake.bodies)
    assert len(samples) == 6 and all(isinstance(s, Sample) for s in samples)
    assert metrics["coreweave/samples"] == 6.0
    assert {s.weight_versions[-1] for s in samples} == {"4"}
    train = manager._convert_samples_to_train_data(samples)  # what slime trains on
    assert train["response_lengths"] == [s.response_length for s in samples]
    assert [len(t) - r for t, r in zip(train["tokens"], train["response_lengths"], strict=True)] == [
        len(body["prompt"]) for body in fake.bodies for _ in range(3)
    ]
    assert [len(p) for p in train["rollout_log_probs"]] == train["response_lengths"]
    assert [len(m) for m in train["loss_masks"]] == train["response_lengths"]
    assert sorted(set(train["truncated"])) == [0, 1]  # the fake stops even choices, truncates odd ones


def _updater_args(tmp_path: Path, hf: Path, **extra: Any) -> dict[str, Any]:
    return {
        "hf_checkpoint": str(hf),
        "update_weight_mode": "delta",
        "update_weight_transport": "disk",
        "update_weight_disk_dir": str(tmp_path / "weights"),
        "update_weight_local_checkpoint_dir": str(tmp_path / "local"),
        "update_weight_delta_encoding": "xor",
        "update_weight_delta_checksum": "adler32",
        "update_weight_buffer_size": 1 << 20,
        "custom_update_weight_post_write_path": "cwtrain.integrations.slime.hook",
        "custom_megatron_init_path": "cwtrain.integrations.slime.init_hook",
        "distributed_timeout_minutes": 60,
        "use_wandb": False,
        "use_tensorboard": False,
        **extra,
    }


def _scalars(directory: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, dict[int, float]] = {}
    for events in sorted({p.parent for p in directory.rglob("events.out.tfevents.*")}):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            out.setdefault(tag, {}).update({e.step: e.value for e in accumulator.Scalars(tag)})
    return out


def test_the_hook_publishes_slimes_delta_versions_to_the_deployment(
    slime_src: Path, tmp_path: Path, stack: Any, stack_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cwtrain.hotload.loader import HotLoader
    from cwtrain.infra.client import InferenceClient
    from cwtrain.infra.enums import SnapshotType
    from cwtrain.local.engine.model import write_base_checkpoint

    run = f"real-slime-{os.getpid()}"
    monkeypatch.setenv("CWTRAIN_HOTLOAD_RUN_ID", run)
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tb"))
    hf = tmp_path / "hf"
    write_base_checkpoint(hf, seed=0)  # the deployment's base model
    args = _updater_args(tmp_path, hf, use_tensorboard=True, tb_project_name="cwtrain", tb_experiment_name="c")
    ranks = updater_ranks.run("slime", tmp_path / "ranks", args, versions=2, init_hook=True)
    assert [ranks[r]["result"] for r in (0, 1)] == ["ok", "ok"], ranks
    assert ranks[0]["weight_version"] == 2
    assert "perf/update_weights_density" in ranks[0]["framework_metrics"]  # slime's own metrics still there

    loader = HotLoader(InferenceClient(), stack_env.deployment_id, poll_interval=0.1)
    kinds = {}
    for version in (0, 1, 2):
        hot_load = loader.completed_hot_load(f"{run}-v{version:06d}")
        assert hot_load is not None, version
        kinds[version] = (hot_load.type, hot_load.previous_identity)
    assert kinds == {
        0: (SnapshotType.FULL, None),
        1: (SnapshotType.INCREMENTAL, f"{run}-v000000"),
        2: (SnapshotType.INCREMENTAL, f"{run}-v000001"),
    }
    assert loader.current_identity() == f"{run}-v000002"  # every replica applied slime's deltas (Adler-32 checked)

    scalars = _scalars(tmp_path / "tb")  # slime's own TensorBoard writer, in rank 0's process
    assert scalars["hotload/served_version"] == {0: 0.0, 1: 1.0, 2: 2.0}
    assert scalars["hotload/chain_length"] == {0: 0.0, 1: 1.0, 2: 2.0}
    assert scalars["hotload/incremental"] == {0: 0.0, 1: 1.0, 2: 1.0}
    assert set(scalars["hotload/publish_seconds"]) == {0, 1, 2}
    assert all(value > 0 for value in scalars["hotload/snapshot_bytes"].values())
    assert all(value > 0 for value in scalars["hotload/hot_load_seconds"].values())


def small_checkpoint(directory: Path) -> Path:
    import numpy as np
    import safetensors.numpy

    directory.mkdir(parents=True)
    safetensors.numpy.save_file({n: np.zeros(8, np.float32) for n in ("a", "b")}, str(directory / "m.safetensors"))
    return directory


@pytest.mark.parametrize("init_hook", [False, True], ids=["torch default", "init hook"])
def test_waiting_ranks_outlive_a_publish_within_the_configured_timeouts(
    slime_src: Path, tmp_path: Path, init_hook: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Torch's default group timeout is cut to 2 s (for 30 minutes); rank 0's publish takes 4.5 s (budget 5 s)."""
    monkeypatch.setenv("CWTRAIN_HOTLOAD_TIMEOUT", "5")
    args = _updater_args(tmp_path, small_checkpoint(tmp_path / "hf"))
    ranks = updater_ranks.run(
        "slime", tmp_path / "ranks", args, versions=1, init_hook=init_hook, short_default=True, slow_publish=True
    )
    results = [ranks[r]["result"] for r in (0, 1)]
    if init_hook:
        assert results == ["ok", "ok"], results
    else:  # the baseline: rank 0 alone publishes, rank 1 waits in slime's gloo barrier
        assert "timed out" in results[1].lower() or "timeout" in results[1].lower(), results


def test_the_live_tensor_actor_is_built_on_slimes_own_actor(slime_src: Path) -> None:
    from slime.backends.megatron_utils.actor import MegatronTrainRayActor
    from slime.backends.megatron_utils.update_weight.update_weight_from_disk import UpdateWeightFromDisk
    from slime.utils.tensor_backper import TensorBackuper

    from cwtrain.integrations.slime import make_actor_cls
    from cwtrain.integrations.slime.launch import inject_actor_cls
    from cwtrain.integrations.slime.train_actor import GATHER_MODULE

    actor_cls = make_actor_cls()
    assert actor_cls.__mro__[1] is MegatronTrainRayActor
    assert actor_cls.update_weights.__wrapped__  # slime's @timer: perf/update_weights_time
    for method in ("init", "wake_up", "sleep"):
        assert callable(getattr(MegatronTrainRayActor, method)), method
    gather = importlib.import_module(GATHER_MODULE).UpdateWeightFromDistributed
    assert list(inspect.signature(gather).parameters) == [
        "args", "model", "weights_getter", "model_name", "quantization_config",
    ]  # fmt: skip
    assert callable(gather._iter_non_expert_chunks) and callable(gather._iter_expert_chunks)
    assert not hasattr(UpdateWeightFromDisk, "_iter_non_expert_chunks")  # why cwtrain builds its own gather
    assert list(inspect.signature(TensorBackuper.copy).parameters)[1:] == ["src_tag", "dst_tag"]
    original = inject_actor_cls(actor_cls)
    assert list(inspect.signature(original).parameters) == ["args", "pgs", "rollout_manager", "actor_cls"]


def test_make_actor_cls_names_megatron_when_it_is_missing(slime_src: Path) -> None:
    code = (
        "import sys; sys.modules['megatron'] = None\n"
        "from cwtrain.integrations.slime import make_actor_cls\n"
        "try:\n    make_actor_cls()\nexcept ImportError as exc:\n    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "needs the module 'megatron" in done.stdout, done.stdout + done.stderr  # 'megatron' or 'megatron.core'
    assert "Megatron-LM on PYTHONPATH" in done.stdout, done.stdout


def test_slime_calls_the_init_hook_once_the_process_groups_exist(slime_src: Path) -> None:
    from slime.backends.megatron_utils import initialize

    assert "custom_megatron_init_path" in inspect.getsource(initialize)
    assert "init_gloo_group" in inspect.getsource(importlib.import_module("slime.ray.train_actor"))


def test_the_sample_canary_wraps_the_log_rollout_data_slimes_actor_calls(slime_src: Path) -> None:
    """The name the actor calls once log-probs and advantages are computed is the one init_hook wraps."""
    from cwtrain.integrations.slime.canary import install
    from cwtrain.integrations.slime.dialect import SLIME_DIALECT

    where, keys = rf.rollout_log_call_site(slime_src, "slime")
    assert where in SLIME_DIALECT.rollout_log_modules, where
    assert {"rollout_log_probs", "loss_masks", "tokens"} <= set(keys), keys
    rollout = (slime_src / "slime" / "ray" / "rollout.py").read_text(encoding="utf-8")
    for key in ("tokens", "response_lengths", "loss_masks", "sample_indices", "rollout_log_probs"):
        assert f'"{key}"' in rollout, key  # each rank's share of the batch carries it
    module = importlib.import_module(where)  # what the actor has imported when it calls the init hook
    original = module.log_rollout_data
    try:
        assert install(dialect=SLIME_DIALECT) == [where]
        assert module.log_rollout_data.__wrapped__ is original
        assert install(dialect=SLIME_DIALECT) == [where] and module.log_rollout_data.__wrapped__ is original  # once
        assert list(inspect.signature(original).parameters)[:3] == ["rollout_id", "args", "rollout_data"]
    finally:
        module.log_rollout_data = original
