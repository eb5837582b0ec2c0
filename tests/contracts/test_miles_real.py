"""cwtrain's miles entry points against the REAL miles: its parser, loaders, updater, tracking.

Run with ``scripts/contracts.sh`` (it points ``CWTRAIN_MILES_SRC`` at a miles checkout and
puts miles, its Megatron-LM fork and sglang's argument parser on ``PYTHONPATH``); without
them every test skips, saying why. CI runs the stand-ins of tests/miles instead. Paths:

* the recipe's command (``launch.sh`` with ``CWTRAIN_DRY_RUN=1``: the model flags from
  miles' own ``model_args_utils.py``) through miles' ``parse_args`` up to where GPUs are
  needed, and miles' server resolution with zero engines (``--sglang-config`` with no server
  groups; ``--rollout-num-gpus 0`` alone fails); miles rejects unknown flags; why
  ``CUDA_DEVICE_MAX_CONNECTIONS=1`` must be in the job's environment;
* every flag cwtrain names is miles'; every dotted path resolves through miles' loaders;
* ``CoreWeaveRolloutFn`` built and called by miles' ``load_rollout_function`` /
  ``call_rollout_function`` over miles' data source and tokenizer loading, its samples
  converted by miles' own train-data conversion; ``--use-session-server`` refused;
* the post-write hook driven by miles' ``UpdateWeightFromDiskDelta`` on two gloo ranks,
  publishing to cwtrain-local, metrics in miles' tracking (TensorBoard);
* waiting ranks outlive torch's default group timeout with the init hook (and not without);
* the post-save hook: nothing for the critic (``hf_checkpoint_dir=None``), only exports with
  miles' ``.complete`` marker, published to cwtrain-local, metrics in miles' tracking.
"""

from __future__ import annotations

import argparse
import inspect
import os
from pathlib import Path
from typing import Any

import pytest
import real_frameworks as rf
import updater_ranks

from cwtrain.errors import ConfigError


