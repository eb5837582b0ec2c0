"""The import graph of the six packages' sources: no cycle, and nobody reaches into privates.

Built statically with :mod:`ast` from ``packages/*/src/cwtrain/**/*.py`` (nothing is imported),
so a cycle that only shows on some import order, or inside a function, is still seen.

What counts as an import of module ``M`` by module ``A``:

* ``import M`` / ``import M as m``, and ``from P import n`` where ``P.n`` is a module (then the
  edge goes to ``P.n``) or not (then to ``P``, whose ``__init__`` defines or re-exports ``n``);
  relative forms are resolved against ``A``'s package first.
* Imports anywhere in the file: at the top, inside functions and methods (a lazy import is a
  dependency that runs later, not a smaller one), and under ``if TYPE_CHECKING:``. Type-only
  imports are kept on purpose: a module that needs another's types to be read or checked
  depends on it, and a cycle hidden behind ``TYPE_CHECKING`` is a layering cycle all the same
  (mypy and every reader must follow it). This also keeps the check simple and strict.
* An edge goes to the module named, not to the packages above it: ``import cwtrain.a.b`` runs
  ``cwtrain/a/__init__.py`` too, but counting that would make every package that re-exports its
  own submodules a "cycle". A module that imports names from its own package's ``__init__``
  (``from cwtrain.a import X`` inside ``cwtrain/a/b.py``, where ``__init__`` imports ``b``) is a
  real cycle and is reported.

What counts as reaching into a private (the rule: nothing outside a module touches its
underscored names; dunder names such as ``__version__`` are public):

* ``from cwtrain.x.m import _name`` from any other module;
* ``m._name`` where ``m`` is bound in the file to a cwtrain module (``import cwtrain.x.m as m``,
  ``from cwtrain.x import m``, or the full dotted path ``cwtrain.x.m._name``);
* importing a private module ``cwtrain/x/_y.py`` from outside its own package ``cwtrain.x``
  (its package and that package's subpackages may use it);
* ``obj._name`` on an object (not ``self``/``cls``) where ``_name`` is not defined in the module
  itself but is defined by another cwtrain module (a method, a class attribute, a ``self._name``
  assignment): without types this is a heuristic, it sees the reach of
  ``self.publisher._write_manifest(...)`` into the publisher's module, and it leaves out privates
  of other projects' objects (a framework's ``updater._iter_chunks``), which no cwtrain module defines.

Tests are not checked: they may import privates to test them.
"""

from __future__ import annotations

import ast
from collections import deque
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "packages").glob("*/src"))


@dataclass(frozen=True)
class Reach:
    importer: str
    target: str  # "cwtrain.x.m._name", a private module "cwtrain.x._y", or "obj._name" on an object
    line: int
    note: str = ""

    def __str__(self) -> str:
        return f"{self.importer}:{self.line} uses {self.target}{self.note}"


