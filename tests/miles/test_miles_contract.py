"""miles plug-in points: the class-based rollout function, the post-write hook, the post-save hook."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeCompletions
from recording_loader import RecordingLoader
from slime_driver import SlimeRun, nudge, slime_args, tiny_weights, write_hf_checkpoint

from cwtrain.errors import ConfigError

PROMPTS = [("1+1=", "2"), ("2+2=", "4")]


def miles_args(tmp: Path, **overrides: Any) -> argparse.Namespace:
    """miles' flags: disk-delta transfer mode instead of slime's --update-weight-mode."""
    args = vars(slime_args(tmp, tmp / "hf"))
    del args["update_weight_mode"], args["update_weight_transport"]
    args.update(
        update_weight_transfer_mode="disk-delta",
        custom_update_weight_post_write_path="cwtrain.integrations.miles.hook",
        rollout_function_path="cwtrain.integrations.miles.CoreWeaveRolloutFn",
        rollout_num_gpus=0,  # no local engines: miles sizes its semaphore to zero
        rollout_num_gpus_per_engine=1,
        sglang_server_concurrency=512,
        custom_megatron_post_save_hook_path="cwtrain.integrations.miles.post_save_hook",
        save="/ckpt",
        save_hf=None,
    )
    args.update(overrides)
    return argparse.Namespace(**args)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCompletions]:
    with FakeCompletions(identity="grpo-a-v000004") as server:
        monkeypatch.setenv("CWTRAIN_ROLLOUT_BASE_URL", server.base_url)
        monkeypatch.setenv("CWTRAIN_ROLLOUT_MODEL", "tiny")
        yield server


def _build(args: argparse.Namespace) -> tuple[Any, Any]:
    from miles.rollout.base_types import RolloutFnConstructorInput
    from miles.rollout.data_source import DataSource
    from miles.rollout.inference_rollout.compatibility import load_rollout_function

    source = DataSource(args, PROMPTS)
    return load_rollout_function(RolloutFnConstructorInput(args, source), args.rollout_function_path), source


def test_rollout_class_loads_by_miles_rule_and_replaces_the_zero_semaphore(
    miles_stubs: Path, tmp_path: Path, fake: FakeCompletions, monkeypatch: pytest.MonkeyPatch
) -> None:
    from miles.rollout.base_types import RolloutFnTrainInput, RolloutFnTrainOutput
    from miles.rollout.inference_rollout.compatibility import call_rollout_function
    from miles.rollout.inference_rollout.inference_rollout_common import InferenceRolloutFn
    from miles.utils.types import Sample

    import cwtrain.integrations.miles as package

    monkeypatch.setenv("CWTRAIN_ROLLOUT_CONCURRENCY", "1")
    monkeypatch.setenv("CWTRAIN_HOTLOAD_RUN_ID", "grpo-a")  # the run the fake endpoint's identity belongs to
    args = miles_args(tmp_path, rollout_batch_size=4)
    fn, _ = _build(args)
    assert isinstance(fn, InferenceRolloutFn) and type(fn) is package.CoreWeaveRolloutFn
    assert type(fn).__name__ == "CoreWeaveRolloutFn"
    assert fn.state.generate_fn_semaphore._value == 1  # was 512 * 0 // 1 = 0: every generate would hang
    output = call_rollout_function(fn, RolloutFnTrainInput(rollout_id=3, weight_version=None))
    assert isinstance(output, RolloutFnTrainOutput) and len(output.samples) == 4
    assert len(fake.bodies) == 4 and all(b["n"] == args.n_samples_per_prompt for b in fake.bodies)
    assert fake.peak == 1  # CWTRAIN_ROLLOUT_CONCURRENCY bounds the groups in flight
    encoded = [fn.state.tokenizer.encode(p) for p, _ in PROMPTS]  # miles' own tokenizer
    assert all(b["prompt"] in encoded for b in fake.bodies)
    for group in output.samples:
        for sample in group:
            assert isinstance(sample, Sample) and sample.weight_versions == ["4"]
            assert sample.oldest_weight_version == 4
            assert sample.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)
            assert sample.reward in (0.0, 1.0) and sample.rollout_log_probs is not None
    assert output.metrics["coreweave/rollout_id"] == 3.0
    assert output.metrics["coreweave/served_version_samples/4"] == 4 * args.n_samples_per_prompt


def test_rollout_class_tags_miles_weight_version_when_nothing_else_says(
    miles_stubs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from miles.rollout.base_types import RolloutFnEvalInput, RolloutFnTrainInput
    from miles.rollout.inference_rollout.compatibility import call_rollout_function

    with FakeCompletions(identity=None) as server:
        monkeypatch.setenv("CWTRAIN_ROLLOUT_BASE_URL", server.base_url)
        monkeypatch.setenv("CWTRAIN_ROLLOUT_MODEL", "tiny")
        args = miles_args(tmp_path, group_rm=True, custom_rm_path="rewards_for_tests.per_group")
        fn, _ = _build(args)
        output = call_rollout_function(fn, RolloutFnTrainInput(rollout_id=0, weight_version=5))
        assert {s.weight_versions[-1] for g in output.samples for s in g} == {"5"}
        assert [s.reward for s in output.samples[0]] == [0.0, 1.0, 0.0]
        with pytest.raises(ConfigError, match="--eval-interval"):
            call_rollout_function(fn, RolloutFnEvalInput(rollout_id=0))


def test_rollout_class_refuses_bypassed_flags(miles_stubs: Path, tmp_path: Path, fake: FakeCompletions) -> None:
    with pytest.raises(ConfigError, match="--custom-generate-function-path"):
        _build(miles_args(tmp_path, custom_generate_function_path="x.y"))


def test_missing_miles_names_the_install() -> None:
    import cwtrain.integrations.miles as package

    with pytest.raises(ImportError, match=r"pip install \./packages/cwtrain-miles"):
        package.CoreWeaveRolloutFn  # noqa: B018


def test_the_rollout_class_is_built_once_per_run(miles_stubs: Path) -> None:
    import cwtrain.integrations.miles as package

    first = package.CoreWeaveRolloutFn
    assert package.CoreWeaveRolloutFn is first  # kept by the runtime, not rebuilt per access
    package.reset()
    assert package.CoreWeaveRolloutFn is not first


def test_post_write_hook_is_slimes_and_recognises_disk_delta(
    miles_stubs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_bucket: tuple[Any, str]
) -> None:
    from miles.utils.misc import load_function

    import cwtrain.integrations.slime as slime
    from cwtrain.integrations.slime import HookConfig, SlimePublisher, SlimeRuntime

    monkeypatch.setenv("CWTRAIN_HOTLOAD_DEPLOYMENT_ID", "dep")
    args = miles_args(tmp_path)
    write_hf_checkpoint(Path(args.hf_checkpoint), tiny_weights())
    hook = load_function(args.custom_update_weight_post_write_path)
    assert hook is slime.hook and load_function("cwtrain.integrations.miles.actor_hook") is slime.actor_hook
    loader = RecordingLoader(*s3_bucket, deployment_id="dep")
    SlimeRuntime.current().use_publisher(
        SlimePublisher(HookConfig("dep", "m", full_every=0).with_state_dir(args), loader)
    )
    run = SlimeRun(args, tiny_weights(), hook, world_size=2)
    run.baseline()
    run.step(nudge(tiny_weights(), ["lm_head.weight"], 0))
    assert [(p[0], p[1]) for p in loader.published] == [("m-v000000", "FULL"), ("m-v000001", "INCREMENTAL")]
    bad = argparse.Namespace(**{**vars(args), "update_weight_delta_checksum": "xxh3-128"})
    SlimeRuntime.current().use_publisher(
        SlimePublisher(HookConfig("dep", "m2", full_every=0).with_state_dir(args), loader)
    )
    with pytest.raises(ConfigError, match="adler32"):
        hook(bad, args.update_weight_disk_dir, [])


def _export(directory: Path, weights: Any, *, complete: bool = True) -> Path:
    """An HF export as miles writes it: the checkpoint, then ``.complete`` once it succeeded."""
    write_hf_checkpoint(directory, weights)
    if complete:
        (directory / ".complete").write_text("")
    return directory


@pytest.fixture
def bucket(s3_bucket: tuple[Any, str]) -> tuple[Any, str]:
    """The test's S3 bucket (for the recording loaders)."""
    return s3_bucket


