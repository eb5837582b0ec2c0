"""The NeMo-RL recipe's ``defaults:`` works with NeMo-RL anywhere (issue 27), as NeMo-RL v0.7.0 reads it.

``grpo-coreweave.yaml`` used to name ``/opt/nemo-rl/...`` while ``launch.sh`` honours
``NEMO_RL_DIR``: a NeMo-RL elsewhere failed with FileNotFoundError. The driver now resolves the
entry under ``NEMO_RL_DIR``. NeMo-RL v0.7.0's loader (``nemo_rl.utils.config``) reads an
absolute ``defaults:`` entry as is and a relative one from the file's own directory,
recursively; :func:`_load` does the same so the test needs no NeMo-RL.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "nemo-rl"


def _driver() -> ModuleType:
    spec = importlib.util.spec_from_file_location("run_grpo_coreweave", RECIPE / "run_grpo_coreweave.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _load(path: Path) -> dict[str, Any]:
    """NeMo-RL v0.7.0's inheritance rule: absolute entries as is, relative ones beside the file."""
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    entries = config.pop("defaults", [])
    merged: dict[str, Any] = {}
    for entry in entries if isinstance(entries, list) else [entries]:
        parent = Path(entry) if str(entry).startswith("/") else path.parent / str(entry)
        merged = _merge(merged, _load(parent))
    return _merge(merged, config)


@pytest.fixture
def nemo_rl(tmp_path: Path) -> Path:
    """A NeMo-RL checkout somewhere else than /opt/nemo-rl, with the recipe the config builds on."""
    root = tmp_path / "elsewhere" / "nemo-rl"
    configs = root / "examples" / "configs"
    (configs / "recipes" / "llm").mkdir(parents=True)
    (configs / "grpo_math_1B.yaml").write_text("grpo: {max_num_steps: 5, seed: 42}\npolicy: {precision: bfloat16}\n")
    (configs / "recipes" / "llm" / "grpo-nanov3-30BA3B-2n8g-fsdp2.yaml").write_text(
        "defaults: ../../grpo_math_1B.yaml\npolicy: {dtensor_cfg: {expert_parallel_size: 8}}\n"
    )
    return root


def test_the_recipe_config_loads_with_nemo_rl_anywhere(nemo_rl: Path, tmp_path: Path) -> None:
    mounted = tmp_path / "configmap"  # where the ConfigMap puts it, read-only in the pod
    mounted.mkdir()
    shutil.copy(RECIPE / "grpo-coreweave.yaml", mounted / "grpo-coreweave.yaml")
    with pytest.raises(FileNotFoundError):  # what NeMo-RL itself does with the file as shipped
        _load(mounted / "grpo-coreweave.yaml")
    argv = _driver().resolve_defaults(["--config", str(mounted / "grpo-coreweave.yaml"), "grpo.seed=7"], str(nemo_rl))
    assert argv[0] == "--config" and argv[2] == "grpo.seed=7" and argv[1] != str(mounted / "grpo-coreweave.yaml")
    config = _load(Path(argv[1]))
    assert config["grpo"]["max_num_steps"] == 1000 and config["grpo"]["seed"] == 42  # the recipe over the base
    assert config["policy"]["dtensor_cfg"]["expert_parallel_size"] == 8  # from NeMo-RL's recipe
    assert config["policy"]["precision"] == "bfloat16" and config["policy"]["generation"]["backend"] == "coreweave"


def test_absolute_and_beside_the_file_entries_keep_nemo_rl_meaning(nemo_rl: Path, tmp_path: Path) -> None:
    driver = _driver()
    absolute = tmp_path / "abs.yaml"
    absolute.write_text(f"defaults: {nemo_rl / 'examples/configs/grpo_math_1B.yaml'}\n")
    assert driver.resolve_defaults([f"--config={absolute}"], "/nowhere") == [f"--config={absolute}"]
    (tmp_path / "base.yaml").write_text("a: 1\n")
    beside = tmp_path / "beside.yaml"
    beside.write_text("defaults: [base.yaml]\nb: 2\n")
    assert driver.resolve_defaults(["--config", str(beside)], str(nemo_rl)) == ["--config", str(beside)]
    missing = tmp_path / "missing.yaml"
    missing.write_text("defaults: examples/configs/nothing.yaml\n")
    with pytest.raises(FileNotFoundError, match="set NEMO_RL_DIR"):
        driver.resolve_defaults(["--config", str(missing)], str(nemo_rl))
