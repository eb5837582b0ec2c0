"""``cwtrain`` and ``cwtrain.integrations`` merge across distributions, as wheels and as editables.

Each case makes a throw-away venv holding only cwtrain-core and cwtrain-slime (third-party
dependencies are borrowed from this interpreter's site-packages through a plain path
entry, which does not expose the editable installs of the other cwtrain packages).
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECK = """
import importlib.util, json, sys
import cwtrain, cwtrain.integrations
import cwtrain.integrations.slime as slime
import cwtrain.hotload, cwtrain.errors
from cwtrain.integrations import HookConfig, hook
print(json.dumps({
    "slime": slime.__file__,
    "declared": hook is slime.hook and HookConfig is slime.HookConfig,
    "cwtrain": cwtrain.__file__,
    "local": importlib.util.find_spec("cwtrain.local") is not None,
    "nemo_rl": importlib.util.find_spec("cwtrain.integrations.nemo_rl") is not None,
    "heavy": sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "ray")),
}))
"""


def _make_venv(where: Path) -> Path:
    venv.EnvBuilder(with_pip=False).create(where)
    python = where / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    # Borrow third-party packages (numpy, httpx, hatchling, ...) without cwtrain's editables.
    Path(purelib, "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def _pip(python: Path, *args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index", *args],
        check=True, capture_output=True, text=True,
    )  # fmt: skip


def _check(python: Path) -> dict[str, object]:
    import json

    out = subprocess.run([str(python), "-c", CHECK], capture_output=True, text=True, check=True, cwd="/")
    return dict(json.loads(out.stdout))


@pytest.mark.slow
def test_core_plus_slime_from_built_wheels(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    for package in ("cwtrain-core", "cwtrain-slime"):
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
             str(ROOT / "packages" / package)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
    built = sorted(p.name for p in wheels.glob("*.whl"))
    assert [name.split("-")[0] for name in built] == ["cwtrain_core", "cwtrain_slime"]
    python = _make_venv(tmp_path / "venv")
    _pip(python, *map(str, wheels.glob("*.whl")))
    found = _check(python)
    assert str(found["slime"]).startswith(str(tmp_path / "venv"))
    assert str(found["cwtrain"]).startswith(str(tmp_path / "venv"))
    assert found["local"] is False and found["nemo_rl"] is False
    assert found["declared"] is True
    assert found["heavy"] == []


@pytest.mark.slow
def test_core_plus_slime_as_editable_installs(tmp_path: Path) -> None:
    python = _make_venv(tmp_path / "venv")
    _pip(
        python, "--no-build-isolation",
        "-e", str(ROOT / "packages" / "cwtrain-core"), "-e", str(ROOT / "packages" / "cwtrain-slime"),
    )  # fmt: skip
    found = _check(python)
    assert str(found["slime"]).startswith(str(ROOT / "packages" / "cwtrain-slime" / "src"))
    assert str(found["cwtrain"]).startswith(str(ROOT / "packages" / "cwtrain-core" / "src"))
    assert found["local"] is False and found["nemo_rl"] is False
    assert found["declared"] is True
    assert found["heavy"] == []


def test_core_names_no_framework_and_plugins_declare_their_names() -> None:
    """``cwtrain.integrations`` resolves plug-in names through entry points, naming no framework itself."""
    import ast
    from importlib.metadata import entry_points

    import cwtrain.integrations as integrations
    import cwtrain.integrations.slime as slime

    tree = ast.parse(Path(str(integrations.__file__)).read_text(encoding="utf-8"))
    code = ast.unparse(ast.Module(body=tree.body[1:], type_ignores=[]))  # everything but the docstring
    assert ast.get_docstring(tree) and not [name for name in ("slime", "miles", "nemo", "gym") if name in code]
    declared = {ep.name: ep.value for ep in entry_points(group=integrations.ENTRY_POINT_GROUP)}
    assert declared["hook"] == "cwtrain.integrations.slime:hook"
    assert declared["HookConfig"] == "cwtrain.integrations.slime:HookConfig"
    from cwtrain.integrations import HookConfig, hook

    assert hook is slime.hook and HookConfig is slime.HookConfig
    with pytest.raises(ImportError, match="no_such_name"):
        from cwtrain.integrations import no_such_name  # noqa: F401
