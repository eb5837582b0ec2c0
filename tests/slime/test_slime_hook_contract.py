"""The post-write hook as slime loads and calls it (frameworks.md sections 1.1 and 5)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from slime_driver import SlimeRun, nudge, slime_args, tiny_weights, write_hf_checkpoint

from cwtrain.errors import ConfigError, CWTrainError, SnapshotError


def _load(path: str) -> Any:
    from slime.utils.misc import load_function

    return load_function(path)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CWTRAIN_HOTLOAD_DEPLOYMENT_ID", "dep-1")
    monkeypatch.setenv("CWTRAIN_HOTLOAD_RUN_ID", "grpo-a")


def _run(
    tmp_path: Path,
    loader: Any,
    *,
    every: int = 0,
    mirror: bool = False,
    settings: dict[str, Any] | None = None,
    **overrides: Any,
) -> SlimeRun:
    from cwtrain.integrations.slime import HookConfig, SlimePublisher, SlimeRuntime

    base = tiny_weights()
    hf = write_hf_checkpoint(tmp_path / "hf", base)
    args = slime_args(tmp_path, hf, **overrides)
    config = HookConfig("dep-1", "grpo-a", full_every=every, mirror=mirror, **(settings or {})).with_state_dir(args)
    SlimeRuntime.current().use_publisher(SlimePublisher(config, loader=loader))
    return SlimeRun(args, base, _load(args.custom_update_weight_post_write_path))


def test_flag_value_resolves_to_the_function_by_slimes_rule(slime_stubs: Path) -> None:
    import cwtrain.integrations.slime as package

    hook = _load("cwtrain.integrations.slime.hook")
    assert hook is package.hook
    assert callable(hook) and not isinstance(hook, type(sys))
    assert _load("cwtrain.integrations.slime.actor_hook") is package.actor_hook
    from cwtrain.integrations import HookConfig
    from cwtrain.integrations import hook as reexported

    assert reexported is hook and HookConfig is package.HookConfig


def test_import_loads_no_framework() -> None:
    import subprocess

    code = (
        "import sys, cwtrain.integrations.slime;"
        "bad=[m for m in ('torch','ray','slime','miles') if m in sys.modules]; print(bad); sys.exit(bool(bad))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_baseline_then_deltas_skips_empty_and_keeps_the_chain(
    slime_stubs: Path, tmp_path: Path, env: None, recording_loader: Any
) -> None:
    run = _run(tmp_path, recording_loader)
    run.baseline()
    weights = tiny_weights()
    weights = nudge(weights, ["lm_head.weight"], 1)
    run.step(weights, writers=1)
    run.step(weights)  # nothing changed: an empty delta
    weights = nudge(weights, ["model.norm.weight", "model.embed_tokens.weight"], 2)
    directory = run.step(weights, writers=2)
    published = [(p[0], p[1], p[2]) for p in recording_loader.published]
    assert published == [
        ("grpo-a-v000000", "FULL", None),
        ("grpo-a-v000001", "INCREMENTAL", "grpo-a-v000000"),
        ("grpo-a-v000003", "INCREMENTAL", "grpo-a-v000001"),  # v2 was empty: v3 goes over v1
    ]
    assert recording_loader.published[0][3] == ["config.json", "model.safetensors", "model.safetensors.index.json"]
    assert recording_loader.published[2][3] == sorted(p.name for p in directory.iterdir())
    metrics = run.results
    assert metrics[0]["hotload/chain_cut"] == 1.0 and metrics[0]["hotload/completed"] == 1.0
    assert metrics[1]["hotload/incremental"] == 1.0 and metrics[1]["hotload/replicas_ready"] == 2.0
    assert metrics[2]["hotload/skipped_empty"] == 1.0 and metrics[2]["hotload/upload_seconds"] == 0.0
    assert metrics[3]["hotload/tensors_changed"] == 2.0
    assert all(key.startswith("hotload/") for m in metrics for key in m)
    state = Path(run.args.update_weight_disk_dir + "-hotload")
    assert (state / "served_identity").read_text() == "grpo-a-v000003\n"  # nvext.write_served_identity


def test_only_rank_zero_publishes(slime_stubs: Path, tmp_path: Path, env: None, recording_loader: Any) -> None:
    run = _run(tmp_path, recording_loader)
    run.world_size = 4
    run.baseline()
    run.step(nudge(tiny_weights(), ["lm_head.weight"], 0), writers=2)
    assert [p[0] for p in recording_loader.published] == ["grpo-a-v000000", "grpo-a-v000001"]


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("update_weight_delta_encoding", "overwrite", "--update-weight-delta-encoding xor"),
        ("update_weight_delta_checksum", "xxh3-128", "--update-weight-delta-checksum adler32"),
        ("update_weight_delta_checksum", "blake3", "--update-weight-delta-checksum adler32"),
    ],
)
def test_refuses_delta_settings_the_engine_cannot_apply(
    slime_stubs: Path, tmp_path: Path, env: None, recording_loader: Any, flag: str, value: str, message: str
) -> None:
    run = _run(tmp_path, recording_loader, **{flag: value})
    with pytest.raises(ConfigError, match=message):
        run.baseline()
    assert recording_loader.published == []


def test_adler_spelled_with_dash_is_accepted(
    slime_stubs: Path, tmp_path: Path, env: None, recording_loader: Any
) -> None:
    run = _run(tmp_path, recording_loader, update_weight_delta_checksum="Adler-32")
    run.baseline()
    assert recording_loader.published[0][0] == "grpo-a-v000000"


def test_versions_out_of_order_are_refused(slime_stubs: Path, tmp_path: Path, env: None, recording_loader: Any) -> None:
    run = _run(tmp_path, recording_loader)
    with pytest.raises(CWTrainError, match="before the baseline"):
        run.step(tiny_weights())
    run.version = 0
    shutil_root = Path(run.args.update_weight_disk_dir)
    run.baseline()
    run.version = 4  # slime would never skip versions
    with pytest.raises(SnapshotError, match="in order"):
        run.step(nudge(tiny_weights(), ["lm_head.weight"], 0))
    assert shutil_root.exists()


def test_failed_publish_surfaces_and_needs_a_full_next(
    slime_stubs: Path, tmp_path: Path, env: None, recording_loader: Any
) -> None:
    run = _run(tmp_path, recording_loader)
    run.baseline()
    recording_loader.fail_next_hot_load("upload refused")
    with pytest.raises(CWTrainError, match="upload refused"):
        run.step(nudge(tiny_weights(), ["lm_head.weight"], 0))
    # without a served copy the chain cannot be cut: the hook says so instead of sending a bad delta
    with pytest.raises(CWTrainError, match="CWTRAIN_HOTLOAD_MIRROR"):
        run.step(nudge(tiny_weights(), ["lm_head.weight"], 1))


def test_resumed_baseline_with_matching_manifest_is_not_published_again(
    slime_stubs: Path, tmp_path: Path, env: None, recording_loader: Any
) -> None:
    run = _run(tmp_path, recording_loader)
    run.baseline()
    manifest = recording_loader.manifests["grpo-a-v000000"]
    assert manifest["run_id"] == "grpo-a" and manifest["version"] == "000000"
    assert manifest["deployment_id"] == "dep-1" and manifest["checksum_format"] == "adler32"
    assert sorted(manifest["tensors"]) == sorted(tiny_weights())
    recording_loader.serve("other-v000007")  # since then, the replicas served another run
    run2 = _run(tmp_path, recording_loader)
    run2.baseline()
    assert len(recording_loader.published) == 1
    assert run2.results[0]["hotload/baseline_skipped"] == 1.0
    assert recording_loader.rollbacks == ["grpo-a-v000000"]  # pointed back at the run's baseline


@pytest.mark.faults
@pytest.mark.fault_row("trainer-restart")
def test_a_restarted_run_keeps_what_the_fleet_serves_and_goes_on_with_a_full_version(
    slime_stubs: Path, tmp_path: Path, env: None, recording_loader: Any
) -> None:
    run = _run(tmp_path, recording_loader, mirror=True)
    run.baseline()
    weights = tiny_weights()
    for step in (1, 2):
        weights = nudge(weights, ["lm_head.weight"], step)
        run.step(weights)
    # the trainer restarts from its checkpoint: slime captures its baseline again and counts from 1
    again = _run(tmp_path, recording_loader, mirror=True)
    again.baseline()
    assert recording_loader.rollbacks == []  # the replicas keep serving v2: not rolled back to the baseline
    baseline = again.results[0]
    assert baseline["hotload/baseline_skipped"] == 1.0 and baseline["hotload/served_version"] == 2.0
    assert baseline["hotload/chain_cut"] == baseline["hotload/incremental"] == 0.0  # nothing hot-loaded
    weights = nudge(weights, ["model.norm.weight"], 3)
    again.step(weights)  # weight_v000001: the resumed weights, as a delta on --hf-checkpoint
    later = nudge(weights, ["lm_head.weight"], 4)
    again.step(later)  # weight_v000002
    published = [(p[0], p[1], p[2]) for p in recording_loader.published]
    assert published[3:] == [
        ("grpo-a-v000003", "FULL", None),  # the next version, FULL: the replicas' bytes are not the base's
        ("grpo-a-v000004", "INCREMENTAL", "grpo-a-v000003"),
    ]
    assert recording_loader.manifests["grpo-a-v000003"]["tensors"] == _adler(weights)
    assert recording_loader.manifests["grpo-a-v000004"]["tensors"] == _adler(later)
    assert again.results[1]["hotload/cut_reason"] == 1.0 and again.results[2]["hotload/chain_length"] == 1.0


@pytest.mark.faults
@pytest.mark.fault_row("trainer-restart")
def test_a_restart_without_a_served_copy_stops_at_its_baseline_unless_it_may_roll_back(
    slime_stubs: Path, tmp_path: Path, env: None, recording_loader: Any
) -> None:
    run = _run(tmp_path, recording_loader)  # FULL_EVERY=0 without the mirror: deltas only
    run.baseline()
    run.step(nudge(tiny_weights(), ["lm_head.weight"], 1))
    with pytest.raises(ConfigError, match="CWTRAIN_HOTLOAD_ROLLBACK_ON_RESUME"):
        _run(tmp_path, recording_loader).baseline()  # it could publish no FULL version after it
    assert recording_loader.rollbacks == [] and len(recording_loader.published) == 2
    asked = _run(tmp_path, recording_loader, settings={"rollback_on_resume": True})
    asked.baseline()
    assert recording_loader.rollbacks == ["grpo-a-v000000"]  # asked for: back at the baseline
    asked.step(nudge(tiny_weights(), ["model.norm.weight"], 2))
    assert [(p[0], p[1], p[2]) for p in recording_loader.published][-1] == (
        "grpo-a-v000002", "INCREMENTAL", "grpo-a-v000000"
    )  # fmt: skip


def test_publish_baseline_off_requires_the_identity(
    slime_stubs: Path, tmp_path: Path, env: None, recording_loader: Any
) -> None:
    from cwtrain.integrations.slime import HookConfig, SlimePublisher

    hf = write_hf_checkpoint(tmp_path / "hf", tiny_weights())
    args = slime_args(tmp_path, hf)
    publisher = SlimePublisher(HookConfig("dep-1", "grpo-a", publish_baseline=False, full_every=0), recording_loader)
    with pytest.raises(CWTrainError, match="CWTRAIN_HOTLOAD_PUBLISH_BASELINE"):
        publisher(args, args.update_weight_disk_dir)


def test_full_mode_publishes_each_version_full(
    slime_stubs: Path, tmp_path: Path, env: None, recording_loader: Any
) -> None:
    run = _run(tmp_path, recording_loader, update_weight_mode="full")
    run.baseline()
    version = Path(run.args.update_weight_disk_dir) / "weight_v000001"
    write_hf_checkpoint(version, tiny_weights(1))  # a full checkpoint, as slime's full mode writes
    run.hook(run.args, str(version), [])
    assert [(p[0], p[1]) for p in recording_loader.published][-1] == ("grpo-a-v000001", "FULL")


def test_hook_config_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from cwtrain.infra.enums import PromptCachePolicy
    from cwtrain.integrations.slime import HookConfig

    env = {
        "CWTRAIN_HOTLOAD_DEPLOYMENT_ID": "d",
        "CWTRAIN_HOTLOAD_WAIT": "off",
        "CWTRAIN_HOTLOAD_FULL_EVERY": "3",
        "CWTRAIN_HOTLOAD_PROMPT_CACHE_POLICY": "reset_all",
        "CWTRAIN_API_HEADERS": '{"X-Secret": "s3cr3t"}',
    }
    config = HookConfig.from_env(env, default_run_id="run")
    assert (config.run_id, config.wait, config.full_every, config.use_mirror) == ("run", False, 3, True)
    assert HookConfig.from_env({**env, "CWTRAIN_HOTLOAD_FULL_EVERY": ""}, default_run_id="run").full_every == "auto"
    assert config.prompt_cache_policy is PromptCachePolicy.RESET_ALL
    assert "s3cr3t" not in repr(config)
    assert HookConfig.from_env(env, default_run_id="run", wait=True).wait is True
    fields = [f for f in HookConfig.__dataclass_fields__]
    # interface.md's positional order; issue 24's failure policy, issue 25's two settings
    # of the cost rule and issue 31's resume setting and sample canary bound come after it
    assert fields[:4] == ["deployment_id", "run_id", "wait", "timeout"] and fields[13] == "api_insecure"
    assert fields[14:] == ["on_failure", "full_share", "replay_budget", "rollback_on_resume", "canary_bound"]
    assert config.canary_bound == 0.05
    assert (
        HookConfig.from_env({**env, "CWTRAIN_HOTLOAD_CANARY_BOUND": "off"}, default_run_id="run").canary_bound is None
    )
    with pytest.raises(ConfigError, match="CWTRAIN_HOTLOAD_CANARY_BOUND"):
        HookConfig.from_env({**env, "CWTRAIN_HOTLOAD_CANARY_BOUND": "-1"}, default_run_id="run")
    with pytest.raises(ConfigError, match="CWTRAIN_HOTLOAD_FULL_EVERY"):
        HookConfig.from_env({**env, "CWTRAIN_HOTLOAD_FULL_EVERY": "65"}, default_run_id="run")
    with pytest.raises(ConfigError, match="MIRROR"):
        HookConfig.from_env({**env, "CWTRAIN_HOTLOAD_MIRROR": "0"}, default_run_id="run")
    with pytest.raises(ConfigError, match="DEPLOYMENT_ID"):
        HookConfig.from_env({}, default_run_id="run")
    with pytest.raises(ConfigError, match="run id"):
        HookConfig.from_env({**env, "CWTRAIN_HOTLOAD_RUN_ID": "a/b"})
    with pytest.raises(ConfigError, match="prompt cache policy"):
        HookConfig.from_env({**env, "CWTRAIN_HOTLOAD_PROMPT_CACHE_POLICY": "sometimes"}, default_run_id="r")
    with pytest.raises(ConfigError) as info:
        HookConfig.from_env({**env, "CWTRAIN_API_HEADERS": "{not json s3cr3t"}, default_run_id="r")
    assert "s3cr3t" not in str(info.value)


def test_default_run_id_and_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse
    import re

    from cwtrain.integrations.slime import default_run_id, is_rank_zero
    from cwtrain.integrations.slime.config import resolve_rank

    run = default_run_id(argparse.Namespace(update_weight_disk_dir="/shared/my run!/weights/"))
    assert re.fullmatch(r"weights-\d{8}T\d{6}Z", run)
    assert default_run_id(argparse.Namespace(update_weight_disk_dir="/x/weights")) == run  # fixed per process
    assert default_run_id(argparse.Namespace(update_weight_disk_dir="/")).startswith("slime-")
    long = default_run_id(argparse.Namespace(update_weight_disk_dir="/" + "a" * 300))
    assert len(long) == 100
    assert resolve_rank(argparse.Namespace(rank=3)) == 3
    monkeypatch.setenv("RANK", "2")
    assert not is_rank_zero(argparse.Namespace(rank=None))
    assert is_rank_zero(argparse.Namespace(rank=0))
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ConfigError, match="RANK"):
        resolve_rank(None)


def test_weights_unchanged_keep_numpy_semantics() -> None:
    # guard of the driver itself: nudging changes exactly the named tensors
    base = tiny_weights()
    moved = nudge(base, ["lm_head.weight"], 0)
    assert not np.array_equal(base["lm_head.weight"], moved["lm_head.weight"])
    assert np.array_equal(base["model.norm.weight"], moved["model.norm.weight"])


def _adler(weights: dict[str, np.ndarray]) -> dict[str, str]:
    import zlib

    return {n: f"{zlib.adler32(np.ascontiguousarray(a).tobytes()) & 0xFFFFFFFF:08x}" for n, a in weights.items()}


def test_chain_is_cut_from_the_served_copy_every_f_versions(
    slime_stubs: Path, tmp_path: Path, env: None, recording_loader: Any
) -> None:
    run = _run(tmp_path, recording_loader, every=3, mirror=True)
    run.baseline()
    weights = tiny_weights()
    history = {0: weights}
    for step in range(1, 8):
        if step != 4:  # version 4 is an empty delta
            weights = nudge(weights, ["lm_head.weight"] if step % 2 else ["model.norm.weight"], step)
        run.step(weights)
        history[step] = weights
    kinds = [(p[0].rsplit("-", 1)[1], p[1], p[2] and p[2].rsplit("-", 1)[1]) for p in recording_loader.published]
    assert kinds == [
        ("v000000", "FULL", None),
        ("v000001", "INCREMENTAL", "v000000"),
        ("v000002", "INCREMENTAL", "v000001"),
        ("v000003", "FULL", None),
        ("v000005", "INCREMENTAL", "v000003"),
        ("v000006", "FULL", None),
        ("v000007", "INCREMENTAL", "v000006"),
    ]
    # the cut is the served copy's tensors, sent from memory: nothing staged beside the served identity
    assert sorted(recording_loader.published[3][4]["weight_map"]) == sorted(tiny_weights())
    assert [p.name for p in Path(run.args.update_weight_disk_dir + "-hotload").iterdir()] == ["served_identity"]
    # the cut carries the baseline's small files: a FULL snapshot needs its config.json (issue 27)
    assert "config.json" in recording_loader.published[3][3]
    assert run.results[4]["hotload/skipped_empty"] == 1.0
    assert run.results[3]["hotload/chain_cut"] == 1.0 and run.results[3]["hotload/tensors_verified"] == 1.0
    # every manifest holds the Adler-32 of every tensor of exactly the weights of its version
    for version in (0, 3, 5, 6, 7):
        manifest = recording_loader.manifests[f"grpo-a-v{version:06d}"]
        assert manifest["tensors"] == _adler(history[version]), version
        assert manifest["version"] == f"{version:06d}"
    assert _adler(history[6]) != _adler(history[5])


def test_failed_publish_is_followed_by_a_full_cut(
    slime_stubs: Path, tmp_path: Path, env: None, recording_loader: Any
) -> None:
    run = _run(tmp_path, recording_loader, every=20, mirror=True)
    run.baseline()
    recording_loader.fail_next_hot_load("hot-load failed")
    with pytest.raises(CWTrainError):
        run.step(nudge(tiny_weights(), ["lm_head.weight"], 1))
    run.step(nudge(tiny_weights(), ["lm_head.weight", "model.norm.weight"], 2))
    assert [(p[0], p[1]) for p in recording_loader.published][-1] == ("grpo-a-v000002", "FULL")


def test_full_mode_needs_no_baseline_call(slime_stubs: Path, tmp_path: Path, env: None, recording_loader: Any) -> None:
    run = _run(tmp_path, recording_loader, update_weight_mode="full")
    version = Path(run.args.update_weight_disk_dir) / "weight_v000001"
    write_hf_checkpoint(version, tiny_weights(1))  # a lone model.safetensors, no index
    run.hook(run.args, str(version), [])
    assert [(p[0], p[1]) for p in recording_loader.published] == [("grpo-a-v000001", "FULL")]


def test_actor_hook_refuses_full_mode_that_deletes_versions(slime_stubs: Path, tmp_path: Path, env: None) -> None:
    from cwtrain.integrations.slime import actor_hook

    args = slime_args(tmp_path, tmp_path / "hf", update_weight_mode="full", update_weight_disk_keep_files=False)
    with pytest.raises(ConfigError, match="--update-weight-disk-keep-files"):
        actor_hook(args, str(tmp_path / "weights" / "weight_v000001"), [])
    assert actor_hook(slime_args(tmp_path, tmp_path / "hf", rank=1), "unused", []) is None


def test_wait_off_returns_once_created_and_verify_counts_replicas(
    slime_stubs: Path, tmp_path: Path, env: None, recording_loader: Any
) -> None:
    from cwtrain.integrations.slime import HookConfig, SlimePublisher

    hf = write_hf_checkpoint(tmp_path / "hf", tiny_weights())
    args = slime_args(tmp_path, hf)
    ahead = SlimePublisher(HookConfig("dep-1", "ahead", wait=False, full_every=0), recording_loader)
    metrics = ahead(args, args.update_weight_disk_dir)
    assert metrics["hotload/published"] == 1.0 and metrics["hotload/upload_seconds"] > 0
    assert metrics["hotload/completed"] == 0.0 and metrics["hotload/replicas_ready"] == 0.0  # not waited for
    verified = SlimePublisher(HookConfig("dep-1", "verified", verify=True, full_every=0), recording_loader)
    metrics = verified(args, args.update_weight_disk_dir)  # the next create waits for the one in flight first
    assert metrics["hotload/completed"] == 1.0 and metrics["hotload/replicas_verified"] == 2.0


def test_manifest_bytes_are_the_ones_published_before() -> None:
    from cwtrain.hotload.store.prefix_manifests import manifest_bytes, snapshot_manifest

    checksums = {"b.weight": "00000002", "a.weight": "00000001"}
    slime = snapshot_manifest("run-v000001", "dep-1", "run", checksums, "000001")
    assert manifest_bytes(slime) == (
        b'{\n"checksum_format": "adler32",\n"deployment_id": "dep-1",\n"identity": "run-v000001",\n'
        b'"run_id": "run",\n"tensors": {\n"a.weight": "00000001",\n"b.weight": "00000002"\n},\n"version": "000001"\n}'
    )
    nemo_rl = snapshot_manifest("run-v000001", "dep-1", "run", checksums)  # no local version string
    assert "version" not in nemo_rl and list(nemo_rl["tensors"]) == ["a.weight", "b.weight"]


def test_one_runtime_keeps_the_process_state_and_reset_starts_it_over(
    tmp_path: Path, env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import argparse
    import time
    import types

    import cwtrain.integrations.slime.runtime as runtime_module
    from cwtrain.integrations.slime import SlimeRuntime, default_run_id, reset
    from cwtrain.integrations.slime.rollout import set_tokenizer

    monkeypatch.delenv("CWTRAIN_HOTLOAD_RUN_ID")
    stamps = iter(["20240101T000000Z", "20250101T000000Z"])
    # the runtime's own clock, not the time module every thread shares (a stack's server threads log)
    clock = types.SimpleNamespace(gmtime=time.gmtime, strftime=lambda fmt, when: next(stamps))
    monkeypatch.setattr(runtime_module, "time", clock)
    args = argparse.Namespace(update_weight_disk_dir=str(tmp_path / "weights"), hf_checkpoint=None)
    state = SlimeRuntime.current()
    assert SlimeRuntime.current() is state
    publisher = state.publisher(args)
    assert state.publisher(args) is publisher  # one per run, built from the environment and args
    assert publisher.config.run_id == default_run_id(args) == "weights-20240101T000000Z"
    assert publisher.config.state_dir == str(tmp_path / "weights-hotload")

    class Tokenizer:
        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            return [ord(c) for c in text]

        def decode(self, ids: list[int]) -> str:
            return "".join(map(chr, ids))

    tokenizer = Tokenizer()
    set_tokenizer(tokenizer)
    assert state.tokenizer(args) is tokenizer
    reset()
    assert SlimeRuntime.current() is state and state.publisher(args) is not publisher
    assert default_run_id(args) == "weights-20250101T000000Z"  # a new run: a new stamp
    assert state.tokenizer(args) is None  # forgotten; none loads from a missing --hf-checkpoint


def test_the_hooks_metrics_reach_slimes_logger(
    slime_stubs: Path, tmp_path: Path, env: None, recording_loader: Any
) -> None:
    """slime discards what the hook returns: rank 0 logs through slime's own logging_utils."""
    from slime.observability.logging_utils import INITS, RECORDS

    RECORDS.clear()
    INITS.clear()
    run = _run(tmp_path, recording_loader, every=3, mirror=True)
    run.baseline()
    weights = tiny_weights()
    for step in (1, 2, 3):
        weights = nudge(weights, ["lm_head.weight"], step)
        run.step(weights, writers=2)
    run.step(weights)  # empty
    assert [(m["hotload/step"], key) for m, key in RECORDS] == [(float(v), "hotload/step") for v in range(5)]
    by_version = {int(m["hotload/version"]): m for m, _ in RECORDS}
    for version, (incremental, chain, served) in {
        0: (0.0, 0.0, 0.0),
        1: (1.0, 1.0, 1.0),
        2: (1.0, 2.0, 2.0),
        3: (0.0, 0.0, 3.0),  # the FULL cut (F = 3)
        4: (0.0, 0.0, 3.0),  # empty: nothing published, v3 still served
    }.items():
        metrics = by_version[version]
        assert (metrics["hotload/incremental"], metrics["hotload/chain_length"]) == (incremental, chain), version
        assert metrics["hotload/served_version"] == served, version
    for version in (0, 1, 2, 3):
        metrics = by_version[version]
        assert metrics["hotload/publish_seconds"] >= metrics["hotload/hot_load_seconds"] >= 0
        assert metrics["hotload/snapshot_bytes"] > 0
    assert by_version[3]["hotload/chain_cut"] == 1.0 and by_version[4]["hotload/skipped_empty"] == 1.0
    assert INITS == []  # without --use-wandb there is nothing to join


