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

What counts as leaving through a package root (the rule for code of one distribution importing
another's; core, cwtrain-local and the four plug-ins alike; issue 23):

* The public surface of a distribution is its **roots**: ``cwtrain`` and ``cwtrain.integrations``
  themselves, and every non-underscored module directly inside them, a package's
  ``__init__`` (``cwtrain.hotload``, ``cwtrain.infra``, ``cwtrain.cli``, ``cwtrain.serving``,
  ``cwtrain.integrations.rollout``, ``cwtrain.local``, ``cwtrain.integrations.slime``) or a plain
  module (``cwtrain.errors``, ``cwtrain.config``, ``cwtrain.lazy``, ``cwtrain.jsondoc``,
  ``cwtrain.progress``, ``cwtrain.integrations.frameworks``, ``cwtrain.integrations.nvext``).
  Anything deeper (``cwtrain.hotload.format.index``, ``cwtrain.cli.options``, a wing's own
  ``__init__`` such as ``cwtrain.hotload.codec``) is the owning distribution's
  internals, free to move.
* A module imports another distribution's module ``M`` (``import M``, ``from M import n``, a
  lazy or type-only import alike) only when ``M`` is a root. ``from R import n`` where
  ``R.n`` is a submodule counts as importing ``R`` only when root ``R`` lists ``n`` in its
  ``__all__`` (``from cwtrain.infra import lifecycle``: the root chose to export the module).
  A dotted use such as ``cwtrain.hotload.loader.HotLoader`` after ``import cwtrain.hotload``
  is an import of ``cwtrain.hotload.loader``.
* Which distribution a module belongs to is read from its path (``packages/<dist>/src``).
  Within one distribution every module may import any other (the layer and privacy rules
  above still hold).

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
import cwtrain.hotload.store.snapshot_upload
from . import _private_sibling
if TYPE_CHECKING:
    from cwtrain.integrations.rollout._runtime import LoopThread

def later(obj):
    import cwtrain.integrations.rollout._runtime as runtime
    hl._bucket(obj)
    cwtrain.hotload.store.snapshot_upload._parts(obj)
    obj.{some_private}()
    self._mine = 1
    obj._mine()
"""
    edges, reaches = _scan("cwtrain.integrations.slime.made_up", ast.parse(source))
    assert {"cwtrain.hotload.loader", "cwtrain.hotload.store.snapshot_upload"} <= edges
    assert "cwtrain.integrations.rollout._runtime" in edges  # type-only imports count
    assert {r.target for r in reaches} == {
        "cwtrain.hotload.loader._check",
        "cwtrain.integrations.rollout._runtime",
        "cwtrain.hotload.loader._bucket",
        "cwtrain.hotload.store.snapshot_upload._parts",
        f"obj.{some_private}",
        "cwtrain.integrations.slime._private_sibling",
    }


def test_the_import_graph_has_no_cycle() -> None:
    cycles = _cycles(GRAPH)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_no_module_uses_another_modules_private_names() -> None:
    found = sorted((str(r) for r in REACHES), key=str)
    assert not found, "reaches into other modules' privates:\n" + "\n".join(found)


# ------------------------------------------------------------------ package roots


def distribution_of(name: str) -> str:
    """The distribution (``cwtrain-core``, ``cwtrain-local``, ...) whose sources hold module ``name``."""
    owner = _owner(name)
    assert owner is not None, name
    return MODULES[owner].relative_to(ROOT / "packages").parts[0]


NAMESPACES = ("cwtrain", "cwtrain.integrations")


def _is_root(name: str) -> bool:
    """Whether module ``name`` is a package root (see the module docstring)."""
    parent, _, last = name.rpartition(".")
    return name in NAMESPACES or (parent in NAMESPACES and not _private(last))


def _exported(tree: ast.Module) -> set[str]:
    """The string literals a module assigns or adds to ``__all__`` (at its top level)."""
    names: set[str] = set()
    for node in tree.body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AugAssign | ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            names |= {c.value for c in ast.walk(value) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    return names


EXPORTED = {name: _exported(TREES[name]) for name in MODULES if _is_package(name)}


def _named_imports(importer: str, tree: ast.Module) -> list[tuple[str, int]]:
    """Every cwtrain module ``importer`` imports by name, as the package-root rule counts them."""
    found: list[tuple[str, int]] = []
    bound: dict[str, str] = {}  # local name -> the cwtrain module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                module = _owner(alias.name)
                if module is None:
                    continue
                found.append((module, node.lineno))
                if alias.asname:
                    bound[alias.asname] = module
                else:
                    bound.setdefault(alias.name.partition(".")[0], alias.name.partition(".")[0])
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_from(importer, node)
            owner = _owner(base)
            if owner is None:
                continue
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in MODULES and not (base == owner and alias.name in EXPORTED.get(base, set())):
                    found.append((submodule, node.lineno))
                    bound[alias.asname or alias.name] = submodule
                else:
                    found.append((owner, node.lineno))
    for node in ast.walk(tree):  # cwtrain.hotload.loader.HotLoader after ``import cwtrain.hotload``
        if not isinstance(node, ast.Attribute):
            continue
        dotted = _dotted(node)
        head, _, rest = (dotted or "").partition(".")
        if head in bound and rest:
            module = _owner(f"{bound[head]}.{rest}")
            if module is not None and module != _owner(bound[head]):
                found.append((module, node.lineno))
    return found


def _root_violations(importer: str, tree: ast.Module) -> list[str]:
    own = distribution_of(importer)
    bad = []
    for module, line in _named_imports(importer, tree):
        if module in MODULES and distribution_of(module) != own and not _is_root(module):
            root = next(
                ".".join(module.split(".")[:depth])
                for depth in range(1, module.count(".") + 2)
                if _is_root(".".join(module.split(".")[:depth]))
                and not _is_root(".".join(module.split(".")[: depth + 1]))
            )
            bad.append(f"{importer}:{line} imports {module} ({distribution_of(module)}'s internals; use {root})")
    return sorted(set(bad))


def test_the_root_rule_itself() -> None:
    """The rule on made-up sources: what passes and what does not."""
    for root in ("cwtrain", "cwtrain.hotload", "cwtrain.errors", "cwtrain.integrations.frameworks",
                 "cwtrain.integrations.slime", "cwtrain.local", "cwtrain.cli"):  # fmt: skip
        assert _is_root(root), root
    for internal in ("cwtrain.hotload.format.index", "cwtrain.hotload.codec", "cwtrain.cli.options",
                     "cwtrain.integrations.rollout.sampler", "cwtrain._version", "cwtrain.local.engine"):  # fmt: skip
        assert not _is_root(internal), internal
    source = """
