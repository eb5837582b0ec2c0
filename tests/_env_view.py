"""A view of the test environment that holds only what one profile installs.

``scripts/profile_requirements.py`` says what each environment of the repository holds (``core``
for a custom trainer, ``demo`` for ``scripts/demo.sh``). :func:`make_view` builds a virtual
environment that sees exactly that: the profile's distributions and everything they require,
resolved from this interpreter's installed metadata, each linked (not copied) from this
environment's site-packages, with their console scripts. A guide run there fails on an import
the profile does not carry, as it would for a user who set up only that environment.
"""

from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys
import venv
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import profile_requirements  # noqa: E402

__all__ = ["PROFILES", "closure", "make_view"]

#: The profiles, each with our packages in it.
PROFILES = profile_requirements.PACKAGES


def _installed() -> dict[str, md.Distribution]:
    found: dict[str, md.Distribution] = {}
    for dist in md.distributions():
        found.setdefault(canonicalize_name(dist.metadata["Name"] or ""), dist)
    return found


def closure(profile: str) -> list[md.Distribution]:
    """The installed distributions of ``profile`` and, recursively, of what they require."""
    installed = _installed()
    roots = profile_requirements.distributions(profile) + profile_requirements.requirements(profile)
    pending = [(Requirement(r), "") for r in roots]
    chosen: dict[str, set[str]] = {}
    while pending:
        requirement, extra = pending.pop()
        if requirement.marker and not requirement.marker.evaluate({**default_environment(), "extra": extra}):
            continue
        name = canonicalize_name(requirement.name)
        if name in profile_requirements.LEFT_OUT:
            continue
        if name not in installed:
            raise LookupError(f"{requirement} (for profile {profile}) is not installed in {sys.prefix}")
        new = set(requirement.extras) | {""}
        if name in chosen and new <= chosen[name]:
            continue
        chosen[name] = chosen.get(name, set()) | new
        for line in installed[name].requires or []:
            pending += [(Requirement(line), e) for e in new]
    return [installed[name] for name in sorted(chosen)]


def make_view(profile: str, where: Path) -> Path:
    """A virtual environment at ``where`` seeing only ``profile``'s closure; its ``python``."""
    venv.EnvBuilder(with_pip=False).create(where)
    python = where / "bin" / "python"
    purelib = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    )  # fmt: skip
    for dist in closure(profile):
        site = Path(str(dist.locate_file("")))
        tops = {Path(str(f)).parts[0] for f in dist.files or []}
        for top in sorted(tops - {"..", "__pycache__"}):
            if (site / top).exists() and not (purelib / top).exists():
                (purelib / top).symlink_to(site / top)  # .pth files among them: editables work
        for entry in dist.entry_points.select(group="console_scripts"):
            module, _, attr = entry.value.partition(":")
            script = where / "bin" / entry.name
            call = f"{module}.{attr}" if attr else module
            script.write_text(f"#!{python}\nimport sys\nimport {module}\nsys.exit({call}())\n")
            script.chmod(0o755)
    return python
