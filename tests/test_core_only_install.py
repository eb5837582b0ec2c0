"""A core-only install says what to install (issue 27), in throw-away venvs without torch.

Each venv holds cwtrain-core (editable, from its path) and, in the second case, cwtrain-local
without its dependencies. Third-party packages are borrowed from this interpreter's
site-packages through a directory of links to every entry there except torch and cwtrain's
own distributions, so torch is missing as in a core-only install, and no other cwtrain
package shows through (not even its metadata, which would announce its command groups).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Entries of site-packages left out of the borrowed directory.
_HIDDEN = ("torch", "functorch", "torchgen", "cwtrain", "_cwtrain", "__editable__")

pytestmark = pytest.mark.slow


def _make_venv(where: Path) -> Path:
    venv.EnvBuilder(with_pip=False).create(where)
    python = where / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    borrowed = where / "borrowed"
    borrowed.mkdir()
    ours = Path(sysconfig.get_paths()["purelib"])
    for entry in ours.iterdir():
        if not entry.name.lower().startswith(_HIDDEN):
            (borrowed / entry.name).symlink_to(entry)
    Path(purelib, "borrowed.pth").write_text(f"{borrowed}\n")
    return python


def _install(python: Path, *packages: str) -> None:
    editables = [arg for package in packages for arg in ("-e", str(ROOT / "packages" / package))]
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
         "--no-build-isolation", *editables],
        check=True, capture_output=True, text=True,
    )  # fmt: skip


def _run(python: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CWTRAIN_", "COREWEAVE_"))} | {"COLUMNS": "200"}
    return subprocess.run(
        [str(python.with_name("cwtrain")), *argv], capture_output=True, text=True, cwd="/", env=env, timeout=120
    )


def _one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr and "invalid choice" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    return errors[0]


def test_core_alone_names_the_package_of_every_missing_command_group(tmp_path: Path) -> None:
    python = _make_venv(tmp_path / "venv")
    _install(python, "cwtrain-core")
    assert subprocess.run([str(python), "-c", "import torch"], capture_output=True).returncode != 0

    listing = _run(python, "--help")
    assert listing.returncode == 0
    assert "demo" in listing.stdout and "(needs cwtrain-local: pip install ./packages/cwtrain-local)" in listing.stdout
    assert "(needs cwtrain-gym: pip install ./packages/cwtrain-gym)" in listing.stdout
    expected = {
        ("demo", "--steps", "2"): "cwtrain demo needs cwtrain-local",
        ("demo", "--help"): "cwtrain demo needs cwtrain-local",
        ("local", "up", "--replicas", "1"): "cwtrain local needs cwtrain-local",
        ("gym", "evaluate"): "cwtrain gym needs cwtrain-gym",
    }
    for argv, start in expected.items():
        line = _one_error_line(_run(python, *argv))
        package = start.rsplit(" ", 1)[1]
        assert (
            line
            == f"error: {start}, which is not installed; install it from a cwtrain checkout: pip install ./packages/{package}"
        )
    # core's own commands are unaffected
    assert _run(python, "hotload", "--help").returncode == 0

    # the torch codec, imported without torch: the install line, not a bare module name
    done = subprocess.run([str(python), "-c", "import cwtrain.hotload.codec.device"], capture_output=True, text=True)
    assert done.returncode == 1
    assert "ModuleNotFoundError: cwtrain.hotload.codec.device needs torch" in done.stderr
    assert 'pip install "./packages/cwtrain-core[torch]"' in done.stderr


def test_the_demo_without_torch_names_the_extra_to_install(tmp_path: Path) -> None:
    python = _make_venv(tmp_path / "venv")
    _install(python, "cwtrain-core", "cwtrain-local")  # without its dependencies: no torch
    line = _one_error_line(_run(python, "demo", "--steps", "1"))
    assert line.startswith("error: No module named 'torch'; torch is needed by")
    assert line.endswith('install it from a cwtrain checkout: pip install "./packages/cwtrain-core[torch]"')
