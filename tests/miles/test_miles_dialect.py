"""miles' dialect: slime's hooks on a miles namespace use miles' gloo group, tracking and disk-delta flag."""

from __future__ import annotations

import argparse
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from recording_loader import RecordingLoader
from slime_driver import SlimeRun, nudge, slime_args, tiny_weights, write_hf_checkpoint


def _miles_like(tmp_path: Path, **overrides: Any) -> argparse.Namespace:
    """slime's stand-in namespace with miles' --update-weight-transfer-mode instead of --update-weight-mode."""
    args = slime_args(tmp_path, tmp_path / "hf", **{"update_weight_transfer_mode": "disk-delta", **overrides})
    del args.update_weight_mode
    return args


def test_import_loads_no_framework() -> None:
    """Neither importing both plug-ins nor reading the registered dialects imports a framework."""
    code = (
        "import sys, cwtrain.integrations.slime, cwtrain.integrations.miles;"
        "from cwtrain.integrations.slime.dialect import registered_dialects; assert registered_dialects();"
        "bad=[m for m in ('torch','ray','slime','miles') if m in sys.modules]; print(bad); sys.exit(bool(bad))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_miles_dialect_is_registered_for_slimes_hooks(tmp_path: Path) -> None:
    from importlib.metadata import entry_points

    from cwtrain.integrations.miles.dialect import MILES_DIALECT
    from cwtrain.integrations.slime import SLIME_DIALECT, dialect_of
    from cwtrain.integrations.slime.dialect import ENTRY_POINT_GROUP, hook_paths, registered_dialects

    declared = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    assert declared["miles"] == "cwtrain.integrations.miles.dialect:MILES_DIALECT"
    assert MILES_DIALECT in registered_dialects()
    assert dialect_of(_miles_like(tmp_path)) is MILES_DIALECT
    assert dialect_of(slime_args(tmp_path, tmp_path / "hf")) is SLIME_DIALECT
    assert MILES_DIALECT.delta_mode(_miles_like(tmp_path))
    assert not MILES_DIALECT.delta_mode(_miles_like(tmp_path, update_weight_transfer_mode="broadcast"))
    assert {"cwtrain.integrations.miles.hook", "cwtrain.integrations.miles.actor_hook"} <= set(hook_paths())


def test_init_hook_lets_a_miles_run_without_engines_start(tmp_path: Path) -> None:
    """miles runs its updater without engines: slime's standalone-publish check does not apply."""
    from cwtrain.integrations.miles import init_hook

    miles_like = slime_args(tmp_path, tmp_path / "hf", rollout_num_gpus=0, update_weight_transfer_mode="disk-delta")
    del miles_like.update_weight_mode
    init_hook(miles_like)  # miles runs its updater without engines


def test_the_waiting_ranks_wait_on_miles_gloo_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cwtrain.integrations.miles import init_hook
    from cwtrain.integrations.slime.barrier import extend_gloo_timeout, gloo_group

    distributed = types.ModuleType("miles.utils.distributed_utils")
    distributed.get_gloo_group = lambda: "miles' group"  # type: ignore[attr-defined]
    distributed.init_gloo_group = lambda: None  # type: ignore[attr-defined]
    distributed.set_gloo_group = lambda group: None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "miles.utils.distributed_utils", distributed)
    timeouts: list[Any] = []
    monkeypatch.setattr(
        "cwtrain.integrations.slime.barrier.set_group_timeout", lambda group, timeout: timeouts.append(group)
    )
    args = _miles_like(tmp_path)
    assert gloo_group(args) == "miles' group"
    init_hook(args)
    extend_gloo_timeout(args)
    assert timeouts == ["miles' group", "miles' group"]
    assert getattr(distributed.init_gloo_group, "__cwtrain_timeout__", False)
    assert getattr(distributed.set_gloo_group, "__cwtrain_timeout__", False)


def test_post_write_metrics_reach_miles_tracking(
    miles_stubs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_bucket: tuple[Any, str]
) -> None:
    """slime's hook on a miles namespace logs through miles' tracking (its step key, joining the run)."""
    from miles.utils.tracking_utils import tracking

    from cwtrain.integrations.slime import HookConfig, SlimePublisher, SlimeRuntime, hook

    tracking.reset()
    monkeypatch.setenv("CWTRAIN_HOTLOAD_DEPLOYMENT_ID", "dep")
    args = _miles_like(tmp_path, use_wandb=True)
    write_hf_checkpoint(Path(args.hf_checkpoint), tiny_weights())
    loader = RecordingLoader(*s3_bucket, deployment_id="dep")
    SlimeRuntime.current().use_publisher(
        SlimePublisher(HookConfig("dep", "m", full_every=0).with_state_dir(args), loader)
    )
    run = SlimeRun(args, tiny_weights(), hook)
    run.baseline()
    run.step(nudge(tiny_weights(), ["lm_head.weight"], 0))
    assert tracking.INITS == [False] and tracking.DEFINED == [("hotload", "hotload/step")]
    assert [(step, key) for _, step, key in tracking.RECORDS] == [(0.0, "hotload/step"), (1.0, "hotload/step")]
    assert tracking.RECORDS[1][0]["hotload/incremental"] == 1.0