@pytest.fixture(scope="module")
def command(miles_src: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("miles-work")
    return {**rf.recipe_command("miles", miles_src, work), "work": work}


def _runtime_env(command: dict[str, Any]) -> dict[str, str]:
    """The job's runtime environment, but this machine's PYTHONPATH (the image's is /root/...)."""
    return {k: v for k, v in command["runtime_env"]["env_vars"].items() if k != "PYTHONPATH"}


@pytest.fixture(scope="module")
def parsed(command: dict[str, Any]) -> dict[str, Any]:
    return rf.parse("miles", command["argv"], env=_runtime_env(command), checks=("zero-engines",))


def _without(argv: list[str], flag: str) -> list[str]:
    at = argv.index(flag)
    return argv[:at] + argv[at + 2 :]


def test_the_recipe_command_parses_up_to_the_gpus_with_zero_engines(
    parsed: dict[str, Any], command: dict[str, Any], miles_src: Path
) -> None:
    import subprocess
    import sys

    assert parsed["ok"], parsed["error"] + parsed.get("traceback", "")
    args = parsed["args"]
    model = subprocess.run(
        [sys.executable, "miles/utils/external_utils/model_args_utils.py", "qwen3-4B"],
        cwd=miles_src, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert command["argv"][: len(model)] == model and args["num_layers"] == 36
    assert args["update_weight_transfer_mode"] == "disk-delta"
    assert args["custom_update_weight_post_write_path"] == "cwtrain.integrations.slime.hook"
    assert args["custom_megatron_init_path"] == "cwtrain.integrations.miles.init_hook"
    assert args["rollout_function_path"] == "cwtrain.integrations.miles.CoreWeaveRolloutFn"
    assert args["rollout_num_gpus"] == 0 and args["tensor_model_parallel_size"] == 2
    zero = parsed["checks"]["zero-engines"]
    assert zero["models"] == [["default", 0, True, 0]]  # no GPUs, no server groups, weights updated (the hook)
    assert zero["placement"][0] == 8  # the placement group holds the training GPUs only


def test_without_the_empty_sglang_config_miles_refuses_zero_engines(command: dict[str, Any]) -> None:
    result = rf.parse(
        "miles", _without(command["argv"], "--sglang-config"), env=_runtime_env(command), checks=("zero-engines",)
    )
    assert result["ok"], result["error"]
    assert "num_gpus must be > 0" in result["checks"]["zero-engines"]["error"]


def test_megatron_needs_cuda_device_max_connections_from_the_runtime_env(command: dict[str, Any]) -> None:
    assert _runtime_env(command) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    result = rf.parse("miles", command["argv"])
    assert not result["ok"] and "CUDA_DEVICE_MAX_CONNECTIONS" in result["error"], result["error"]


def test_miles_rejects_flags_it_does_not_know(command: dict[str, Any]) -> None:
    """So every flag of the recipe must be miles' (slime, in contrast, ignores unknown ones)."""
    result = rf.parse("miles", [*command["argv"], "--update-weight-standalone-publish"], env=_runtime_env(command))
    assert not result["ok"] and "unrecognized arguments: --update-weight-standalone-publish" in result["stderr"]


def test_every_flag_cwtrain_names_is_miles(parsed: dict[str, Any]) -> None:
    from cwtrain.integrations.miles.rollout import REFUSED_FLAGS

    names = set(parsed["args"])
    missing = [flag for flag in REFUSED_FLAGS if flag[2:].replace("-", "_") not in names]
    assert not missing and "--use-session-server" in REFUSED_FLAGS
    checked = [
        "custom_megatron_post_save_hook_path", "save_hf", "custom_megatron_init_path", "distributed_timeout_minutes",
        "update_weight_buffer_size", "wandb_run_id", "use_wandb", "use_tensorboard", "sglang_config",
        "sglang_server_concurrency", "rollout_num_gpus_per_engine", "over_sampling_batch_size", "use_tis",
    ]  # fmt: skip
    assert not [name for name in checked if name not in names]


def test_every_cwtrain_path_resolves_through_miles_loaders(command: dict[str, Any]) -> None:
    from miles.utils.misc import load_function

    import cwtrain.integrations.miles as plugin
    import cwtrain.integrations.slime as slime_plugin

    assert {value for value in command["argv"] if value.startswith("cwtrain.")} == {
        "cwtrain.integrations.slime.hook",
        "cwtrain.integrations.miles.init_hook",
        "cwtrain.integrations.miles.CoreWeaveRolloutFn",
    }
    expected = {
        "cwtrain.integrations.slime.hook": slime_plugin.hook,
        "cwtrain.integrations.miles.hook": slime_plugin.hook,
        "cwtrain.integrations.miles.actor_hook": slime_plugin.actor_hook,
        "cwtrain.integrations.miles.init_hook": slime_plugin.init_hook,
        "cwtrain.integrations.miles.post_save_hook": plugin.post_save_hook,
        "cwtrain.integrations.miles.generate_rollout": plugin.generate_rollout,
    }
    for path, function in expected.items():
        assert load_function(path) is function, path
    assert inspect.isclass(load_function("cwtrain.integrations.miles.CoreWeaveRolloutFn"))


def test_coreweave_rollout_fn_through_miles_loaders_and_conversion(
    parsed: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fake_openai import FakeCompletions
    from miles.ray.rollout.train_data_conversion import convert_samples_to_train_data
    from miles.rollout.base_types import RolloutFnConstructorInput, RolloutFnTrainInput, RolloutFnTrainOutput
    from miles.rollout.inference_rollout.compatibility import call_rollout_function, load_rollout_function
    from miles.rollout.inference_rollout.inference_rollout_common import InferenceRolloutFn
    from miles.utils.misc import load_function
    from miles.utils.types import Sample

    args = rf.namespace(parsed["args"], rollout_batch_size=2, over_sampling_batch_size=2, n_samples_per_prompt=3)
    monkeypatch.setenv("CWTRAIN_HOTLOAD_RUN_ID", "contract")
    with FakeCompletions(identity="contract-v000004", length=5) as fake:
        monkeypatch.setenv("CWTRAIN_ROLLOUT_BASE_URL", fake.base_url)
        monkeypatch.setenv("CWTRAIN_ROLLOUT_MODEL", "Qwen3-4B")
        source = load_function(args.data_source_path)(args)  # miles' own, over the recipe's data
        input = RolloutFnConstructorInput(args=args, data_source=source)
        fn = load_rollout_function(input, args.rollout_function_path)
        assert isinstance(fn, InferenceRolloutFn) and type(fn).__name__ == "CoreWeaveRolloutFn"
        assert fn.state.generate_fn_semaphore._value > 0  # miles sized it 0 (no rollout GPUs); replaced
        output = call_rollout_function(fn, RolloutFnTrainInput(rollout_id=0, weight_version=3))
        assert len(fake.bodies) == 2 and all(body["n"] == 3 for body in fake.bodies)
    assert isinstance(output, RolloutFnTrainOutput) and [len(g) for g in output.samples] == [3, 3]
    samples = [s for group in output.samples for s in group]
    assert all(isinstance(s, Sample) and s.weight_versions[-1] == "4" for s in samples)
    assert {s.oldest_weight_version for s in samples} == {4}
    train = convert_samples_to_train_data(args, samples, {}, None, None)  # what miles trains on
    assert train["response_lengths"] == [s.response_length for s in samples]
    assert [len(p) for p in train["rollout_log_probs"]] == train["response_lengths"]
    assert [len(m) for m in train["loss_masks"]] == train["response_lengths"]


def test_the_session_server_is_refused(parsed: dict[str, Any]) -> None:
    from miles.rollout.base_types import RolloutFnConstructorInput
    from miles.rollout.inference_rollout.compatibility import load_rollout_function

    args = rf.namespace(parsed["args"], use_session_server="v2")
    with pytest.raises(ConfigError, match="--use-session-server"):
        load_rollout_function(RolloutFnConstructorInput(args=args, data_source=None), args.rollout_function_path)


def _updater_args(tmp_path: Path, hf: Path, **extra: Any) -> dict[str, Any]:
    return {
        "hf_checkpoint": str(hf),
        "update_weight_transfer_mode": "disk-delta",
        "update_weight_disk_dir": str(tmp_path / "weights"),
        "update_weight_local_checkpoint_dir": str(tmp_path / "local"),
        "update_weight_delta_encoding": "xor",
        "update_weight_delta_checksum": "adler32",
        "update_weight_buffer_size": 1 << 20,
        "check_weight_update_equal": False,
        "pause_generation_mode": "retract",
        "custom_update_weight_post_write_path": "cwtrain.integrations.miles.hook",
        "custom_megatron_init_path": "cwtrain.integrations.miles.init_hook",
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


def _loader(deployment_id: str) -> Any:
    from cwtrain.hotload.loader import HotLoader
    from cwtrain.infra.client import InferenceClient

    return HotLoader(InferenceClient(), deployment_id, poll_interval=0.1)


def test_the_hook_publishes_miles_delta_versions_to_the_deployment(
    miles_src: Path, tmp_path: Path, stack: Any, stack_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cwtrain.infra.enums import SnapshotType
    from cwtrain.local.engine.model import write_base_checkpoint

    run = f"real-miles-{os.getpid()}"
    monkeypatch.setenv("CWTRAIN_HOTLOAD_RUN_ID", run)
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tb"))
    hf = tmp_path / "hf"
    write_base_checkpoint(hf, seed=0)  # the deployment's base model
    args = _updater_args(tmp_path, hf, use_tensorboard=True, tb_project_name="cwtrain", tb_experiment_name="c")
    ranks = updater_ranks.run("miles", tmp_path / "ranks", args, versions=2, init_hook=True)
    assert [ranks[r]["result"] for r in (0, 1)] == ["ok", "ok"], ranks
    assert ranks[0]["weight_version"] == 2

    loader = _loader(stack_env.deployment_id)
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
    assert loader.current_identity() == f"{run}-v000002"
    scalars = _scalars(tmp_path / "tb")  # miles' tracking (its TensorBoard backend) in rank 0's process
    assert scalars["hotload/served_version"] == {0: 0.0, 1: 1.0, 2: 2.0}
    assert scalars["hotload/chain_length"] == {0: 0.0, 1: 1.0, 2: 2.0}
    assert set(scalars["hotload/publish_seconds"]) == {0, 1, 2}
    assert all(value > 0 for value in scalars["hotload/snapshot_bytes"].values())


def small_checkpoint(directory: Path) -> Path:
    import numpy as np
    import safetensors.numpy

    directory.mkdir(parents=True)
    safetensors.numpy.save_file({n: np.zeros(8, np.float32) for n in ("a", "b")}, str(directory / "m.safetensors"))
    return directory


@pytest.mark.parametrize("init_hook", [False, True], ids=["torch default", "init hook"])
def test_waiting_ranks_outlive_a_publish_within_the_configured_timeouts(
    miles_src: Path, tmp_path: Path, init_hook: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Torch's default group timeout is cut to 2 s (for 30 minutes); rank 0's publish takes 4.5 s (budget 5 s)."""
    monkeypatch.setenv("CWTRAIN_HOTLOAD_TIMEOUT", "5")
    args = _updater_args(tmp_path, small_checkpoint(tmp_path / "hf"))
    ranks = updater_ranks.run(
        "miles", tmp_path / "ranks", args, versions=1, init_hook=init_hook, short_default=True, slow_publish=True
    )
    results = [ranks[r]["result"] for r in (0, 1)]
    if init_hook:
        assert results == ["ok", "ok"], results
    else:  # the baseline: rank 0 alone publishes, rank 1 waits in miles' gloo barrier
        assert "timed out" in results[1].lower() or "timeout" in results[1].lower(), results


def _export(directory: Path, weights: dict[str, Any], *, complete: bool) -> Path:
    """An HF export as miles writes it; the marker (miles' own name for it) only when it succeeded."""
    from miles.utils.hf_config import HF_EXPORT_COMPLETE_MARKER, is_complete_hf_export

    from cwtrain.local.engine.model import CHECKPOINT_FILE, weights_to_safetensors

    directory.mkdir(parents=True)
    (directory / CHECKPOINT_FILE).write_bytes(weights_to_safetensors(weights, {"format": "pt"}))
    if complete:
        (directory / HF_EXPORT_COMPLETE_MARKER).write_text("")
    assert is_complete_hf_export(directory) is complete
    return directory


def test_the_post_save_hook_publishes_complete_exports_and_nothing_for_the_critic(
    parsed: dict[str, Any],
    miles_src: Path,
    tmp_path: Path,
    stack: Any,
    stack_env: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from miles.utils.hf_config import HF_EXPORT_COMPLETE_MARKER
    from miles.utils.misc import load_function

    from cwtrain.infra.enums import SnapshotType
    from cwtrain.integrations.miles.post_save import COMPLETE_MARKER
    from cwtrain.local.engine.model import load_checkpoint, write_base_checkpoint

    assert COMPLETE_MARKER == HF_EXPORT_COMPLETE_MARKER
    # the only call site, MegatronTrainRayActor.save_model (read, not imported: it needs miles' sglang fork)
    call_site = (miles_src / "miles" / "backends" / "megatron_utils" / "actor.py").read_text(encoding="utf-8")
    assert "post_save_hook(self.args, rollout_id, checkpoint_dir, hf_checkpoint_dir)" in call_site
    run = f"real-miles-save-{os.getpid()}"
    monkeypatch.setenv("CWTRAIN_HOTLOAD_RUN_ID", run)
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tb"))
    hf = tmp_path / "hf"
    write_base_checkpoint(hf, seed=0)  # the deployment's base model
    args = rf.namespace(
        parsed["args"],
        hf_checkpoint=str(hf),
        save=str(tmp_path / "ckpt"),
        save_hf=str(tmp_path / "hf_exports" / "iter_{rollout_id}"),
        custom_megatron_post_save_hook_path="cwtrain.integrations.miles.post_save_hook",
        update_weight_disk_dir=str(tmp_path / "weights"),
        use_tensorboard=True,
        tb_project_name="cwtrain",
        tb_experiment_name="save",
    )
    hook = load_function(args.custom_megatron_post_save_hook_path)
    critic = argparse.Namespace(**{**vars(args), "save": str(tmp_path / "critic")})
    assert hook(critic, 9, str(tmp_path / "critic" / "iter_0000009"), None) is None  # PPO's critic save
    weights = load_checkpoint(hf)[1]
    name = sorted(weights)[0]
    first = {**weights, name: weights[name] + 0.25}
    failed = _export(Path(args.save_hf.format(rollout_id=9)), first, complete=False)
    metrics = hook(args, 9, str(tmp_path / "ckpt" / "iter_0000009"), str(failed))
    assert metrics["hotload/skipped_incomplete"] == 1.0
    second = {**first, name: first[name] + 0.25}
    done = _export(Path(args.save_hf.format(rollout_id=19)), second, complete=True)
    metrics = hook(args, 19, str(tmp_path / "ckpt" / "iter_0000019"), str(done))
    assert metrics["hotload/incremental"] == 1.0
    loader = _loader(stack_env.deployment_id)
    assert loader.completed_hot_load(f"{run}-v000010") is None  # the failed export was never published
    latest = loader.completed_hot_load(f"{run}-v000020")
    assert (latest.type, latest.previous_identity) == (SnapshotType.INCREMENTAL, f"{run}-v000000")
    assert loader.current_identity() == f"{run}-v000020"
    scalars = _scalars(tmp_path / "tb")  # miles' tracking, joined as a secondary writer
    assert scalars["hotload/served_version"] == {0: 0.0, 10: 0.0, 20: 20.0}


def test_the_sample_canary_wraps_the_log_rollout_data_miles_actor_calls(miles_src: Path) -> None:
    """The name miles' actor calls once log-probs and advantages are computed is in the dialect init_hook wraps."""
    from cwtrain.integrations.miles.dialect import MILES_DIALECT

    where, keys = rf.rollout_log_call_site(miles_src, "miles")
    assert where in MILES_DIALECT.rollout_log_modules, where
    assert "log_probs" in keys, keys
    conversion = (miles_src / "miles" / "ray" / "rollout" / "train_data_conversion.py").read_text(encoding="utf-8")
    for key in ("tokens", "response_lengths", "loss_masks", "sample_indices", "rollout_log_probs"):
        assert f'"{key}"' in conversion, key  # each rank's share of the batch carries it
    log_utils = (miles_src / "miles" / "backends" / "training_utils" / "log_utils.py").read_text(encoding="utf-8")
    assert "def log_rollout_data(rollout_id, args, rollout_data" in log_utils.replace(": int", "").replace(
        ": Namespace", ""
    ).replace(": RolloutBatch", "")
