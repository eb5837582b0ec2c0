"""cwtrain's NeMo-RL workers: which interpreter NeMo-RL starts them with, that one worker's
import failure never hides the other, and that an offloaded model is on the GPU while it is
published (against the stand-ins; tests/contracts/test_nemo_rl_real.py runs the same against
the real NeMo-RL)."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import cwtrain.integrations.nemo_rl as nemo

UPSTREAM_DTENSOR = "nemo_rl.models.policy.workers.dtensor_policy_worker_v2.DTensorPolicyWorkerV2"
UPSTREAM_MEGATRON = "nemo_rl.models.policy.workers.megatron_policy_worker.MegatronPolicyWorker"


def prebuilt(venv_dir: Path, fqn: str) -> str:
    """An image-style prebuilt environment named after NeMo-RL's worker."""
    python = venv_dir / fqn / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n", encoding="utf-8")
    return str(python)


def fresh_registry(monkeypatch: pytest.MonkeyPatch, system: bool) -> Any:
    """The registry module re-imported, reading NEMO_RL_PY_EXECUTABLES_SYSTEM as NeMo-RL does at import."""
    monkeypatch.setenv("NEMO_RL_PY_EXECUTABLES_SYSTEM", "1" if system else "0")
    monkeypatch.delitem(sys.modules, "nemo_rl.distributed.ray_actor_environment_registry", raising=False)
    module = importlib.import_module("nemo_rl.distributed.ray_actor_environment_registry")
    monkeypatch.setattr(module, "ACTOR_ENVIRONMENT_REGISTRY", dict(module.ACTOR_ENVIRONMENT_REGISTRY))
    return module


def test_workers_run_in_the_prebuilt_environments_of_the_workers_they_extend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = fresh_registry(monkeypatch, system=False)
    dtensor = prebuilt(tmp_path / "ray_venvs", UPSTREAM_DTENSOR)
    megatron = prebuilt(tmp_path / "ray_venvs", UPSTREAM_MEGATRON)
    chosen = nemo.register_workers({"NEMO_RL_VENV_DIR": str(tmp_path / "ray_venvs")})
    assert chosen == {nemo.DTENSOR_WORKER_FQN: dtensor, nemo.MEGATRON_WORKER_FQN: megatron}
    # NeMo-RL uses a value that does not start with "uv" as the interpreter: no environment is built
    assert registry.get_actor_python_env(nemo.DTENSOR_WORKER_FQN) == dtensor
    assert registry.get_actor_python_env(nemo.MEGATRON_WORKER_FQN) == megatron


def test_without_prebuilt_environments_the_workers_get_nemo_rls_own_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = fresh_registry(monkeypatch, system=False)
    chosen = nemo.register_workers({"NEMO_RL_VENV_DIR": str(tmp_path / "empty")})
    table = registry.ACTOR_ENVIRONMENT_REGISTRY
    assert chosen[nemo.DTENSOR_WORKER_FQN] == table[UPSTREAM_DTENSOR]
    assert chosen[nemo.MEGATRON_WORKER_FQN] == table[UPSTREAM_MEGATRON]
    assert table[UPSTREAM_DTENSOR].startswith("uv run --locked --extra automodel")


def test_system_switch_moves_the_megatron_worker_only_as_nemo_rl_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fresh_registry(monkeypatch, system=True)
    dtensor = prebuilt(tmp_path / "ray_venvs", UPSTREAM_DTENSOR)
    prebuilt(tmp_path / "ray_venvs", UPSTREAM_MEGATRON)
    chosen = nemo.register_workers({"NEMO_RL_VENV_DIR": str(tmp_path / "ray_venvs")})
    assert chosen[nemo.MEGATRON_WORKER_FQN] == sys.executable  # the driver's interpreter
    assert chosen[nemo.DTENSOR_WORKER_FQN] == dtensor  # NeMo-RL keeps its DTensor v2 worker in AUTOMODEL


