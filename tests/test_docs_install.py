"""Every install line in the docs installs cwtrain from this repository's paths.

A distribution named ``cwtrain`` on the public index is another project, so a line such as
``pip install cwtrain`` or ``pip install "cwtrain-core[torch]"`` installs the wrong thing.
This reads every ``pip install`` / ``uv pip install`` / ``uv add`` / ``pipx install`` in
``README.md``, ``docs/*.md``, ``packages/*/README.md`` and ``recipes/**/README.md`` and
fails on any requirement that names a cwtrain distribution without being a path.
Third-party requirements (``nemo-gym``, ``torch``) are the frameworks' own and may come
from the index.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted(
    [
        ROOT / "README.md",
        *ROOT.glob("docs/*.md"),
        *ROOT.glob("packages/*/README.md"),
        *ROOT.glob("recipes/**/README.md"),
    ]
)
_INSTALL = re.compile(r"\b(?:pip3?\s+install|uv\s+pip\s+install|uv\s+add|pipx\s+install)\b([^\n`#;&|)]*)")
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
#: Options whose value is the next token (not a requirement).
_WITH_VALUE = {"-r", "--requirement", "-c", "--constraint", "-t", "--target", "-i", "--index-url", "--extra-index-url"}


def _requirements(arguments: str) -> list[str]:
    try:
        tokens = shlex.split(arguments)
    except ValueError:  # an unbalanced quote: prose around an inline command
        tokens = arguments.replace('"', " ").replace("'", " ").split()
    found: list[str] = []
    skip = False
    for token in tokens:
        if skip:
            skip = False
        elif token in _WITH_VALUE:
            skip = True
        elif not token.startswith("-") and not token.startswith("$"):
            found.append(token)
    return found


def _is_path(requirement: str) -> bool:
    return requirement.startswith((".", "/", "~")) or requirement.startswith("packages/")


def bad_install_lines(text: str) -> list[str]:
    """The install commands of ``text`` that take a cwtrain distribution from anywhere but a path."""
    bad = []
    for match in _INSTALL.finditer(text):
        for requirement in _requirements(match.group(1)):
            if _is_path(requirement):
                continue
            if "://" in requirement or "@" in requirement:  # a URL or a direct reference
                if "cwtrain" in requirement.lower():
                    bad.append(match.group(0).strip())
                continue
            name = _NAME.match(requirement)
            if name and re.fullmatch(r"cwtrain([-_.][a-z0-9-_.]+)?", name.group(1).lower()):
                bad.append(match.group(0).strip())
    return bad


@pytest.mark.parametrize(
    ("line", "bad"),
    [
        ("pip install cwtrain", True),
        ('pip install "cwtrain[torch]"', True),
        ("pip install -U cwtrain-core==0.1.0", True),
        ("uv pip install cwtrain_local", True),
        ("uv add cwtrain-slime", True),
        ("pipx install cwtrain", True),
        ("python -m pip install --no-deps git+https://example.com/cwtrain.git", True),
        ("see `pip install cwtrain-gym` for the plug-in", True),
        ("pip install ./packages/cwtrain-core ./packages/cwtrain-slime", False),
        ('pip install "./packages/cwtrain-core[torch]"', False),
        ('pip install ".[local]"   # umbrella', False),
        ('pip install "./[slime]"', False),
        ("pip install -e .", False),
        ('pip install "nemo-gym>=0.6.0"', False),
        ("python3 -m pip install --target /opt/site torch ray", False),
    ],
)
def test_the_check_itself(line: str, bad: bool) -> None:
    assert bool(bad_install_lines(line)) is bad


def test_the_docs_are_all_read() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in DOCS}
    assert {"README.md", "docs/quickstart-coreweave.md", "docs/cli.md", "packages/cwtrain-core/README.md"} <= names
    assert any(n.startswith("recipes/") for n in names)
    assert sum(len(_INSTALL.findall(p.read_text(encoding="utf-8"))) for p in DOCS) >= 10


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_install_line_installs_from_this_repository(doc: Path) -> None:
    bad = bad_install_lines(doc.read_text(encoding="utf-8"))
    assert not bad, f"{doc.relative_to(ROOT)} installs cwtrain from an index (use a path from a checkout): {bad}"


SOURCES = sorted(ROOT.glob("packages/*/src/**/*.py"))


def test_no_source_file_tells_users_to_install_cwtrain_from_an_index() -> None:
    """Docstrings and messages name install lines from this repository too (issue 27: ``"cwtrain[torch]"``)."""
    assert len(SOURCES) > 50
    bad = {
        str(p.relative_to(ROOT)): found for p in SOURCES if (found := bad_install_lines(p.read_text(encoding="utf-8")))
    }
    assert not bad, f"install lines that take cwtrain from an index: {bad}"
