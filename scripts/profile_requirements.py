"""What each environment of this repository holds: ``python scripts/profile_requirements.py PROFILE``.

A profile is a set of our packages (installed from their paths) and the third-party
requirements they bring, plus what the guides written for that environment import:

- ``core``: cwtrain-core with its ``torch`` extra, and ``safetensors``, which a custom trainer
  reads its checkpoints into torch with (``docs/custom-loop.md``);
- ``demo``: that and cwtrain-local, what ``scripts/demo.sh`` sets up, and the ``openai``
  client that ``docs/quickstart-local.md`` reads the served model with;
- ``full``: every package and the test tools (``requirements-dev.txt``), what ``scripts/test.sh``
  sets up.

Printed, one per line: the third-party requirements (our own distributions left out), with
``--packages`` the paths of our packages, or with ``--left-out`` the dependencies that are never
installed (triton: see ``scripts/setup-venv.sh``). ``scripts/setup-venv.sh`` installs from these, and
``tests/test_doc_examples.py`` runs each guide in a view of the test environment holding only
what the guide's profile holds (``tests/_env_view.py``). Standard library only: it runs before
anything is installed.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_ALL = ["cwtrain-core", "cwtrain-local", "cwtrain-slime", "cwtrain-miles", "cwtrain-nemo-rl", "cwtrain-gym"]
#: Our packages in each profile.
PACKAGES = {"core": _ALL[:1], "demo": _ALL[:2], "full": _ALL}
#: The extras of our packages every profile installs: cwtrain-local needs core's torch path, and a trainer has torch.
EXTRAS = {"cwtrain-core": ("torch",)}
#: Requirements from requirements-dev.txt each profile adds, by project name (None: all of them).
DEV_NAMES: dict[str, frozenset[str] | None] = {
    "core": frozenset({"safetensors"}),
    "demo": frozenset({"openai"}),
    "full": None,
}
#: Dependencies of torch that no profile installs (scripts/setup-venv.sh says why).
LEFT_OUT = frozenset({"triton"})
_OURS = re.compile(r"cwtrain([-_.\[=<>~! ]|$)")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")


def _name(requirement: str) -> str:
    match = _NAME.match(requirement.strip())
    return re.sub(r"[-_.]+", "-", match.group(0)).lower() if match else ""


def distributions(profile: str) -> list[str]:
    """Our distributions in ``profile``, with their extras (``cwtrain-core[torch]``, ...)."""
    return [f"{p}[{','.join(EXTRAS[p])}]" if p in EXTRAS else p for p in PACKAGES[profile]]


def requirements(profile: str) -> list[str]:
    """The third-party requirements of ``profile``, in order, each once."""
    lines: list[str] = []
    for package in PACKAGES[profile]:
        project = tomllib.loads((ROOT / "packages" / package / "pyproject.toml").read_text())["project"]
        found = list(project.get("dependencies", []))
        for extra in EXTRAS.get(package, ()):
            found += project["optional-dependencies"][extra]
        lines += [r for r in found if not _OURS.match(r.lower())]
    wanted = DEV_NAMES[profile]
    dev = [line.strip() for line in (ROOT / "requirements-dev.txt").read_text().splitlines()]
    lines += [r for r in dev if r and not r.startswith("#") and (wanted is None or _name(r) in wanted)]
    return list(dict.fromkeys(lines))


def main(argv: list[str]) -> int:
    if argv == ["--left-out"]:
        print("\n".join(sorted(LEFT_OUT)))
        return 0
    args = [a for a in argv if a != "--packages"]
    if len(args) != 1 or args[0] not in PACKAGES:
        print(f"usage: profile_requirements.py [--packages] {{{'|'.join(PACKAGES)}}} | --left-out", file=sys.stderr)
        return 2
    profile = args[0]
    lines = [f"packages/{p}" for p in PACKAGES[profile]] if "--packages" in argv else requirements(profile)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