def test_metrics_join_the_wandb_run_where_rank_zero_has_no_tracker(
    slime_stubs: Path, tmp_path: Path, env: None, recording_loader: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With pipeline parallelism rank 0 is not slime's logging rank: it joins the run as slime's ranks do."""
    import types

    from slime.observability import logging_utils

    runs: list[Any] = []

    class Run:
        def __init__(self) -> None:
            self.summary: dict[str, Any] = {}

    def init_tracking(args: Any, primary: bool = True, **kwargs: Any) -> None:
        assert primary is False
        runs.append(Run())
        wandb.run = runs[-1]

    wandb = types.SimpleNamespace(run=None, define_metric=lambda *a, **k: defined.append((a, k)))
    defined: list[Any] = []
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    monkeypatch.setattr(logging_utils, "init_tracking", init_tracking)
    logging_utils.RECORDS.clear()
    run = _run(tmp_path, recording_loader, use_wandb=True, wandb_run_id="abc123")
    run.baseline()
    run.step(nudge(tiny_weights(), ["lm_head.weight"], 1))
    assert len(runs) == 1 and len(logging_utils.RECORDS) == 2  # joined once
    assert (("hotload/*",), {"step_metric": "hotload/step"}) in defined
    assert runs[0].summary["hotload/served_identity"] == "grpo-a-v000001"


def test_metrics_reach_slime_v0_3_1s_logging_module(
    slime_stubs: Path, tmp_path: Path, env: None, recording_loader: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Up to v0.3.1 slime's log() lives in slime.utils.logging_utils (no slime.observability)."""
    import types

    records: list[Any] = []
    legacy = types.ModuleType("slime.utils.logging_utils")
    legacy.log = lambda args, metrics, step_key: records.append(metrics)  # type: ignore[attr-defined]
    legacy.init_tracking = lambda args, primary=True, **kw: None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "slime.observability", None)  # absent: import fails
    monkeypatch.setitem(sys.modules, "slime.observability.logging_utils", None)
    monkeypatch.setitem(sys.modules, "slime.utils.logging_utils", legacy)
    run = _run(tmp_path, recording_loader)
    run.baseline()
    assert [m["hotload/step"] for m in records] == [0.0]


