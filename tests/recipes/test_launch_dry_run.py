"""The slime and miles launchers' training command, as ``CWTRAIN_DRY_RUN=1`` prints it.

The launchers run with the recipe's own settings (``config.yaml``) against a stand-in
framework checkout that provides only what the launcher reads from it: slime's model shell
script, miles' model-args utility (miles has no ``scripts/models/*.sh`` since before v0.1.0).
The contract suite (tests/contracts) runs the same command through the real frameworks'
argument parsers.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from recipe_files import RECIPES_DIR

MODEL_ARGS = "--swiglu --num-layers 36 --hidden-size 2560 --kv-channels 128 --qk-layernorm"
FILLED = {
    "CWTRAIN_HOTLOAD_DEPLOYMENT_ID": "dep",
    "CWTRAIN_ROLLOUT_BASE_URL": "https://example.invalid/v1",
    "CWTRAIN_ROLLOUT_MODEL": "Qwen3-4B",
    "AWS_REGION": "US-EAST-04A",
    "CWTRAIN_GIT": "git+https://example.invalid/cwtrain.git@v0",
}


def fake_framework(recipe: str, root: Path) -> Path:
    """A checkout with only what the launcher reads: the model flags."""
    if recipe == "slime":
        models = root / "scripts" / "models"
        models.mkdir(parents=True)
        (models / "qwen3-4B.sh").write_text(f"MODEL_ARGS=({MODEL_ARGS})\n")
    else:
        utility = root / "miles" / "utils" / "external_utils"
        utility.mkdir(parents=True)
        (utility / "model_args_utils.py").write_text(
            f"import sys\nassert sys.argv[1:] == ['qwen3-4B'], sys.argv\nprint({MODEL_ARGS!r})\n"
        )
    return root


def dry_run(recipe: str, framework: Path, work: Path, **extra: str) -> tuple[subprocess.CompletedProcess[str], Any]:
    """Run the launcher with the recipe's settings and ``CWTRAIN_DRY_RUN=1``; returns the result and its JSON."""
    settings = yaml.safe_load((RECIPES_DIR / recipe / "config.yaml").read_text(encoding="utf-8"))["data"]
    env = {key: str(value) for key, value in settings.items()}
    env.update(FILLED)
    env.update(
        PATH=os.environ["PATH"],
        COREWEAVE_API_TOKEN="t",
        WORK_DIR=str(work),
        FRAMEWORK_DIR=str(framework),
        CWTRAIN_DRY_RUN="1",
        **extra,
    )
    done = subprocess.run(
        ["bash", str(RECIPES_DIR / recipe / "launch.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    return done, json.loads(done.stdout) if done.returncode == 0 else None


def flag_value(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, flag
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize("recipe", ["miles", "slime"])
def test_the_training_command_starts_with_the_frameworks_model_flags(recipe: str, tmp_path: Path) -> None:
    done, command = dry_run(recipe, fake_framework(recipe, tmp_path / "fw"), tmp_path / "work")
    assert done.returncode == 0, done.stderr
    argv = command["argv"]
    assert argv[: len(MODEL_ARGS.split())] == MODEL_ARGS.split()
    assert command["script"] == "train.py"
    # Megatron's argument check, run by train.py itself, needs it with tensor parallelism
    assert flag_value(argv, "--tensor-model-parallel-size") == "2"
    assert command["runtime_env"]["env_vars"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert command["runtime_env"]["env_vars"]["PYTHONPATH"] == "/root/Megatron-LM"
    assert flag_value(argv, "--custom-megatron-init-path") == f"cwtrain.integrations.{recipe}.init_hook"
    assert flag_value(argv, "--rollout-num-gpus") == "0"
    assert not (tmp_path / "work" / "slime").exists()  # nothing cloned, installed or fetched


def test_miles_runs_with_no_local_engine_through_an_empty_sglang_config(tmp_path: Path) -> None:
    """--rollout-num-gpus 0 alone fails miles' server-group check; a model with no server groups does not."""
    done, command = dry_run("miles", fake_framework("miles", tmp_path / "fw"), tmp_path / "work")
    assert done.returncode == 0, done.stderr
    config = Path(flag_value(command["argv"], "--sglang-config"))
    assert yaml.safe_load(config.read_text()) == {"sglang": [{"name": "default", "server_groups": []}]}
    assert "--debug-train-only" not in command["argv"] and "placeholder" not in config.read_text()
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == [config.name]


def test_miles_needs_no_model_shell_script(tmp_path: Path) -> None:
    """miles replaced scripts/models/*.sh with Python before v0.1.0; a missing utility stops the launcher."""
    framework = fake_framework("miles", tmp_path / "fw")
    assert not (framework / "scripts").exists()
    (framework / "miles" / "utils" / "external_utils" / "model_args_utils.py").unlink()
    done, _ = dry_run("miles", framework, tmp_path / "work")
    assert done.returncode == 1 and "model flags" in done.stderr


def test_slime_keeps_the_patchs_flag(tmp_path: Path) -> None:
    done, command = dry_run("slime", fake_framework("slime", tmp_path / "fw"), tmp_path / "work")
    assert done.returncode == 0, done.stderr
    assert "--update-weight-standalone-publish" in command["argv"]
    assert flag_value(command["argv"], "--custom-update-weight-post-write-path") == "cwtrain.integrations.slime.hook"


@pytest.mark.parametrize("recipe", ["miles", "slime"])
def test_readmes_say_what_keeps_waiting_ranks_alive(recipe: str) -> None:
    """--distributed-timeout-minutes does not reach the gloo barrier; the init hook does."""
    readme = (RECIPES_DIR / recipe / "README.md").read_text(encoding="utf-8")
    assert f"--custom-megatron-init-path cwtrain.integrations.{recipe}.init_hook" in readme
    assert "30 minutes" in readme and "2 × `CWTRAIN_HOTLOAD_TIMEOUT`" in readme
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1" in readme
    assert "outlast" not in readme and "above `CWTRAIN_HOTLOAD_TIMEOUT` (1800 s) plus" not in readme
    if recipe == "miles":
        assert "give the rollout side a `placeholder`" not in readme and "server_groups: []" in readme