from typing import TYPE_CHECKING
import cwtrain.hotload
from cwtrain.hotload import HotLoader, TensorData
from cwtrain.infra import lifecycle
from cwtrain.errors import SnapshotError
from cwtrain.integrations.slime import hook
if TYPE_CHECKING:
    from cwtrain.hotload.format.index import SnapshotFile

def later():
    from cwtrain.cli.output import emit
    import cwtrain.hotload.codec.decode as decode
    from cwtrain.hotload import codec
    from cwtrain.local.engine import model
    return cwtrain.hotload.loader.HotLoader, cwtrain.hotload.HotLoader
"""
    found = _root_violations("cwtrain.integrations.gym.made_up", ast.parse(source))
    assert {line.split(" imports ")[1].split(" ")[0] for line in found} == {
        "cwtrain.hotload.format.index",
        "cwtrain.cli.output",
        "cwtrain.hotload.codec.decode",
        "cwtrain.hotload.codec",
        "cwtrain.hotload.loader",
        "cwtrain.local.engine.model",
    }, found
    assert any(line.endswith(":9 imports cwtrain.hotload.format.index (cwtrain-core's internals; use cwtrain.hotload)")
               for line in found), found  # fmt: skip
    # inside one distribution the rule does not apply
    assert (
        _root_violations("cwtrain.hotload.loader", ast.parse(source.replace("cwtrain.local.engine", "cwtrain.x"))) == []
    )


def test_every_package_imports_other_distributions_only_from_their_roots() -> None:
    assert {distribution_of(name) for name in MODULES} == {
        "cwtrain-core", "cwtrain-local", "cwtrain-slime", "cwtrain-miles", "cwtrain-nemo-rl", "cwtrain-gym",
    }  # fmt: skip
    bad = [line for name in sorted(MODULES) for line in _root_violations(name, TREES[name])]
    assert not bad, "imports of another distribution's internals (import from its package root):\n" + "\n".join(bad)


def _type_checking_imports(tree: ast.Module) -> set[tuple[str, str]]:
    pairs: set[tuple[str, str]] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for inner in node.body:
                assert isinstance(inner, ast.ImportFrom) and inner.module, ast.dump(inner)
                pairs |= {(inner.module, alias.name) for alias in inner.names}
    return pairs


def test_the_hotload_roots_three_lists_agree() -> None:
    """``cwtrain.hotload``: its ``TYPE_CHECKING`` imports, ``_MODULES`` and ``__all__`` name the same things.

    Type checkers read the first, the lazy lookup the second, ``import *`` and the docs the
    third; a name in one and not another is a name mypy, the runtime or a reader does not see.
    Every name must also be defined (or imported) at the top of the module it is mapped to.
    """
    tree = TREES["cwtrain.hotload"]
    typed = _type_checking_imports(tree)
    table = next(
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_MODULES" for t in node.targets)
    )
    assert isinstance(table, ast.Dict)
    lazy: set[tuple[str, str]] = set()
    for key, value in zip(table.keys, table.values, strict=True):
        assert isinstance(key, ast.Constant) and isinstance(value, ast.Tuple)
        names = [element.value for element in value.elts if isinstance(element, ast.Constant)]
        assert len(names) == len(set(names)) == len(value.elts), key.value
        lazy |= {(key.value, name) for name in names}
    listed = [
        element.value
        for node in tree.body
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
        for element in node.value.elts  # type: ignore[attr-defined]
    ]
    assert len(listed) == len(set(listed)), "a name listed twice in __all__"
    assert typed - lazy == set(), f"under TYPE_CHECKING but not in _MODULES: {sorted(typed - lazy)}"
    assert lazy - typed == set(), f"in _MODULES but not under TYPE_CHECKING: {sorted(lazy - typed)}"
    names = [name for _, name in lazy]
    assert len(names) == len(set(names)), "a name mapped to two modules"
    assert set(names) == set(listed), (
        f"in _MODULES, not in __all__: {sorted(set(names) - set(listed))}; "
        f"in __all__, not in _MODULES: {sorted(set(listed) - set(names))}"
    )
    for module, name in sorted(lazy):
        assert module in MODULES and name in _top_level_names(TREES[module]), f"{module} defines no {name}"


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(alias.asname or alias.name).partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.If | ast.Try):
            names |= _top_level_names(ast.Module(body=[*node.body, *getattr(node, "orelse", [])], type_ignores=[]))
    return names


def test_shard_sink_is_cores_own_seam() -> None:
    """``ShardSink`` is private to core: no root exports it and no other distribution names it."""
    assert "ShardSink" not in EXPORTED["cwtrain.hotload"]

    def names(tree: ast.Module) -> set[str]:
        found = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        found |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        return found | {n.name.rpartition(".")[2] for n in ast.walk(tree) if isinstance(n, ast.alias)}

    users = sorted(
        name for name, tree in TREES.items() if distribution_of(name) != "cwtrain-core" and "ShardSink" in names(tree)
    )
    assert users == []


# ------------------------------------------------------------------ layers (docs/internals.md)

#: Core's layers, bottom up (docs/internals.md, "Layers"): a module imports its own layer and the ones
#: below it, never one above. Each entry is a module or a package (with everything under it).
CORE_LAYERS: tuple[tuple[str, ...], ...] = (
    ("cwtrain.errors", "cwtrain._version"),
    ("cwtrain.config", "cwtrain.closing", "cwtrain.lazy", "cwtrain.polling", "cwtrain.progress", "cwtrain.jsondoc"),
    ("cwtrain.infra",),
    ("cwtrain.serving",),
    ("cwtrain.hotload",),
    ("cwtrain.integrations", "cwtrain.rollout"),
    ("cwtrain.cli",),
)

#: The wings of ``cwtrain.hotload``, bottom up: the bytes, the codec, files on disk, object storage, the
#: waits, the lifecycle (the one composer, the run, the share protocol), the facade on top. ``errors``
#: re-exports cwtrain.errors; ``delta`` and ``mirror`` re-export the files wing's old paths.
HOTLOAD_WINGS: tuple[tuple[str, ...], ...] = (
    ("format", "errors"),
    ("codec",),
    ("files", "delta", "mirror"),
    ("store",),
    ("follow",),
    ("lifecycle",),
    ("loader",),
)

#: Object storage by level (``cwtrain.hotload.store``): one object, one snapshot's objects, the prefix.
STORE_LEVELS: tuple[tuple[str, ...], ...] = (
    ("object_buffers", "object_source", "object_writer"),
    ("snapshot_upload", "snapshot_verify", "snapshot_checks"),
    ("prefix", "prefix_access", "prefix_manifests"),
)

#: The lifecycle's modules, bottom up: the cadence; settings and the served-identity file; the deployment's
#: calls, one version's plan and outcome, what crosses between ranks; the sources and one rank's side; the
#: composer; the run; the protocol and the run one step ahead.
LIFECYCLE_ORDER: tuple[tuple[str, ...], ...] = (
    ("cadence",),
    ("settings", "served"),
    ("target", "version", "shares"),
    ("sources", "rank"),
    ("cycle",),
    ("session",),
    ("protocol", "ahead"),
)


def _level(module: str, layers: tuple[tuple[str, ...], ...], prefix: str = "") -> int | None:
    """The index of the layer that holds ``module`` (``prefix`` + an entry, or a module under it)."""
    for index, entries in enumerate(layers):
        for entry in entries:
            name = prefix + entry
            if module == name or module.startswith(name + "."):
                return index
    return None


def _layer_breaks(graph: dict[str, set[str]]) -> list[str]:
    """Every import that runs up a layer: core's layers, hotload's wings, the store's levels, the lifecycle's order.

    Core's own modules only (the plug-ins and cwtrain-local sit above core and are held to its
    package roots). A package's ``__init__`` that only re-exports (``cwtrain.hotload``) is the top of its
    layer, so it is left out as an importer.
    """
    rules = (
        (CORE_LAYERS, ""),
        (HOTLOAD_WINGS, "cwtrain.hotload."),
        (STORE_LEVELS, "cwtrain.hotload.store."),
        (LIFECYCLE_ORDER, "cwtrain.hotload.lifecycle."),
    )
    roots = {"cwtrain", "cwtrain.hotload", "cwtrain.hotload.store", "cwtrain.hotload.lifecycle"}
    found = []
    for importer, targets in sorted(graph.items()):
        if importer in roots or distribution_of(importer) != "cwtrain-core":
            continue
        for target in sorted(targets):
            if target in roots or target not in MODULES or distribution_of(target) != "cwtrain-core":
                continue
            for layers, prefix in rules:
                mine, theirs = _level(importer, layers, prefix), _level(target, layers, prefix)
                if mine is not None and theirs is not None and theirs > mine:
                    found.append(f"{importer} imports {target}, a layer above it")
    return found


def test_every_core_module_imports_down_its_layers() -> None:
    """No import runs up: hotload never reaches integrations, storage never the lifecycle, the composer never the facade."""
    breaks = _layer_breaks(GRAPH)
    assert not breaks, "imports that run up a layer (docs/internals.md):\n" + "\n".join(breaks)
    every = {name for name in MODULES if distribution_of(name) == "cwtrain-core"}
    placed = {name for name in every if _level(name, CORE_LAYERS) is not None}
    assert placed | {"cwtrain"} == every, f"core modules in no layer: {sorted(every - placed - {'cwtrain'})}"
    for layers, prefix in ((HOTLOAD_WINGS, "cwtrain.hotload."), (STORE_LEVELS, "cwtrain.hotload.store."),
                           (LIFECYCLE_ORDER, "cwtrain.hotload.lifecycle.")):  # fmt: skip
        inside = {name for name in every if name.startswith(prefix)}
        assert {name for name in inside if _level(name, layers, prefix) is None} == set(), prefix


def test_the_layer_check_catches_what_it_is_for() -> None:
    """The three breaks issue 30 names, on made-up edges beside the real graph."""
    made_up = {
        # the composer: into integrations (the served-identity file's old home), and up to the facade
        "cwtrain.hotload.lifecycle.cycle": {"cwtrain.integrations.nvext", "cwtrain.hotload.loader"},
        "cwtrain.hotload.store.prefix": {"cwtrain.hotload.lifecycle.session"},  # storage → the lifecycle
        "cwtrain.hotload.store.snapshot_upload": {"cwtrain.hotload.store.prefix"},  # one snapshot → the prefix
        "cwtrain.hotload.lifecycle.sources": {"cwtrain.hotload.lifecycle.cycle", "cwtrain.hotload.format.index"},
    }
    assert _layer_breaks(made_up) == [
        "cwtrain.hotload.lifecycle.cycle imports cwtrain.hotload.loader, a layer above it",
        "cwtrain.hotload.lifecycle.cycle imports cwtrain.integrations.nvext, a layer above it",
        "cwtrain.hotload.lifecycle.sources imports cwtrain.hotload.lifecycle.cycle, a layer above it",
        "cwtrain.hotload.store.prefix imports cwtrain.hotload.lifecycle.session, a layer above it",
        "cwtrain.hotload.store.snapshot_upload imports cwtrain.hotload.store.prefix, a layer above it",
    ]