def test_a_slime_that_could_never_publish_is_stopped_at_start(slime_stubs: Path, tmp_path: Path) -> None:
    """No local engines and no --update-weight-standalone-publish: slime would skip every update silently."""
    from cwtrain.integrations.slime import init_hook

    args = slime_args(tmp_path, tmp_path / "hf", rollout_num_gpus=0)  # unpatched slime: the flag was dropped
    with pytest.raises(ConfigError, match=r"slime-standalone-publish\.patch"):
        init_hook(args)
    args.update_weight_standalone_publish = False  # patched slime, flag not passed
    with pytest.raises(ConfigError, match="pass --update-weight-standalone-publish"):
        init_hook(args)
    args.update_weight_standalone_publish = True
    init_hook(args)
    init_hook(slime_args(tmp_path, tmp_path / "hf", rollout_num_gpus=8))  # local engines: slime runs the hook


def test_every_process_of_a_run_derives_the_same_run_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hook (train rank 0) and the rollout function (rollout manager) are different processes."""
    import argparse

    from cwtrain.integrations.slime import default_run_id, reset
    from cwtrain.integrations.slime.rollout import rollout_run_id

    args = argparse.Namespace(update_weight_disk_dir="/shared/run/weights", wandb_run_id="k3x9q2")
    monkeypatch.setattr("cwtrain.integrations.slime.runtime.time.strftime", lambda *a: "20250101T000000Z")
    in_the_hook = default_run_id(args)
    reset()  # another process: another stamp
    monkeypatch.setattr("cwtrain.integrations.slime.runtime.time.strftime", lambda *a: "20250101T000005Z")
    assert default_run_id(args) == in_the_hook == rollout_run_id(args, {}) == "weights-k3x9q2"
    assert rollout_run_id(args, {"CWTRAIN_HOTLOAD_RUN_ID": "explicit"}) == "explicit"
    no_wandb = argparse.Namespace(update_weight_disk_dir="/nowhere/weights", wandb_run_id=None)
    assert rollout_run_id(no_wandb, {}) is None  # a per-process stamp cannot be shared


def test_auto_weighs_each_delta_directory_and_cuts_from_the_served_copy(
    slime_stubs: Path, tmp_path: Path, env: None, recording_loader: Any
) -> None:
    """``CWTRAIN_HOTLOAD_FULL_EVERY=auto``: a directory nearly as large as a FULL is published FULL from the mirror."""
    from cwtrain.integrations.slime import HookConfig, SlimePublisher, SlimeRuntime

    rng = np.random.default_rng(3)
    base = {f"model.layers.{i}.weight": rng.standard_normal((128, 128)).astype(np.float32) for i in range(3)}
    hf = write_hf_checkpoint(tmp_path / "hf", base)
    args = slime_args(tmp_path, hf)
    config = HookConfig("dep-1", "grpo-a", full_every="auto").with_state_dir(args)
    assert config.use_mirror  # auto cuts from the mirror
    SlimeRuntime.current().use_publisher(SlimePublisher(config, loader=recording_loader))
    run = SlimeRun(args, base, _load(args.custom_update_weight_post_write_path))
    run.baseline()
    sparse = nudge(base, ["model.layers.0.weight"], 1)
    run.step(sparse)
    dense = {name: rng.standard_normal(array.shape).astype(np.float32) for name, array in sparse.items()}
    directory = run.step(dense)
    kinds = [(p[0], p[1]) for p in recording_loader.published]
    assert kinds == [("grpo-a-v000000", "FULL"), ("grpo-a-v000001", "INCREMENTAL"), ("grpo-a-v000002", "FULL")]
    assert [m["hotload/cut_reason"] for m in run.results] == [1.0, 0.0, 6.0]
    assert "config.json" in recording_loader.published[2][3]  # the served copy's tensors and the base's files
    assert sorted(recording_loader.published[2][4]["weight_map"]) == sorted(base)
    assert sum(f.stat().st_size for f in directory.iterdir()) > 0.9 * run.results[0]["hotload/snapshot_bytes"]
    assert run.results[2]["hotload/replay_bytes"] == run.results[2]["hotload/snapshot_bytes"]
    manifest = recording_loader.manifests["grpo-a-v000002"]
    assert manifest["tensors"] == _adler(dense)  # the mirror holds exactly the new weights
