"""cwtrain-nemo-rl against the REAL NeMo-RL v0.7.0 (``CWTRAIN_NEMO_RL_SRC``; skipped without it).

Run with ``scripts/contracts-nemo.sh`` (see docs/nemo-rl.md): NeMo-RL's dependencies must be
importable by the interpreter running pytest. NeMo-RL is imported from a copy of the tree
patched in place by ``python -m cwtrain.integrations.nemo_rl.patch``, as the recipe does.

* the plug-ins against the real interfaces (abstract methods, signatures, return values);
* the launch path: the patched tree keeps NeMo-RL's environment lookup; cwtrain's workers
  get the prebuilt environments of the workers they extend (``NEMO_RL_PY_EXECUTABLES_SYSTEM``
  as NeMo-RL applies it) and NeMo-RL's own worker group starts the DTensor worker there
  without building an environment (the worker then fails where it needs a GPU);
* the worker module imports whatever the Megatron import raises; an offloaded model is on
  the GPU while the real DTensor worker publishes;
* GRPO with a NeMo Gym environment on the coreweave backend, end to end on the local stack:
  the recipe's driver, NeMo-RL's Gym script, ``setup`` and ``grpo_train``, the ``NemoGym``
  actor and Gym's servers are real (only the policy trains on the CPU, see cpu_policy.py);
  the publish and hot-load metrics are in the run's TensorBoard files
  (needs ``CWTRAIN_NEMO_GYM_PYTHON``, see nemo_support.py).
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from nemo_support import (
    GYM_ENV_ROOT,
    HERE,
    UPSTREAM_DTENSOR,
    UPSTREAM_NEMO_GYM,
    gym_server_venvs,
    nemo_rl_paths,
    patched_nemo_rl,
    prebuilt_venv,
    pythonpath,
    variable,
    venv_of,
    write_tiny_tokenizer,
)

UPSTREAM_MEGATRON = "nemo_rl.models.policy.workers.megatron_policy_worker.MegatronPolicyWorker"


@pytest.fixture(scope="session")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The patched copy of NeMo-RL, first on ``sys.path`` and on the ``PYTHONPATH`` children inherit."""
    if "nemo_rl" in sys.modules and not str(sys.modules["nemo_rl"].__file__).startswith(
        str(tmp_path_factory.getbasetemp())
    ):
        pytest.skip("nemo_rl was imported before the suite (a stand-in?): run the contract suite on its own")
    root = patched_nemo_rl(tmp_path_factory.getbasetemp() / "nemo-rl")
    paths = [str(p) for p in nemo_rl_paths(root)]
    sys.path[:0] = paths
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = pythonpath(*paths)
    yield root
    if previous is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = previous


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter (NeMo-RL's registry reads its environment at import)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


# ------------------------------------------------------------------------------ interfaces


def test_plugins_implement_the_real_interfaces(tree: Path) -> None:
    import nemo_rl.algorithms.grpo as grpo
    from nemo_rl.models.generation.interfaces import GenerationInterface
    from nemo_rl.weight_sync.interfaces import WeightSynchronizer

    from cwtrain.integrations.nemo_rl.generation import CoreWeaveGeneration
    from cwtrain.integrations.nemo_rl.refit import grpo_hooks
    from cwtrain.integrations.nemo_rl.synchronizer import HotLoadWeightSynchronizer

    assert str(Path(grpo.__file__).resolve()).startswith(str(tree.resolve()))
    assert not CoreWeaveGeneration.__abstractmethods__ and not HotLoadWeightSynchronizer.__abstractmethods__
    assert issubclass(CoreWeaveGeneration, GenerationInterface)
    assert issubclass(HotLoadWeightSynchronizer, WeightSynchronizer)

    # init_collective: callable as the abstract method declares it, and as grpo.setup calls it
    env = {"CWTRAIN_ROLLOUT_BASE_URL": "http://127.0.0.1:9/v1", "CWTRAIN_ROLLOUT_MODEL": "m"}
    generation = CoreWeaveGeneration({"max_new_tokens": 4}, tokenizer=None, environ=env)  # type: ignore[arg-type]
    abstract = list(inspect.signature(GenerationInterface.init_collective).parameters)
    assert abstract == ["self", "ip", "port", "world_size"]
    assert generation.init_collective("1.2.3.4", 1, 2) == []
    assert generation.init_collective("1.2.3.4", 1, 2, train_world_size=1, refit_backend="nccl") == []
    generation.shutdown()

    # sync_weights returns what NeMo-RL's returns (None), with its parameters
    real = inspect.signature(WeightSynchronizer.sync_weights)
    ours = inspect.signature(HotLoadWeightSynchronizer.sync_weights)
    assert real.return_annotation in (None, "None") and ours.return_annotation in (None, "None")
    assert list(real.parameters) == list(ours.parameters)

    # the wrappers take exactly what NeMo-RL's functions take
    original_refit, original_setup = grpo.refit_policy_generation, grpo.setup
    hooks = grpo_hooks()
    try:
        refit = hooks.install_refit()
        setup = hooks.install_setup("cwtrain.integrations.nemo_rl.worker.CoreWeaveDTensorPolicyWorker")
        assert inspect.signature(refit) == inspect.signature(original_refit)
        assert list(inspect.signature(setup).parameters) == list(inspect.signature(original_setup).parameters)
        original_masking = grpo.compute_and_apply_seq_logprob_error_masking
        masking = hooks.install_masking()
        assert masking is grpo.compute_and_apply_seq_logprob_error_masking
        assert inspect.signature(masking) == inspect.signature(original_masking)
    finally:
        hooks.uninstall()
    assert grpo.compute_and_apply_seq_logprob_error_masking is original_masking
    # grpo_train calls it by its module-global name, with prev_logprobs computed and before the advantages
    train = inspect.getsource(grpo.grpo_train)
    call = train.index("compute_and_apply_seq_logprob_error_masking(")
    assert train.index('train_data["prev_logprobs"] = policy.get_logprobs(') < call < train.index("compute_advantage(")

    # the patch: the coreweave branch gives Gym the deployment's model name
    source = inspect.getsource(grpo.setup)
    assert 'elif backend == "coreweave":' in source
    assert "policy_generation.served_model_name" in source


def test_the_patched_tree_keeps_nemo_rls_environment_lookup(tree: Path) -> None:
    from nemo_rl.distributed.virtual_cluster import PY_EXECUTABLES
    from nemo_rl.utils.venvs import DEFAULT_VENV_DIR

    # NeMo-RL derives its project from where nemo_rl is imported: patched in place, that is the
    # whole tree (not a copy of nemo_rl/ without pyproject.toml, where `uv sync --directory` fails)
    assert f"--directory {tree}" in PY_EXECUTABLES.AUTOMODEL
    assert (tree / "pyproject.toml").is_file() and (tree / "uv.lock").is_file()
    assert Path(DEFAULT_VENV_DIR) == tree / "venvs"


@pytest.mark.parametrize("system", [False, True])
def test_workers_get_the_prebuilt_environments_of_the_workers_they_extend(
    tree: Path, tmp_path: Path, system: bool
) -> None:
    venvs = tmp_path / "ray_venvs"
    here = venv_of(sys.executable)
    dtensor = prebuilt_venv(venvs, UPSTREAM_DTENSOR, here)
    megatron = prebuilt_venv(venvs, UPSTREAM_MEGATRON, here)
    done = run_python(
        """
        import json
        from nemo_rl.distributed.ray_actor_environment_registry import ACTOR_ENVIRONMENT_REGISTRY, get_actor_python_env
        import cwtrain.integrations.nemo_rl as nemo
        chosen = nemo.register_workers()
        print(json.dumps({"chosen": chosen, "upstream": {k: ACTOR_ENVIRONMENT_REGISTRY[k] for k in (
            nemo.UPSTREAM_DTENSOR_WORKER_FQN, nemo.UPSTREAM_MEGATRON_WORKER_FQN)},
            "lookup": get_actor_python_env(nemo.DTENSOR_WORKER_FQN)}))
        """,
        {"NEMO_RL_VENV_DIR": str(venvs), "NEMO_RL_PY_EXECUTABLES_SYSTEM": "1" if system else "0"},
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    chosen = report["chosen"]
    ours_dtensor = chosen["cwtrain.integrations.nemo_rl.worker.CoreWeaveDTensorPolicyWorker"]
    ours_megatron = chosen["cwtrain.integrations.nemo_rl.worker.CoreWeaveMegatronPolicyWorker"]
    # NeMo-RL keeps its DTensor v2 worker in the AUTOMODEL environment, switch or not
    assert report["upstream"][UPSTREAM_DTENSOR].startswith("uv run --locked --extra automodel")
    assert ours_dtensor == str(dtensor) and report["lookup"] == str(dtensor)
    if system:  # NeMo-RL moves its Megatron worker to the driver's interpreter; cwtrain's follows
        assert report["upstream"][UPSTREAM_MEGATRON] == sys.executable == ours_megatron
    else:
        assert ours_megatron == str(megatron)


@pytest.mark.slow
def test_launch_path_reaches_worker_start_without_building_an_environment(tree: Path, tmp_path: Path) -> None:
    """NeMo-RL's own worker group starts cwtrain's DTensor worker in the prebuilt environment."""
    venvs = tmp_path / "ray_venvs"
    prebuilt = prebuilt_venv(venvs, UPSTREAM_DTENSOR, venv_of(sys.executable))
    done = run_python(
        """
        import json, os, ray
        import nemo_rl.distributed.worker_groups as worker_groups
        from nemo_rl.distributed.virtual_cluster import RayVirtualCluster
        from nemo_rl.distributed.worker_groups import RayWorkerBuilder, RayWorkerGroup
        from cwtrain.integrations.nemo_rl import DTENSOR_WORKER_FQN, install

        def build(*args, **kwargs):
            raise RuntimeError("NeMo-RL would build an environment for the worker")
        worker_groups.create_local_venv_on_each_node = build
        interpreters = []
        initializer = RayWorkerBuilder.IsolatedWorkerInitializer
        options = initializer.options
        def spy(**kwargs):
            interpreters.append(kwargs["runtime_env"]["py_executable"])
            return options(**kwargs)
        initializer.options = spy
        install()  # what the recipe's driver does before NeMo-RL's script runs
        ray.init(num_cpus=2, num_gpus=1, include_dashboard=False,
                 runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}})
        cluster = RayVirtualCluster(bundle_ct_per_node_list=[1], use_gpus=True, num_gpus_per_node=1,
                                    max_colocated_worker_groups=1)
        error = ""
        try:
            group = RayWorkerGroup(cluster, RayWorkerBuilder(DTENSOR_WORKER_FQN, config={}, tokenizer=None),
                                   name_prefix="contract")
            ray.get([worker.__ray_ready__.remote() for worker in group.workers])
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        print(json.dumps({"interpreters": interpreters, "error": error}))
        ray.shutdown()
        """,
        {"NEMO_RL_VENV_DIR": str(venvs)},
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["interpreters"] == [str(prebuilt)]
    error = report["error"]
    assert "would build an environment" not in error
    # the actor started and ran NeMo-RL's own worker __init__ (which then needs a real config and a GPU)
    assert "ActorDiedError" in error and "_DTensorImpl.__init__" in error, error
    assert "dtensor_policy_worker_v2.py" in error, error


# ------------------------------------------------------------------------------ worker module


def test_worker_module_imports_whatever_the_megatron_import_raises(tree: Path, tmp_path: Path) -> None:
    # Megatron-Bridge importing a Transformer Engine whose library is missing: only the Megatron
    # worker's chain meets it (a bare `megatron` package, whose `core` others probe, is fine)
    broken = tmp_path / "broken-te" / "megatron"
    (broken / "bridge").mkdir(parents=True)
    (broken / "__init__.py").write_text("")
    (broken / "bridge" / "__init__.py").write_text('raise AssertionError("libtransformer_engine.so not found")\n')
    probe = """
        import json
        import cwtrain.integrations.nemo_rl.worker as worker
        print(json.dumps({"dtensor": worker.CoreWeaveDTensorPolicyWorker is not None,
                          "megatron": worker.CoreWeaveMegatronPolicyWorker is not None,
                          "errors": {k: type(v).__name__ for k, v in worker.IMPORT_ERRORS.items()}}))
        """
    done = run_python(probe, {"PYTHONPATH": os.pathsep.join([str(broken.parent), os.environ["PYTHONPATH"]])})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {
        "dtensor": True,
        "megatron": False,
        "errors": {"nemo_rl.models.policy.workers.megatron_policy_worker": "AssertionError"},
    }
    # NeMo-RL's Megatron environment has no nemo_automodel: the module still imports there
    without_automodel = pythonpath(tree)
    done = run_python(probe, {"PYTHONPATH": without_automodel})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["dtensor"] is False
    assert report["errors"]["nemo_rl.models.policy.workers.dtensor_policy_worker_v2"] == "ModuleNotFoundError"


def test_real_dtensor_worker_publishes_an_offloaded_model_from_the_gpu(tree: Path, tmp_path: Path) -> None:
    import torch

    from cwtrain.integrations.nemo_rl.worker import CoreWeaveDTensorPolicyWorker

    impl = CoreWeaveDTensorPolicyWorker.__ray_metadata__.modified_class
    events: list[str] = []
    worker: Any = impl.__new__(impl)  # NeMo-RL's __init__ builds the model on a GPU; set what refit reads
    worker.model = torch.nn.Linear(2, 2, bias=False)
    worker.dtype = torch.float32
    worker.cpu_offload = True
    worker.move_to_cuda = lambda model: (events.append("move_to_cuda"), model)[1]
    worker.move_to_cpu = lambda model: (events.append("move_to_cpu"), model)[1]
    generator = worker.cwtrain_params

    def params() -> Iterator[tuple[str, torch.Tensor]]:
        events.append("gather")
        yield from generator()  # NeMo-RL's dtensor_params_generator

    worker.cwtrain_params = params
    assert worker.export_hf_checkpoint(str(tmp_path / "export")) == str(tmp_path / "export")
    assert events == ["move_to_cuda", "gather", "move_to_cpu"]


# ------------------------------------------------------------------------------ GRPO with NeMo Gym, end to end


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars: dict[str, list[tuple[int, float]]] = {}
    for events in sorted(log_dir.rglob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events.parent))
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            scalars.setdefault(tag, []).extend((e.step, e.value) for e in accumulator.Scalars(tag))
    return {tag: sorted(set(values)) for tag, values in scalars.items()}


@pytest.mark.slow
@pytest.mark.e2e
def test_grpo_with_a_nemo_gym_environment_trains_against_the_local_stack(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import yaml

    from cwtrain.local import LocalStack
    from cwtrain.local.engine.model import write_base_checkpoint

    gym_python = variable("CWTRAIN_NEMO_GYM_PYTHON", "an interpreter with NeMo-RL's dependencies and nemo-gym")
    gym_venv = venv_of(gym_python)
    steps = 3
    with LocalStack(replicas=1) as stack:
        target = stack.deploy(seed=0)
        hf = tmp_path / "hf"
        write_base_checkpoint(hf, seed=0)
        write_tiny_tokenizer(hf)
        rows = tmp_path / "train.jsonl"
        rows.write_text(
            "".join(
                json.dumps({"responses_create_params": {"input": [{"role": "user", "content": f"digits {i}"}]},
                            "agent_ref": {"name": "cwtrain_digits_simple_agent"}}) + "\n"
                for i in range(8)
            )
        )  # fmt: skip
        venvs = tmp_path / "ray_venvs"
        prebuilt_venv(venvs, UPSTREAM_NEMO_GYM, gym_venv)  # the image's NEMO_GYM environment
        servers = gym_server_venvs(
            tmp_path / "gym_venvs",
            gym_venv,
            [
                "resources_servers/cwtrain_digits",
                "responses_api_agents/simple_agent",
                "responses_api_models/vllm_model",
            ],
        )
        config = {
            "defaults": str(tree / "examples" / "configs" / "grpo_math_1B.yaml"),
            "grpo": {
                "num_prompts_per_step": 2, "num_generations_per_prompt": 4, "max_num_steps": steps,
                "max_num_epochs": 1, "val_period": 0, "val_at_start": False, "val_at_end": False,
                "max_val_samples": None, "async_grpo": {"enabled": False},
            },
            "loss_fn": {"reference_policy_kl_penalty": 0.0},
            "checkpointing": {"enabled": False, "checkpoint_dir": str(tmp_path / "ckpt")},
            "policy": {
                "model_name": str(hf),
                "tokenizer": {"name": str(hf)},
                "train_global_batch_size": 8,
                "train_micro_batch_size": 8,
                "logprob_batch_size": 8,
                "max_total_sequence_length": 64,
                "generation": {
                    "backend": "coreweave",
                    "max_new_tokens": 24,
                    "temperature": 1.0,
                    "top_p": 1.0,
                    "top_k": None,
                    "colocated": {"enabled": True},
                    "coreweave_cfg": {
                        "max_model_len": 64, "concurrency": 8, "timeout": 120, "run_id": "gym-e2e",
                        "state_dir": str(tmp_path / "hotload-state"),
                    },
                },
            },
            "data": {
                "max_input_seq_length": None, "shuffle": False, "num_workers": 0, "use_multiple_dataloader": False,
                "train": {"dataset_name": "NemoGymDataset", "data_path": str(rows)}, "validation": None,
                "default": {"dataset_name": "NemoGymDataset", "env_name": "nemo_gym", "prompt_file": None,
                            "system_prompt_file": None, "processor": "nemo_gym_data_processor"},
            },
            "env": {
                "should_use_nemo_gym": True,
                "should_log_nemo_gym_responses": False,
                "nemo_gym": {
                    "config_paths": [
                        "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml",
                        "resources_servers/cwtrain_digits/configs/cwtrain_digits.yaml",
                    ],
                    "uv_venv_dir": str(servers),
                    "skip_venv_if_present": True,
                },
            },
            "logger": {
                "log_dir": str(tmp_path / "logs"), "wandb_enabled": False, "tensorboard_enabled": True,
                "mlflow_enabled": False, "swanlab_enabled": False, "monitor_gpus": False,
            },
            "cluster": {"gpus_per_node": 1, "num_nodes": 1},
        }  # fmt: skip
        config_file = tmp_path / "grpo-gym.yaml"
        config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        env = {
            **os.environ,
            **stack.env(),
            "CWTRAIN_ROLLOUT_BASE_URL": target.base_url,
            "CWTRAIN_ROLLOUT_MODEL": target.model,
            "CWTRAIN_ROLLOUT_API_KEY": stack.token,
            "CWTRAIN_HOTLOAD_DEPLOYMENT_ID": target.deployment_id,
            "NEMO_RL_DIR": str(tree),
            "NEMO_RL_VENV_DIR": str(venvs),
            "NEMO_GYM_EXTRA_ROOTS": str(GYM_ENV_ROOT),
            "PYTHONPATH": pythonpath(*nemo_rl_paths(tree)),
            "PYTHONUNBUFFERED": "1",
        }
        log = tmp_path / "driver.log"
        with log.open("w") as out:
            done = subprocess.run(
                [sys.executable, str(HERE / "nemo_grpo_driver.py"), "--config", str(config_file)],
                # Gym 0.4 (NeMo-RL's own) finds server directories only under the working directory
                # and its install root: run where the contract's resources server is
                env=env, cwd=str(GYM_ENV_ROOT), stdout=out, stderr=subprocess.STDOUT, timeout=2400, check=False,
            )  # fmt: skip
        output = log.read_text(errors="replace")
        assert done.returncode == 0, output[-8000:]
        assert "Skipping metric 'train/generation_logger_metrics'" not in output
        state = (tmp_path / "hotload-state" / "served_identity").read_text().strip()

    scalars = tensorboard_scalars(tmp_path / "logs")
    # every step began with a refit by hot-load, logged at that step
    assert [step for step, _ in scalars["hotload/version"]] == list(range(1, steps + 1))
    assert [value for _, value in scalars["hotload/version"]] == [float(v) for v in range(steps)]
    assert all(value == 1.0 for _, value in scalars["hotload/completed"])
    assert [value for _, value in scalars["hotload/incremental"]] == [0.0] + [1.0] * (steps - 1)
    assert all(value > 0 for _, value in scalars["hotload/wire_bytes"])  # the policy changed every step
    # Gym's rollouts came through cwtrain's model_server endpoint, served by the published versions
    assert [value for _, value in scalars["train/coreweave/gym_requests"]] == [8.0] * steps
    assert [value for _, value in scalars["train/coreweave/served_version"]] == [float(v) for v in range(steps)]
    assert len(scalars["train/reward"]) == steps
    assert state == f"gym-e2e-v{steps - 1:06d}"
    # the sample canary judged every step's version from grpo_train's prev_logprobs: the right weights
    gaps = [value for _, value in scalars["hotload/canary_gap"]]
    print(f"NeMo-RL sample canary gaps (correct weights, real grpo_train with NeMo Gym): {gaps}")
    # (v0.7.0 with NeMo Gym: two verdicts reach the logger per step, not yet explained; each one passes)
    assert len({step for step, _ in scalars["hotload/canary_gap"]}) == steps and all(gap <= 0.05 for gap in gaps), gaps
    assert all(value == 1.0 for _, value in scalars["hotload/canary_passed"])
    assert all(value == 0.0 for _, value in scalars["hotload/canary_dropped_rows"])