def _post_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bucket: tuple[Any, str], every: int = 0
) -> tuple[Any, Any, RecordingLoader]:
    from miles.utils.misc import load_function

    from cwtrain.hotload import HotLoadSettings
    from cwtrain.integrations.miles import MilesRuntime, post_save

    monkeypatch.setenv("CWTRAIN_HOTLOAD_DEPLOYMENT_ID", "dep")
    args = miles_args(tmp_path, save_hf=str(tmp_path / "hf_exports" / "iter_{rollout_id}"))
    write_hf_checkpoint(Path(args.hf_checkpoint), tiny_weights())
    loader = RecordingLoader(*bucket, deployment_id="dep")
    settings = HotLoadSettings("dep", "ps", full_every=every, state_dir=str(tmp_path / "state"))
    MilesRuntime.current().use_post_save(post_save.PostSavePublisher(settings, loader))
    return args, load_function(args.custom_megatron_post_save_hook_path), loader


def test_post_save_hook_does_nothing_for_the_critic(
    miles_stubs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bucket: tuple[Any, str]
) -> None:
    """PPO: miles calls the hook on the critic's rank 0 too, with hf_checkpoint_dir=None."""
    args, hook, loader = _post_save(tmp_path, monkeypatch, bucket)
    critic = argparse.Namespace(**{**vars(args), "save": "/ckpt/critic"})
    assert hook(critic, 9, "/ckpt/critic/iter_0000009", None) is None
    assert loader.published == []
    export = _export(Path(args.save_hf.format(rollout_id=9)), nudge(tiny_weights(), ["lm_head.weight"], 1))
    hook(args, 9, "/ckpt/iter_0000009", str(export))  # the actor's save of the same rollout
    assert [p[0] for p in loader.published] == ["ps-v000000", "ps-v000010"]


