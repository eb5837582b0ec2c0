"""Cross-package checks: one namespace, light imports, versions, the CLI entry."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import cwtrain
from cwtrain.cli import main

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(p for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").exists())


def _run_python(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout


def test_import_cwtrain_loads_neither_torch_nor_ray() -> None:
    code = (
        "import sys, cwtrain, cwtrain.errors, cwtrain.config, cwtrain.hotload, cwtrain.integrations\n"
        "from cwtrain.cli import build_parser\n"
        "build_parser()\n"
        "import json; print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'ray'))))\n"
    )
    assert json.loads(_run_python(code)) == []


def test_every_package_is_hatchling_src_layout_with_py_typed() -> None:
    names = {p.name for p in PACKAGES}
    assert names == {
        "cwtrain-core",
        "cwtrain-local",
        "cwtrain-slime",
        "cwtrain-miles",
        "cwtrain-nemo-rl",
        "cwtrain-gym",
    }
    for package in PACKAGES:
        meta = tomllib.loads((package / "pyproject.toml").read_text())
        assert meta["build-system"]["build-backend"] == "hatchling.build", package.name
        assert (package / "README.md").read_text().strip(), package.name
        typed = list((package / "src" / "cwtrain").rglob("py.typed"))
        assert typed, f"{package.name} ships no py.typed"


def test_only_core_ships_the_namespace_init_files() -> None:
    for package in PACKAGES:
        src = package / "src" / "cwtrain"
        owns = (src / "__init__.py").exists(), (src / "integrations" / "__init__.py").exists()
        if package.name == "cwtrain-core":
            assert owns == (True, True)
        else:
            assert owns == (False, False), (
                f"{package.name} must not ship cwtrain/__init__.py or integrations/__init__.py"
            )


def test_versions_agree_and_plugins_pin_core_to_the_same_version() -> None:
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    version = root["project"]["version"]
    for package in PACKAGES:
        meta = tomllib.loads((package / "pyproject.toml").read_text())["project"]
        assert meta["version"] == version, package.name
        if package.name != "cwtrain-core":
            pins = [d for d in meta["dependencies"] if d.startswith("cwtrain-core")]
            assert pins and all(d.endswith(f"=={version}") for d in pins), (package.name, pins)
    assert cwtrain.__version__ == version


def test_umbrella_extras_pull_each_package_from_its_path() -> None:
    """Every cwtrain distribution an extra installs comes from its path, its own cwtrain dependencies included.

    A plug-in that depends on another (miles on slime, NeMo-RL on Gym) names it by version in its
    pyproject.toml; an extra that left it out would send pip to an index for it, where another
    project's ``cwtrain-*`` distributions live.
    """
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = meta["optional-dependencies"]
    assert set(extras) == {"torch", "local", "slime", "miles", "nemo-rl", "gym", "all"}
    for extra, deps in extras.items():
        names = set()
        for dep in deps:
            name, _, url = dep.partition(" @ ")
            assert url.startswith("{root:uri}/packages/"), (extra, dep)
            assert (ROOT / url.removeprefix("{root:uri}/")).is_dir(), dep
            names.add(name.partition("[")[0])
        if extra not in ("all", "torch"):
            assert f"cwtrain-{extra}" in names, extra
        for name in list(names):  # what the extra's packages need of cwtrain, core aside (the base dependency)
            needed = tomllib.loads((ROOT / "packages" / name / "pyproject.toml").read_text())["project"]
            ours = {d.partition("==")[0].partition("[")[0] for d in needed["dependencies"] if d.startswith("cwtrain-")}
            assert ours - {"cwtrain-core"} <= names, (extra, sorted(ours - names))
    assert len(extras["all"]) == 6


def test_cli_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"cwtrain {cwtrain.__version__}"


@pytest.mark.parametrize("argv", [["no-such-group"], ["--no-such-option"], []])
def test_cli_usage_errors_exit_2_with_usage_and_one_error_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: cwtrain")
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in err


def test_console_script_help_lists_groups() -> None:
    out = subprocess.run(
        [str(Path(sys.executable).with_name("cwtrain")), "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "usage: cwtrain" in out
    for group in ("deployment", "hotload", "snapshot", "local", "demo"):
        assert group in out


def test_console_script_bad_subcommand_exits_2() -> None:
    done = subprocess.run(
        [str(Path(sys.executable).with_name("cwtrain")), "frobnicate"], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "invalid choice" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "module_name", ["cwtrain", "cwtrain.hotload", "cwtrain.infra", "cwtrain.errors", "cwtrain.cli"]
)
def test_every_public_name_resolves(module_name: str) -> None:
    import importlib

    module = importlib.import_module(module_name)
    missing = [name for name in module.__all__ if getattr(module, name, None) is None]
    assert missing == []


def test_top_level_names_pinned() -> None:
    assert sorted(cwtrain.__all__) == [
        "HotLoader",
        "InferenceClient",
        "TensorData",
        "__version__",
        "inspect_snapshot",
        "upload_snapshot",
    ]
    from cwtrain import HotLoader, InferenceClient

    assert HotLoader.__module__ == "cwtrain.hotload.loader"
    assert InferenceClient.__module__ == "cwtrain.infra.client"
    from cwtrain import TensorData
    from cwtrain.hotload import TensorData as HotLoadTensorData
    from cwtrain.hotload.format.tensors import TensorData as Original

    assert TensorData is HotLoadTensorData is Original


@pytest.mark.parametrize(
    ("module", "plugin", "record"),
    [
        ("slime", "cwtrain-slime", "cwtrain.integrations.slime.framework:SLIME"),
        ("ray", "cwtrain-slime", "cwtrain.integrations.slime.framework:RAY"),
        ("miles", "cwtrain-miles", "cwtrain.integrations.miles.framework:MILES"),
        ("nemo_rl", "cwtrain-nemo-rl", "cwtrain.integrations.nemo_rl.framework:NEMO_RL"),
        ("nemo_gym", "cwtrain-gym", "cwtrain.integrations.gym.framework:GYM"),
    ],
)
def test_each_plugin_owns_its_framework_record(module: str, plugin: str, record: str) -> None:
    """Declared in the plug-in's pyproject, found by core's ``registered`` (issue 23: core names no framework)."""
    from importlib import import_module

    from cwtrain.integrations.frameworks import ENTRY_POINT_GROUP, registered

    meta = tomllib.loads((ROOT / "packages" / plugin / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"][ENTRY_POINT_GROUP][module] == record
    found = registered(module)
    owner, _, name = record.partition(":")
    assert found is getattr(import_module(owner), name)
    assert found is not None and (found.module, found.plugin) == (module, plugin)
