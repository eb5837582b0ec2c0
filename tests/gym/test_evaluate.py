"""``evaluate`` refuses what cannot work before it talks to the API (no stack needed:
the client points at a closed port, so any request would fail differently)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gym_support import write_rows

from cwtrain.errors import CWTrainError, UsageError
from cwtrain.infra import InferenceClient
from cwtrain.integrations.gym import GymNotInstalledError, evaluate

EXAMPLE = Path(__file__).resolve().parents[2] / "recipes" / "nemo-gym" / "deployment.example.json"


def filled() -> dict[str, object]:
    text = EXAMPLE.read_text(encoding="utf-8")
    for name in ("gateway-id", "dynamo-vllm-version", "bucket", "base-model-path"):
        text = text.replace(f"<{name}>", "1.2.3" if name == "dynamo-vllm-version" else "x-" + name)
    return json.loads(text)  # type: ignore[no-any-return]


@pytest.fixture
def api() -> InferenceClient:
    return InferenceClient("t", base_url="http://127.0.0.1:9", max_retries=1)


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    config = tmp_path / "env.yaml"
    config.write_text("{}\n", encoding="utf-8")
    return config, write_rows(tmp_path / "rows.jsonl", [1.0])


def test_missing_gym_is_reported_before_a_deployment_exists(
    api: InferenceClient, files: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    config, rows = files
    with pytest.raises(GymNotInstalledError, match="pip install"):
        evaluate(api, filled(), config_paths=[config], input_path=rows, output_path=tmp_path / "o.jsonl", api_key="k")


def test_collector_check_runs_first(api: InferenceClient, files: tuple[Path, Path], tmp_path: Path) -> None:
    calls: list[str] = []

    class Refusing:
        def check(self) -> None:
            calls.append("check")
            raise CWTrainError("the collector is not ready")

        def __call__(self, job: object) -> None:
            calls.append("collect")

    config, rows = files
    with pytest.raises(CWTrainError, match="not ready"):
        evaluate(
            api, filled(), config_paths=[config], input_path=rows, output_path=tmp_path / "o.jsonl",
            api_key="k", collector=Refusing(),
        )  # fmt: skip
    assert calls == ["check"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_repeats": 0}, "at least 1"),
        ({"limit": 0}, "at least 1"),
        ({"concurrency": 0}, "at least 1"),
        ({"config_paths": [Path("/nonexistent.yaml")]}, "does not exist"),
    ],
)
def test_bad_options_are_refused(
    api: InferenceClient, files: tuple[Path, Path], tmp_path: Path, change: dict[str, object], message: str
) -> None:
    config, rows = files
    kwargs: dict[str, object] = {"config_paths": [config], "input_path": rows, "output_path": tmp_path / "o.jsonl"}
    kwargs.update(change)
    with pytest.raises(CWTrainError, match=message):
        evaluate(api, filled(), api_key="k", collector=lambda job: None, **kwargs)  # type: ignore[arg-type]


def test_relative_paths_are_found_where_gym_finds_them(
    api: InferenceClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cwtrain.integrations.gym.evaluation as evaluation

    install = tmp_path / "site-packages"  # a pip-installed Gym ships benchmarks/ beside nemo_gym/
    for name in ("benchmarks/aime24/config.yaml", "benchmarks/aime24/data/aime24_benchmark.jsonl",
                 "benchmarks/prompts/generic/math.yaml"):  # fmt: skip
        (install / name).parent.mkdir(parents=True, exist_ok=True)
        (install / name).write_text("{}\n", encoding="utf-8")
    monkeypatch.setattr(evaluation, "gym_install_root", lambda tools=None: install)
    monkeypatch.chdir(tmp_path)
    kwargs: dict[str, object] = {
        "config_paths": [Path("benchmarks/aime24/config.yaml")],
        "input_path": Path("benchmarks/aime24/data/aime24_benchmark.jsonl"),
        "output_path": tmp_path / "o.jsonl",
        "prompt_config": Path("benchmarks/prompts/generic/math.yaml"),
    }
    # every path found: evaluate goes on to the API (a closed port here)
    with pytest.raises(CWTrainError) as info:
        evaluate(api, filled(), api_key="k", collector=lambda job: None, **kwargs)  # type: ignore[arg-type]
    assert "does not exist" not in str(info.value)
    kwargs["prompt_config"] = Path("benchmarks/prompts/generic/absent.yaml")
    with pytest.raises(CWTrainError, match=f"absent.yaml does not exist .*Gym's install root {install}"):
        evaluate(api, filled(), api_key="k", collector=lambda job: None, **kwargs)  # type: ignore[arg-type]


def test_placeholders_are_refused(api: InferenceClient, files: tuple[Path, Path], tmp_path: Path) -> None:
    config, rows = files
    body = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    with pytest.raises(UsageError, match=r"gatewayIds\[0\] = '<gateway-id>'"):
        evaluate(
            api, body, config_paths=[config], input_path=rows, output_path=tmp_path / "o.jsonl",
            api_key="k", collector=lambda job: None,
        )  # fmt: skip


def test_exported_names_stay_themselves_after_every_submodule_is_imported() -> None:
    # A submodule named like an exported function replaces it on the package once imported.
    import subprocess
    import sys

    script = (
        "import importlib, pkgutil, types\n"
        "import cwtrain.integrations.gym as gym\n"
        "for info in pkgutil.iter_modules(gym.__path__):\n"
        "    importlib.import_module(f'cwtrain.integrations.gym.{info.name}')\n"
        "shadowed = [n for n in gym.__all__ if isinstance(getattr(gym, n), types.ModuleType)]\n"
        "assert not shadowed, shadowed\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