def test_post_save_hook_publishes_only_complete_exports(
    miles_stubs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bucket: tuple[Any, str]
) -> None:
    """miles swallows a failed export, writes no .complete marker and still calls the hook."""
    args, hook, loader = _post_save(tmp_path, monkeypatch, bucket)
    weights = nudge(tiny_weights(), ["lm_head.weight"], 1)
    broken = _export(Path(args.save_hf.format(rollout_id=4)), weights, complete=False)
    metrics = hook(args, 4, "/ckpt", str(broken))
    assert metrics["hotload/skipped_incomplete"] == 1.0 and metrics["hotload/served_version"] == 0.0
    assert [p[0] for p in loader.published] == ["ps-v000000"]  # the baseline only
    weights = nudge(weights, ["model.norm.weight"], 2)
    hook(args, 9, "/ckpt", str(_export(Path(args.save_hf.format(rollout_id=9)), weights)))
    identity, kind, previous, _, index = loader.published[-1]
    assert (identity, kind, previous) == ("ps-v000010", "INCREMENTAL", "ps-v000000")
    assert sorted(index["weight_map"]) == ["lm_head.weight", "model.norm.weight"]  # over the last published


def test_post_save_full_cadence_counts_published_exports(
    miles_stubs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bucket: tuple[Any, str]
) -> None:
    """--save-interval 2 with FULL_EVERY=2: versions 2, 4, 6, 8 are all multiples of 2, the exports are not."""
    args, hook, loader = _post_save(tmp_path, monkeypatch, bucket, every=2)
    weights = tiny_weights()
    for rollout_id in (1, 3, 5, 7):
        weights = nudge(weights, ["lm_head.weight"], rollout_id)
        hook(args, rollout_id, "/ckpt", str(_export(Path(args.save_hf.format(rollout_id=rollout_id)), weights)))
    kinds = [(p[0], p[1]) for p in loader.published]
    assert kinds == [
        ("ps-v000000", "FULL"),
        ("ps-v000002", "INCREMENTAL"),
        ("ps-v000004", "FULL"),  # the second export
        ("ps-v000006", "INCREMENTAL"),
        ("ps-v000008", "FULL"),
    ]