def _modules() -> dict[str, Path]:
    """Every source module of the six packages by dotted name (a package by its ``__init__``)."""
    found: dict[str, Path] = {}
    for src in SOURCES:
        for path in sorted((src / "cwtrain").rglob("*.py")):
            parts = list(path.relative_to(src).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join(parts)
            assert name not in found, f"{name} is defined twice: {found[name]} and {path}"
            found[name] = path
    return found


MODULES = _modules()


def _is_package(name: str) -> bool:
    return name in MODULES and MODULES[name].name == "__init__.py"


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _resolve_from(importer: str, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` statement names."""
    if not node.level:
        return node.module or ""
    package = importer if _is_package(importer) else importer.rpartition(".")[0]
    base = package.split(".")
    if node.level > 1:
        base = base[: -(node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _owner(name: str) -> str | None:
    """The deepest cwtrain module that ``name`` (a dotted module path) names, if any."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _private_module_reach(importer: str, module: str) -> bool:
    """Whether ``importer`` may not import ``module`` because a private part sits outside its package."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if _private(part):
            package = ".".join(parts[:i])
            if importer != package and not importer.startswith(package + "."):
                return True
    return False


def _dotted(node: ast.expr) -> str | None:
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        names.append(node.id)
        return ".".join(reversed(names))
    return None


def _defined_privates(tree: ast.Module) -> set[str]:
    """The underscored names a module defines: defs, classes, assigned names, ``self._x``/``cls._x``, arguments."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            names.add(node.attr)
    return {name for name in names if _private(name)}


def _tree(name: str) -> ast.Module:
    return ast.parse(MODULES[name].read_text(encoding="utf-8"), str(MODULES[name]))


TREES = {name: _tree(name) for name in MODULES}
DEFINERS: dict[str, set[str]] = {}  # private name -> the modules that define it
for _name, _module_tree in TREES.items():
    for _defined in _defined_privates(_module_tree):
        DEFINERS.setdefault(_defined, set()).add(_name)


def _scan(importer: str, tree: ast.Module) -> tuple[set[str], list[Reach]]:
    """The cwtrain modules ``importer`` (parsed as ``tree``) imports, and its reaches into others' privates."""
    own = _defined_privates(tree)
    edges: set[str] = set()
    reaches: list[Reach] = []
    aliases: dict[str, str] = {}  # local name -> cwtrain module it is bound to

    def use(module: str, line: int) -> None:
        if module != importer:
            edges.add(module)
        if _private_module_reach(importer, module):
            reaches.append(Reach(importer, module, line))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                module = _owner(alias.name)
                if module is None:
                    continue
                use(module, node.lineno)
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:  # ``import cwtrain.a.b`` binds ``cwtrain``; the dotted path resolves below
                    aliases.setdefault(alias.name.partition(".")[0], alias.name.partition(".")[0])
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_from(importer, node)
            if _owner(base) is None:
                continue
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in MODULES:
                    use(submodule, node.lineno)
                    aliases[alias.asname or alias.name] = submodule
                    continue
                module = _owner(base)
                assert module is not None
                use(module, node.lineno)
                if _private(alias.name) and module != importer:
                    reaches.append(Reach(importer, f"{module}.{alias.name}", node.lineno))
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and _private(node.attr)):
            continue
        dotted = _dotted(node.value)
        if dotted is None:
            continue
        head, _, rest = dotted.partition(".")
        if head in aliases:
            module = aliases[head] + ("." + rest if rest else "")
            if module in MODULES:
                if module != importer:
                    reaches.append(Reach(importer, f"{module}.{node.attr}", node.lineno))
                continue
        if (head in ("self", "cls") and not rest) or node.attr in own:
            continue
        others = sorted(DEFINERS.get(node.attr, set()) - {importer})
        if others:
            note = f" (defined in {', '.join(others)})"
            reaches.append(Reach(importer, f"{dotted}.{node.attr}", node.lineno, note))
    return edges, reaches


def _graph() -> tuple[dict[str, set[str]], list[Reach]]:
    graph: dict[str, set[str]] = {}
    reaches: list[Reach] = []
    for name in MODULES:
        graph[name], found = _scan(name, TREES[name])
        reaches.extend(found)
    return graph, reaches


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One shortest cycle per strongly connected component with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0

    for root in sorted(graph):
        if root in index:
            continue
        # iterative Tarjan: (node, iterator over its successors)
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            advanced = False
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = counter
                    counter += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    advanced = True
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))

    cycles = []
    for component in sorted(components):
        members = set(component)
        start = component[0]
        # shortest path start -> ... -> start inside the component
        previous: dict[str, str] = {}
        queue = deque([start])
        end = None
        while queue and end is None:
            node = queue.popleft()
            for succ in sorted(graph[node] & members):
                if succ == start:
                    end = node
                    break
                if succ not in previous:
                    previous[succ] = node
                    queue.append(succ)
        assert end is not None
        path = [end]
        while path[-1] != start:
            path.append(previous[path[-1]])
        cycles.append([*reversed(path), start])
    return cycles


GRAPH, REACHES = _graph()


def test_the_scan_sees_every_package_and_resolves_imports() -> None:
    tops = {name.split(".")[1] if name.count(".") else name for name in MODULES}
    assert {"hotload", "infra", "cli", "integrations", "local"} <= tops
    for plugin in ("gym", "miles", "nemo_rl", "slime", "rollout"):
        assert f"cwtrain.integrations.{plugin}" in MODULES
    # a few edges that must be there, whatever else changes
    assert "cwtrain.errors" in GRAPH["cwtrain.hotload.loader"]
    assert "cwtrain.local.stack" in GRAPH["cwtrain.local"]
    assert any(target.startswith("cwtrain.hotload") for target in GRAPH["cwtrain.integrations.slime.publisher"])


def test_the_checks_catch_what_they_are_for() -> None:
    """The cycle finder and the private scan, on a made-up graph and made-up sources."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    assert _private_module_reach("cwtrain.integrations.slime.hook", "cwtrain.integrations.rollout._runtime")
    assert not _private_module_reach("cwtrain.integrations.rollout.sampler", "cwtrain.integrations.rollout._runtime")
    assert not _private_module_reach("cwtrain.integrations.rollout", "cwtrain.integrations.rollout._runtime")
    assert _private("_bucket") and not _private("__version__") and not _private("bucket")
    # every form of reach, in a made-up module of the slime plug-in
    some_private = sorted(n for n, definers in DEFINERS.items() if "cwtrain.hotload.loader" not in definers)[0]
    source = f"""
from __future__ import annotations
from typing import TYPE_CHECKING
from cwtrain.hotload.loader import _check, HotLoader
from cwtrain.hotload import loader as hl
import cwtrain.hotload.publish.upload
from . import _private_sibling
if TYPE_CHECKING:
    from cwtrain.integrations.rollout._runtime import LoopThread

def later(obj):
    import cwtrain.integrations.rollout._runtime as runtime
    hl._bucket(obj)
    cwtrain.hotload.publish.upload._parts(obj)
    obj.{some_private}()
    self._mine = 1
    obj._mine()
"""
    edges, reaches = _scan("cwtrain.integrations.slime.made_up", ast.parse(source))
    assert {"cwtrain.hotload.loader", "cwtrain.hotload.publish.upload"} <= edges
    assert "cwtrain.integrations.rollout._runtime" in edges  # type-only imports count
    assert {r.target for r in reaches} == {
        "cwtrain.hotload.loader._check",
        "cwtrain.integrations.rollout._runtime",
        "cwtrain.hotload.loader._bucket",
        "cwtrain.hotload.publish.upload._parts",
        f"obj.{some_private}",
        "cwtrain.integrations.slime._private_sibling",
    }


def test_the_import_graph_has_no_cycle() -> None:
    cycles = _cycles(GRAPH)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_no_module_uses_another_modules_private_names() -> None:
    found = sorted((str(r) for r in REACHES), key=str)
    assert not found, "reaches into other modules' privates:\n" + "\n".join(found)