def reimport_worker(monkeypatch: pytest.MonkeyPatch, megatron: str) -> Any:
    monkeypatch.setenv("NEMO_RL_STANDIN_MEGATRON", megatron)
    for name in ("cwtrain.integrations.nemo_rl.worker", "nemo_rl.models.policy.workers.megatron_policy_worker"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return importlib.import_module("cwtrain.integrations.nemo_rl.worker")


@pytest.mark.parametrize("megatron", ["missing", "broken"])
def test_dtensor_worker_imports_whatever_the_megatron_import_raises(
    monkeypatch: pytest.MonkeyPatch, megatron: str
) -> None:
    worker = reimport_worker(monkeypatch, megatron)
    assert worker.CoreWeaveDTensorPolicyWorker is not None
    assert worker.CoreWeaveMegatronPolicyWorker is None
    error = worker.IMPORT_ERRORS["nemo_rl.models.policy.workers.megatron_policy_worker"]
    assert isinstance(error, ModuleNotFoundError if megatron == "missing" else AssertionError)


def test_megatron_worker_is_built_where_megatron_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    worker = reimport_worker(monkeypatch, "importable")
    impl = worker.CoreWeaveMegatronPolicyWorker.__ray_metadata__.modified_class
    names = [c.__name__ for c in impl.__mro__]
    assert names.index("HotLoadWorkerMixin") < names.index("MegatronPolicyWorkerImpl")
    published = impl(params={"w": torch.ones(2)})
    assert [name for name, _ in published.cwtrain_params()] == ["w"]


class Moves:
    """Records where the model is whenever the worker touches it."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.device = "cpu"


def offloading_worker(moves: Moves, tmp_path: Path) -> Any:
    """cwtrain's DTensor worker class with cpu_offload on and CPU stand-ins for the device moves."""
    worker = importlib.import_module("cwtrain.integrations.nemo_rl.worker")
    impl = worker.CoreWeaveDTensorPolicyWorker.__ray_metadata__.modified_class

    class Recording(impl):  # type: ignore[misc,valid-type]
        def move_to_cuda(self, model: Any) -> Any:
            moves.events.append("to_cuda")
            moves.device = "cuda"
            return model

        def move_to_cpu(self, model: Any) -> Any:
            moves.events.append("to_cpu")
            moves.device = "cpu"
            return model

        def cwtrain_params(self) -> Iterator[tuple[str, torch.Tensor]]:
            moves.events.append(f"gather on {moves.device}")
            yield from super().cwtrain_params()

    model = torch.nn.Linear(2, 2, bias=False)
    instance = Recording(model=model, dtype=torch.float32)
    instance.cpu_offload = True
    return instance


def test_offloaded_model_is_on_the_gpu_while_it_is_published(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    moves = Moves()
    instance = offloading_worker(moves, tmp_path)

    class Share:
        def encode_owned(self, plan: Any, params: Iterator[tuple[str, torch.Tensor]]) -> str:
            names = [name for name, _ in params]
            moves.events.append(f"encoded {names}")
            return "result"

    monkeypatch.setattr(instance, "cwtrain_share", lambda: Share())
    assert instance.cwtrain_encode_share(plan=None) == "result"
    assert moves.events == ["to_cuda", "gather on cuda", "encoded ['weight']", "to_cpu"]


def test_offloaded_model_goes_back_to_the_cpu_when_publishing_fails(tmp_path: Path) -> None:
    """The worker's real RankShare: the gather fails midway; the error is reported, the model is back on the CPU."""
    from cwtrain.hotload import SharePlan

    moves = Moves()
    instance = offloading_worker(moves, tmp_path)
    gather = type(instance).cwtrain_params

    def failing(self: Any) -> Iterator[tuple[str, torch.Tensor]]:
        yield from gather(self)
        raise RuntimeError("gather failed")

    type(instance).cwtrain_params = failing
    result = instance.cwtrain_encode_share(plan=SharePlan("run-v000000", True, None, "bucket", "hotload"))
    assert result.rank == 0 and result.error is not None and "RuntimeError: gather failed" in result.error
    assert moves.events == ["to_cuda", "gather on cuda", "to_cpu"] and moves.device == "cpu"
    assert instance.cwtrain_share().served == {}  # nothing to commit: the served copy stays as it was


def test_offloaded_model_is_on_the_gpu_while_it_is_exported(tmp_path: Path) -> None:
    moves = Moves()
    instance = offloading_worker(moves, tmp_path)
    out = instance.export_hf_checkpoint(str(tmp_path / "export"))
    assert out == str(tmp_path / "export") and os.path.isfile(tmp_path / "export" / "model.safetensors")
    assert moves.events == ["to_cuda", "gather on cuda", "to_cpu"]


def test_worker_without_offload_is_not_moved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    moves = Moves()
    instance = offloading_worker(moves, tmp_path)
    instance.cpu_offload = False
    instance.export_hf_checkpoint(str(tmp_path / "export"))
    assert moves.events == ["gather on cpu"]