@pytest.mark.faults
@pytest.mark.fault_row("trainer-restart")
def test_post_save_after_a_restart_publishes_the_next_version_full_and_keeps_what_is_served(
    miles_stubs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bucket: tuple[Any, str]
) -> None:
    """Resumed from the checkpoint of rollout 9 after rollout 19's export was published (v20)."""
    from cwtrain.hotload import HotLoadSettings
    from cwtrain.integrations.miles import MilesRuntime, post_save

    args, hook, loader = _post_save(tmp_path, monkeypatch, bucket)
    weights = tiny_weights()
    for rollout_id in (9, 19):
        weights = nudge(weights, ["lm_head.weight"], rollout_id)
        hook(args, rollout_id, "/ckpt", str(_export(Path(args.save_hf.format(rollout_id=rollout_id)), weights)))
    settings = HotLoadSettings("dep", "ps", full_every=0, state_dir=str(tmp_path / "state"))
    MilesRuntime.current().use_post_save(post_save.PostSavePublisher(settings, loader))  # a new process, same run
    weights = nudge(tiny_weights(), ["model.norm.weight"], 14)
    metrics = hook(args, 14, "/ckpt", str(_export(Path(args.save_hf.format(rollout_id=14)), weights)))
    assert loader.rollbacks == []  # the baseline did not point the fleet back at v0
    assert metrics["hotload/version"] == 21.0 and metrics["hotload/chain_cut"] == 1.0  # rollout 14: v15 moved on
    weights = nudge(weights, ["lm_head.weight"], 19)
    hook(args, 19, "/ckpt", str(_export(Path(args.save_hf.format(rollout_id=19)), weights)))
    published = [(p[0], p[1], p[2]) for p in loader.published]
    assert published[3:] == [("ps-v000021", "FULL", None), ("ps-v000022", "INCREMENTAL", "ps-v000021")]


def test_post_save_metrics_reach_miles_tracking(
    miles_stubs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bucket: tuple[Any, str]
) -> None:
    """miles discards the hook's return value; rank 0 joins the run's tracking if it has none."""
    from miles.utils.tracking_utils import tracking

    tracking.reset()
    args, hook, _ = _post_save(tmp_path, monkeypatch, bucket)
    args.use_wandb = True
    export = _export(Path(args.save_hf.format(rollout_id=0)), nudge(tiny_weights(), ["lm_head.weight"], 0))
    hook(args, 0, "/ckpt", str(export))
    assert tracking.INITS == [False] and tracking.DEFINED == [("hotload", "hotload/step")]
    (baseline, step0, key0), (metrics, step, key) = tracking.RECORDS  # one record per version
    assert (step0, key0, baseline["hotload/chain_cut"]) == (0.0, "hotload/step", 1.0)
    assert (step, key) == (1.0, "hotload/step") and metrics["hotload/incremental"] == 1.0
    assert metrics["hotload/publish_seconds"] >= 0 and metrics["hotload/served_version"] == 1.0


