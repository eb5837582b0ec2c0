"""``docs/internals.md`` lists every module of the six packages, each with what it owns (issue 23).

The map is its tables: a row's first cell names one or more modules in backticks, its second
cell says what they own. A name is a full dotted module name (``cwtrain.hotload.loader``), or
one relative to the package the section's heading names in backticks (under
``### ... (`cwtrain.hotload.format`)``, ``chain`` is ``cwtrain.hotload.format.chain`` and
``__init__`` the package itself). Dotted relative names resolve against the heading's package,
and for the core sections against ``cwtrain`` (``infra.s3``). The test fails when a module is in
no row, when a row names no module that exists (a stale entry), or when a row's second cell is
empty.
"""

from __future__ import annotations

import re
from pathlib import Path

from test_imports import MODULES

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "internals.md"
_TICKED = re.compile(r"`([^`]+)`")


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def mapped(text: str) -> tuple[dict[str, str], list[str]]:
    """The modules the doc's tables list (module → what it owns) and the names that resolve to none."""
    found: dict[str, str] = {}
    unknown: list[str] = []
    package = "cwtrain"
    for line in text.splitlines():
        if line.startswith("#"):
            named = [n for n in _TICKED.findall(line) if n.startswith("cwtrain")]
            if named:
                package = named[-1]
            continue
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        cells = _cells(line)
        if len(cells) < 2 or cells[0] in ("module", "package"):
            continue
        owns = cells[1]
        for name in _TICKED.findall(cells[0]):
            module = _resolve(name, package)
            if module is None:
                unknown.append(f"{name} (under {package})")
            else:
                found[module] = owns
    return found, unknown


def _resolve(name: str, package: str) -> str | None:
    if name == "__init__":
        candidates = [package]
    elif name.startswith("cwtrain"):
        candidates = [name]
    else:
        candidates = [f"{package}.{name}", f"cwtrain.{name}", f"cwtrain.hotload.{name}"]
    return next((c for c in candidates if c in MODULES), None)


def test_the_reading_of_tables() -> None:
    text = """
### Files (`cwtrain.hotload.files`)
| module | owns |
|---|---|
| `__init__` | the wing |
| `checkpoint`, `write` | the opener; writers |
| `cwtrain.hotload.loader` | `HotLoader` |
| `no_such_module` | nothing |
## Elsewhere
| `infra.s3` | boto3 |
"""
    found, unknown = mapped(text)
    assert sorted(found) == [
        "cwtrain.hotload.files",
        "cwtrain.hotload.files.checkpoint",
        "cwtrain.hotload.files.write",
        "cwtrain.hotload.loader",
        "cwtrain.infra.s3",
    ]
    assert found["cwtrain.hotload.files.write"] == "the opener; writers"
    assert unknown == ["no_such_module (under cwtrain.hotload.files)"]


def test_every_module_is_on_the_map_with_what_it_owns() -> None:
    found, unknown = mapped(DOC.read_text(encoding="utf-8"))
    missing = sorted(set(MODULES) - set(found))
    assert not missing, "modules missing from docs/internals.md:\n" + "\n".join(missing)
    assert not unknown, "docs/internals.md names modules that do not exist:\n" + "\n".join(unknown)
    empty = sorted(module for module, owns in found.items() if not owns.strip())
    assert not empty, f"rows without what the module owns: {empty}"


def test_the_map_walks_a_publish_from_the_cli_and_slime_to_one_composer_and_says_why_miles_needs_slime() -> None:
    text = DOC.read_text(encoding="utf-8")
    walks = text.split("### Two walks of a publish: the CLI and slime's hook meet one composer", 1)[1].split("\n## ")[0]
    cli, slime = walks.split("**`cwtrain hotload publish", 1)[1].split("**slime's post-write hook**", 1)
    for walk in (cli, slime):
        assert "`lifecycle/cycle.py` `VersionCycle.publish`" in walk  # the same composer, entered once
        assert walk.count("`VersionCycle.publish`") == 1
    # every room a walk names is a file of the packages, and the named functions are defined in it
    sources = sorted(ROOT.glob("packages/*/src/cwtrain/**/*.py"))
    for room, name in re.findall(r"`([a-z_]+(?:/[a-z_]+)*\.py)`(?: `([A-Za-z_.]+)`)?", walks):
        files = [path for path in sources if path.as_posix().endswith("/" + room)]
        assert len(files) == 1, f"the walks name {room}, which is {len(files)} files"
        if name:
            last = name.rsplit(".", 1)[-1]
            code = files[0].read_text(encoding="utf-8")
            assert f"def {last}(" in code or f"class {last}" in code, f"{room} defines no {name}"
    assert "why it depends on cwtrain-slime" in text
