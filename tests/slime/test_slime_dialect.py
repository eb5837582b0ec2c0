"""A fork's dialect: how slime's hooks serve a fork of slime without naming it (made-up fork here)."""

from __future__ import annotations

import argparse
import logging
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from slime_driver import SlimeRun, slime_args, tiny_weights, write_hf_checkpoint


def _fork(records: list[Any]) -> Any:
    from cwtrain.integrations.slime import Dialect

    def log(module: types.ModuleType, args: argparse.Namespace, record: dict[str, float], step_key: str) -> Any:
        module.log(record, step_key)
        return None

    return Dialect(
        name="myfork",
        matches=lambda args: hasattr(args, "myfork_transfer"),
        gloo_modules=("myfork.distributed",),
        logging_modules=("myfork.tracking",),
        log=log,
        delta_mode=lambda args: getattr(args, "myfork_transfer", None) == "delta",
        hook_paths=("cwtrain.integrations.myfork.hook",),
    )


@pytest.fixture
def fork(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[Any], types.ModuleType]:
    """A registered fork whose tracking and distributed modules are in sys.modules."""
    from cwtrain.integrations.slime import dialect

    records: list[Any] = []
    tracking = types.ModuleType("myfork.tracking")
    tracking.log = lambda record, step_key: records.append((dict(record), step_key))  # type: ignore[attr-defined]
    distributed = types.ModuleType("myfork.distributed")
    distributed.get_gloo_group = lambda: "the fork's group"  # type: ignore[attr-defined]
    distributed.init_gloo_group = lambda: None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "myfork", types.ModuleType("myfork"))
    monkeypatch.setitem(sys.modules, "myfork.tracking", tracking)
    monkeypatch.setitem(sys.modules, "myfork.distributed", distributed)
    made_up = _fork(records)
    monkeypatch.setattr(dialect, "registered_dialects", lambda: (made_up,))
    return made_up, records, distributed


def test_slime_is_the_dialect_of_every_namespace_no_fork_claims(fork: Any, tmp_path: Path) -> None:
    from cwtrain.integrations.slime import SLIME_DIALECT, dialect_of

    made_up, _, _ = fork
    assert dialect_of(None) is SLIME_DIALECT
    assert dialect_of(slime_args(tmp_path, tmp_path / "hf")) is SLIME_DIALECT
    assert dialect_of(argparse.Namespace(myfork_transfer="delta")) is made_up
    assert SLIME_DIALECT.delta_mode(slime_args(tmp_path, tmp_path / "hf"))
    assert not SLIME_DIALECT.delta_mode(slime_args(tmp_path, tmp_path / "hf", update_weight_mode="full"))


def test_slimes_hooks_speak_the_forks_words(
    slime_stubs: Path, fork: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recording_loader: Any
) -> None:
    """Its gloo group, its delta flag, its logger, and its hook paths for the standalone check."""
    from cwtrain.errors import ConfigError
    from cwtrain.integrations.slime import HookConfig, SlimePublisher, SlimeRuntime, hook, init_hook
    from cwtrain.integrations.slime.barrier import check_standalone_publish, gloo_group
    from cwtrain.integrations.slime.dialect import hook_paths

    _, records, distributed = fork
    timeouts: list[Any] = []
    monkeypatch.setattr(
        "cwtrain.integrations.slime.barrier.set_group_timeout", lambda group, timeout: timeouts.append(group)
    )
    args = vars(slime_args(tmp_path, tmp_path / "hf"))
    del args["update_weight_mode"], args["update_weight_transport"]
    forked = argparse.Namespace(**args, myfork_transfer="delta")
    assert gloo_group(forked) == "the fork's group" and gloo_group(None) is None  # slime's group: not created
    init_hook(forked)
    assert timeouts == ["the fork's group"]  # the fork's group got the barrier timeout
    assert getattr(distributed.init_gloo_group, "__cwtrain_timeout__", False)  # a re-created group keeps it
    assert "cwtrain.integrations.myfork.hook" in hook_paths() and "cwtrain.integrations.slime.hook" in hook_paths()
    with pytest.raises(ConfigError, match="standalone-publish"):  # slime's check knows the fork's names for the hook
        check_standalone_publish(
            slime_args(
                tmp_path,
                tmp_path / "hf",
                rollout_num_gpus=0,
                custom_update_weight_post_write_path="cwtrain.integrations.myfork.hook",
            )
        )

    monkeypatch.setenv("CWTRAIN_HOTLOAD_DEPLOYMENT_ID", "dep-1")
    write_hf_checkpoint(Path(forked.hf_checkpoint), tiny_weights())
    config = HookConfig("dep-1", "fork", full_every=0).with_state_dir(forked)
    SlimeRuntime.current().use_publisher(SlimePublisher(config, loader=recording_loader))
    bad = argparse.Namespace(**{**vars(forked), "update_weight_delta_checksum": "xxh3-128"})
    with pytest.raises(ConfigError, match="adler32"):  # the fork's delta flag: its delta settings are checked
        hook(bad, forked.update_weight_disk_dir)
    SlimeRuntime.current().use_publisher(SlimePublisher(config, loader=recording_loader))
    run = SlimeRun(forked, tiny_weights(), hook)
    run.baseline()
    assert [(record["hotload/step"], key) for record, key in records] == [(0.0, "hotload/step")]  # the fork's logger
    assert timeouts == ["the fork's group"] * 3  # init_hook, then every call of the hook


def test_a_dialect_that_does_not_load_is_left_out(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from cwtrain.integrations.slime import SLIME_DIALECT, dialect

    class Point:
        def __init__(self, name: str, value: Any) -> None:
            self.name, self.value, self._value = name, f"made.up:{name}", value

        def load(self) -> Any:
            if isinstance(self._value, Exception):
                raise self._value
            return self._value

    points = [Point("b", SLIME_DIALECT), Point("a", ImportError("no module made")), Point("c", object())]
    monkeypatch.setattr(dialect, "entry_points", lambda group: points if group == dialect.ENTRY_POINT_GROUP else [])
    with caplog.at_level(logging.WARNING, logger=dialect.__name__):
        assert dialect.registered_dialects.__wrapped__() == (SLIME_DIALECT,)
    assert "the a dialect (made.up:a) does not load" in caplog.text and "is not a Dialect" in caplog.text
