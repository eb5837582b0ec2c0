"""The live-tensor actor's ``update_weights()`` against slime's stand-in actor and updaters.

It must do what slime's own ``update_weights()`` does around the updater (wake up and sleep
again with ``--offload-train``, move the ``--keep-old-actor`` queue, be timed), work with
every updater slime may pick (the full-disk and colocate ones have no chunked gather), hold
at most one ``--update-weight-buffer-size`` chunk of gathered tensors at a time, refuse at
start what it cannot do, and name what is really missing when slime's actor cannot import.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pytest
from recording_loader import RecordingLoader
from slime_driver import slime_args

from cwtrain.errors import ConfigError

torch = pytest.importorskip("torch")


def _weights(count: int = 12, numel: int = 64) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    out = {f"model.layers.{i}.mlp.up_proj.weight": torch.randn(numel, generator=gen) for i in range(count)}
    out["model.layers.0.mlp.experts.0.up_proj.weight"] = torch.randn(numel, generator=gen)
    return out


def _checkpoint(directory: Path, weights: dict[str, Any]) -> Path:
    import safetensors.torch

    directory.mkdir(parents=True, exist_ok=True)
    safetensors.torch.save_file(weights, str(directory / "model.safetensors"))
    (directory / "config.json").write_text('{"model_type": "qwen3"}')
    return directory


def _actor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_bucket: tuple[Any, str], **flags: Any
) -> tuple[Any, RecordingLoader]:
    """The live-tensor actor over the stand-in, publishing for real through a recording loader."""
    from slime.backends.megatron_utils.actor import MegatronTrainRayActor

    from cwtrain.integrations.slime import HookConfig, make_actor_cls
    from cwtrain.integrations.slime.tensors import TensorPublisher

    weights = _weights()
    hf = _checkpoint(tmp_path / "hf", weights)
    args = slime_args(tmp_path, hf, **flags)
    actor = make_actor_cls(MegatronTrainRayActor)(1, 0, None, None)
    actor.init(args, "actor")
    actor.weights = {name: tensor.clone() for name, tensor in weights.items()}
    loader = RecordingLoader(*s3_bucket, deployment_id="dep")
    config = HookConfig("dep", "live", full_every=0, state_dir=str(tmp_path / "state"))
    actor._cwtrain = TensorPublisher(config, loader=loader)
    return actor, loader


def _last(loader: RecordingLoader) -> tuple[str, list[str]]:
    """The identity of the last publish and the tensors its snapshot holds."""
    identity, _, _, _, index = loader.published[-1]
    return identity, sorted(index["weight_map"])


def _step(actor: Any) -> None:
    """An optimizer step: every tensor moves, in place."""
    for tensor in actor.weights.values():
        tensor.add_(0.5)


def test_full_disk_and_colocate_updaters_publish_through_slimes_own_gather(
    slime_stubs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_bucket: tuple[Any, str]
) -> None:
    """slime picks UpdateWeightFromDisk for --update-weight-transport disk: it has no _iter_*_chunks."""
    actor, loader = _actor(tmp_path, monkeypatch, s3_bucket, update_weight_mode="full", update_weight_transport="disk")
    assert not hasattr(actor.weight_updater, "_iter_non_expert_chunks")  # what slime picked
    actor.update_weights()  # the baseline
    _step(actor)
    actor.update_weights()
    identity, names = _last(loader)
    assert identity == "live-v000001" and names == sorted(actor.weights)  # expert pass included
    assert [p[0] for p in loader.published] == ["live-v000000", "live-v000001"]


def test_the_gather_holds_one_buffer_at_a_time(
    slime_stubs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_bucket: tuple[Any, str]
) -> None:
    from slime.backends.megatron_utils.update_weight.update_weight_from_distributed import GATHER

    buffer = 1024  # four 256-byte tensors per chunk
    actor, loader = _actor(tmp_path, monkeypatch, s3_bucket, update_weight_buffer_size=buffer)
    model_bytes = sum(t.numel() * t.element_size() for t in actor.weights.values())
    largest = max(t.numel() * t.element_size() for t in actor.weights.values())
    actor.update_weights()  # the baseline gathers too
    for full in (False, True):
        actor._cwtrain.publisher.session.cadence.force_full = full
        _step(actor)
        GATHER.reset()
        actor.update_weights()
        assert GATHER.gathered == model_bytes > 3 * buffer
        # slime's own updaters hold a buffer plus the tensor that overflows it; so may publishing
        assert GATHER.peak <= buffer + largest, (GATHER.peak, buffer, model_bytes)
        assert GATHER.alive == 0
    assert _last(loader)[0] == "live-v000002"


def test_offload_wakes_the_actor_and_puts_it_back_to_sleep(
    slime_stubs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_bucket: tuple[Any, str]
) -> None:
    """--offload-train (also from --offload or a critic): weights paused, groups destroyed after train()."""
    from slime.backends.megatron_utils.actor import torch_memory_saver

    actor, _ = _actor(tmp_path, monkeypatch, s3_bucket, offload_train=True, use_critic=True)
    gathered: list[tuple[int, int]] = []
    chunks = actor.cwtrain_chunks

    def recording_chunks() -> Any:
        gathered.append((len(actor.calls), torch_memory_saver.disabled))
        yield from chunks()

    monkeypatch.setattr(actor, "cwtrain_chunks", recording_chunks)
    actor.update_weights()
    assert actor.calls == [("wake_up", 0), ("sleep", 0)]  # as slime: outside the memory saver's disable()
    assert gathered == [(1, 1)]  # gathered after waking up, before sleeping, with the saver disabled


def test_keep_old_actor_moves_slimes_weight_queue(
    slime_stubs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_bucket: tuple[Any, str]
) -> None:
    actor, _ = _actor(tmp_path, monkeypatch, s3_bucket, keep_old_actor=True, update_weights_interval=1)
    actor.update_weights()
    assert actor.calls == [("copy", "rollout_actor", "old_actor"), ("backup", "rollout_actor")]
    actor.calls.clear()
    actor.args.update_weights_interval = 2
    _step(actor)
    actor.update_weights()
    assert actor.calls == [("backup", "old_actor")]


def test_update_weights_is_timed_like_slimes(
    slime_stubs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_bucket: tuple[Any, str]
) -> None:
    from slime.backends.megatron_utils.actor import TIMED

    actor, _ = _actor(tmp_path, monkeypatch, s3_bucket)
    TIMED.clear()
    actor.update_weights()
    assert TIMED == ["update_weights"]  # slime logs it as perf/update_weights_time


def test_metrics_reach_slimes_logger(
    slime_stubs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_bucket: tuple[Any, str]
) -> None:
    from slime.observability.logging_utils import RECORDS

    actor, _ = _actor(tmp_path, monkeypatch, s3_bucket)
    RECORDS.clear()
    actor.update_weights()
    _step(actor)
    actor.update_weights()
    steps = [(metrics["hotload/step"], key) for metrics, key in RECORDS]
    assert steps == [(0.0, "hotload/step"), (1.0, "hotload/step")]
    last = RECORDS[-1][0]
    assert last["hotload/served_version"] == 1.0 and last["hotload/chain_length"] == 1.0
    assert actor.weight_updater.update_weight_metrics == {}  # not left for a rank that may not log


@pytest.mark.parametrize(
    ("flag", "value"), [("colocate", True), ("release_train", True)], ids=["colocate", "release-train"]
)
def test_refused_at_start_naming_the_flag(slime_stubs: Path, tmp_path: Path, flag: str, value: Any) -> None:
    from slime.backends.megatron_utils.actor import MegatronTrainRayActor

    from cwtrain.integrations.slime import make_actor_cls

    actor = make_actor_cls(MegatronTrainRayActor)(1, 0, None, None)
    with pytest.raises(ConfigError, match="--" + flag.replace("_", "-")):
        actor.init(slime_args(tmp_path, tmp_path / "hf", **{flag: value}), "actor")
    assert actor.init(slime_args(tmp_path, tmp_path / "hf", **{flag: value}), "critic") == 0  # never publishes


def _fake_slime(root: Path, actor_source: str) -> Path:
    """A slime package whose actor module has ``actor_source`` (or none when empty)."""
    package = root / "slime"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    if actor_source:
        folder = package / "backends" / "megatron_utils"
        folder.mkdir(parents=True)
        for init in (package / "backends", folder):
            (init / "__init__.py").write_text("")
        (folder / "actor.py").write_text(actor_source)
    return root


def _drop_slime() -> None:
    for name in [m for m in sys.modules if m == "slime" or m.startswith("slime.")]:
        del sys.modules[name]


@pytest.mark.parametrize(
    ("source", "expected", "absent"),
    [
        ("from megatron.core import mpu\n", ["'megatron'", "Megatron-LM on PYTHONPATH"], "pip install"),
        ("import torch_memory_saver_x\n", ["'torch_memory_saver_x'", "install torch_memory_saver_x"], "cwtrain-slime"),
        ("", ["slime is installed", "no module slime.backends"], "pip install ./packages/cwtrain-slime"),
    ],
    ids=["megatron", "a dependency", "an older slime"],
)
def test_make_actor_cls_names_the_module_really_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, expected: list[str], absent: str
) -> None:
    from cwtrain.integrations.slime import make_actor_cls

    _drop_slime()
    monkeypatch.syspath_prepend(str(_fake_slime(tmp_path, source)))
    try:
        with pytest.raises(ImportError) as caught:
            make_actor_cls()
    finally:
        _drop_slime()
    message = str(caught.value)
    for part in expected:
        assert part in message, message
    assert absent not in message, message


def test_make_actor_cls_without_slime_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from cwtrain.integrations.slime import make_actor_cls

    _drop_slime()
    with pytest.raises(ImportError, match=r"slime is not installed.*pip install \./packages/cwtrain-slime"):
        make_actor_cls()


def test_the_live_tensor_args_checks_stand_alone() -> None:
    from cwtrain.integrations.slime.train_actor import check_live_tensor_args

    check_live_tensor_args(argparse.Namespace(colocate=False, release_train=False, offload_train=True))
    with pytest.raises(ConfigError, match="--colocate"):
        check_live_tensor_args(argparse.Namespace(colocate=True))