def test_rollout_class_refuses_the_session_server(miles_stubs: Path, tmp_path: Path, fake: FakeCompletions) -> None:
    """miles has --use-session-server (slime does not): its sessions bypass the completions cwtrain sends."""
    from cwtrain.integrations.miles.rollout import REFUSED_FLAGS

    assert REFUSED_FLAGS[-1] == "--use-session-server"
    for flag, value in [(flag, "my.module.attr") for flag in REFUSED_FLAGS[:-1]] + [(REFUSED_FLAGS[-1], "v2")]:
        with pytest.raises(ConfigError, match=flag):
            _build(miles_args(tmp_path, **{flag[2:].replace("-", "_"): value}))
    assert fake.bodies == []


def test_post_save_hook_publishes_each_hf_export(
    miles_stubs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bucket: tuple[Any, str]
) -> None:
    from miles.utils.misc import load_function

    from cwtrain.hotload import HotLoadSettings
    from cwtrain.integrations.miles import MilesRuntime, post_save

    monkeypatch.setenv("CWTRAIN_HOTLOAD_DEPLOYMENT_ID", "dep")
    args = miles_args(tmp_path, save_hf=str(tmp_path / "hf_exports" / "iter_{rollout_id}"))
    base = tiny_weights()
    write_hf_checkpoint(Path(args.hf_checkpoint), base)
    hook = load_function(args.custom_megatron_post_save_hook_path)
    with pytest.raises(ConfigError, match="--save-hf"):
        hook(argparse.Namespace(**{**vars(args), "save_hf": None}), 0, "/ckpt/iter_0000000", None)
    loader = RecordingLoader(*bucket, deployment_id="dep")
    settings = HotLoadSettings("dep", "ps", full_every=0, state_dir=str(tmp_path / "state"))
    MilesRuntime.current().use_post_save(post_save.PostSavePublisher(settings, loader))
    exports = {}
    weights = base
    for rollout_id in (0, 9):
        weights = nudge(weights, ["model.norm.weight"], rollout_id)
        exports[rollout_id] = _export(Path(args.save_hf.format(rollout_id=rollout_id)), weights)
        hook(argparse.Namespace(**{**vars(args), "rank": 1}), rollout_id, "/ckpt", str(exports[rollout_id]))
        metrics = hook(args, rollout_id, f"/ckpt/iter_{rollout_id:07d}", str(exports[rollout_id]))
        assert metrics["hotload/incremental"] == 1.0
    published = [(p[0], p[1], p[2]) for p in loader.published]
    assert published == [
        ("ps-v000000", "FULL", None),
        ("ps-v000001", "INCREMENTAL", "ps-v000000"),
        ("ps-v000010", "INCREMENTAL", "ps-v000001"),
    ]
    index = loader.published[2][4]
    assert index["metadata"]["version"] == "ps-v000010" and index["metadata"]["base_version"] == "ps-v000001"
    assert list(index["weight_map"]) == ["model.norm.weight"]
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["served_identity"]  # nothing staged
    json.dumps(metrics)


def test_legacy_function_style_through_miles_adapter(
    miles_stubs: Path, tmp_path: Path, fake: FakeCompletions, monkeypatch: pytest.MonkeyPatch
) -> None:
    from miles.rollout.base_types import RolloutFnTrainInput
    from miles.rollout.inference_rollout.compatibility import LegacyRolloutFnAdapter, call_rollout_function

    from cwtrain.integrations.slime.rollout import set_tokenizer

    set_tokenizer(None)
    monkeypatch.setenv("CWTRAIN_HOTLOAD_RUN_ID", "grpo-a")
    args = miles_args(tmp_path, rollout_function_path="cwtrain.integrations.miles.generate_rollout")
    fn, _ = _build(args)
    assert isinstance(fn, LegacyRolloutFnAdapter)
    output = call_rollout_function(fn, RolloutFnTrainInput(rollout_id=1))
    assert len(output.samples) == args.rollout_batch_size
    assert {s.weight_versions[-1] for g in output.samples for s in g} == {"4"}
