"""The one check that says what to install when a plug-in's framework is missing.

Plug-in packages never hard-require their framework (it lives in the framework's own
image); they import it on first use through :func:`require`, which raises one
``ImportError`` with the exact fix when the framework is missing or outside the range
the plug-in was checked against::

    from cwtrain.integrations.frameworks import require
    from cwtrain.integrations.nemo_rl.framework import NEMO_RL   # the plug-in's own record

    grpo = require(NEMO_RL, "nemo_rl.algorithms.grpo")      # the module, or ImportError

    ImportError: nemo_rl.algorithms.grpo is not importable: cwtrain's NeMo-RL plug-in runs inside
    NeMo-RL 0.7.x (the NeMo-RL v0.7.0 image ships it); install the plug-in from a cwtrain checkout:
    pip install ./packages/cwtrain-nemo-rl

Core holds the mechanism only: each plug-in owns the :class:`Framework` record of the
versions it supports (``cwtrain.integrations.<plug-in>.framework``) and declares it in the
``cwtrain.frameworks`` entry-point group under the framework's top-level module name
(``nemo_rl = "cwtrain.integrations.nemo_rl.framework:NEMO_RL"``), which is how
:func:`registered` finds it without core naming any framework.

:func:`install_line` is the same install line for messages of other kinds, and
:func:`missing_module_hint` the fix for a ``ModuleNotFoundError`` of an optional
dependency (``torch`` → ``pip install "./packages/cwtrain-core[torch]"``; a framework
module → its plug-in's record; the CLI prints it). Install lines name this repository's
paths: a different project named ``cwtrain`` exists on public package indexes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import import_module
from importlib.metadata import PackageNotFoundError, entry_points, version
from types import ModuleType

__all__ = [
    "ENTRY_POINT_GROUP",
    "Framework",
    "FrameworkVersionError",
    "install_line",
    "installed_version",
    "missing_module_hint",
    "registered",
    "require",
]

#: The entry-point group where plug-ins declare their :class:`Framework` records, by module name.
ENTRY_POINT_GROUP = "cwtrain.frameworks"


@dataclass(frozen=True)
class Framework:
    """A framework a plug-in runs inside.

    Attributes:
        name: how users call it (``"NeMo-RL"``).
        module: its top-level import name (``"nemo_rl"``).
        plugin: the cwtrain package that plugs into it (``"cwtrain-nemo-rl"``).
        where: where it usually comes from (``"the NeMo-RL v0.7.0 image ships it"``).
        distributions: distribution names to read its version from, first found wins.
        minimum: the lowest version the plug-in supports (``None``: any).
        below: the first version it does not support (``None``: no upper bound).
    """

    name: str
    module: str
    plugin: str
    where: str
    distributions: tuple[str, ...] = ()
    minimum: str | None = None
    below: str | None = None

    @property
    def supported(self) -> str:
        """The supported range in words (``"0.7.x"``, ``">= 0.6.0"``, ``"any version"``)."""
        if self.minimum and self.below:
            low, high = _key(self.minimum), _key(self.below)
            if len(low) >= 2 and high[:2] == (low[0], low[1] + 1) and not any(high[2:]):
                return f"{low[0]}.{low[1]}.x"
            return f">= {self.minimum}, < {self.below}"
        if self.minimum:
            return f">= {self.minimum}"
        if self.below:
            return f"< {self.below}"
        return "any version"


class FrameworkVersionError(ImportError):
    """The framework is installed, but outside the range the plug-in supports."""


def registered(module: str) -> Framework | None:
    """The installed plug-ins' record of the framework whose top-level module is ``module``, if any.

    Read from the ``cwtrain.frameworks`` entry-point group; a plug-in that fails to load, or
    names something that is not a :class:`Framework`, counts as no record (this runs while
    another error is being explained).
    """
    for entry_point in entry_points(group=ENTRY_POINT_GROUP, name=module):
        try:
            record = entry_point.load()
        except Exception:
            continue
        if isinstance(record, Framework) and record.module == module:
            return record
    return None


def install_line(plugin: str) -> str:
    """``pip install ./packages/<plugin>`` (with extras: ``pip install "./packages/cwtrain-core[torch]"``)."""
    path = f"./packages/{plugin}"
    return f'pip install "{path}"' if "[" in plugin else f"pip install {path}"


#: Optional modules cwtrain's own packages bring, by top-level import name: what needs
#: them and the package (with its extra) that installs them.
_OPTIONAL_MODULES: dict[str, tuple[str, str]] = {
    "torch": ("the torch publishing path, the local stack and its demo", "cwtrain-core[torch]"),
    "moto": ("the local stack's object store", "cwtrain-local"),
    "jinja2": ("the local stack's object store", "cwtrain-local"),
    "yaml": ("cwtrain's NeMo Gym plug-in", "cwtrain-gym"),
}
#: cwtrain's own optional packages, by import name.
_OWN_PACKAGES: dict[str, str] = {
    "cwtrain.local": "cwtrain-local",
    "cwtrain.integrations.slime": "cwtrain-slime",
    "cwtrain.integrations.miles": "cwtrain-miles",
    "cwtrain.integrations.nemo_rl": "cwtrain-nemo-rl",
    "cwtrain.integrations.gym": "cwtrain-gym",
}


def missing_module_hint(name: str | None) -> str | None:
    """What to install when the module ``name`` is missing, or ``None`` when it is no optional dependency.

    ``name`` is a ``ModuleNotFoundError``'s ``name`` (``"torch"``, ``"torch.cuda"``,
    ``"cwtrain.local"``): cwtrain's own optional packages and the dependencies their extras
    bring name the install line from a checkout; the frameworks the plug-ins run inside
    name the plug-in and where the framework comes from.
    """
    if not name:
        return None
    for package, plugin in _OWN_PACKAGES.items():
        if name == package or name.startswith(package + "."):
            return f"{package} is part of {plugin}; install it from a cwtrain checkout: {install_line(plugin)}"
    top = name.split(".", 1)[0]
    if top in _OPTIONAL_MODULES:
        what, plugin = _OPTIONAL_MODULES[top]
        return f"{top} is needed by {what}; install it from a cwtrain checkout: {install_line(plugin)}"
    framework = registered(top)
    return _hint(framework) if framework is not None else None


def _hint(framework: Framework) -> str:
    return (
        f"cwtrain's {framework.name} plug-in runs inside {framework.name} {framework.supported} ({framework.where}); "
        f"install the plug-in from a cwtrain checkout: {install_line(framework.plugin)}"
    )


def _key(text: str) -> tuple[int, ...]:
    """The leading numeric release of a version string (``"0.7.0rc1+abc"`` → ``(0, 7, 0)``)."""
    match = re.match(r"\d+(?:\.\d+)*", text.strip().lstrip("v"))
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def installed_version(framework: Framework) -> str | None:
    """The installed version of ``framework`` (distribution metadata, else ``module.__version__``)."""
    for dist in framework.distributions:
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    try:
        module = import_module(framework.module)
    except ImportError:
        return None
    found = getattr(module, "__version__", None)
    return str(found) if found else None


def _check_version(framework: Framework) -> None:
    if framework.minimum is None and framework.below is None:
        return
    found = installed_version(framework)
    if found is None or not _key(found):
        return  # a source checkout without metadata: nothing to compare
    too_low = framework.minimum is not None and _key(found) < _key(framework.minimum)
    too_high = framework.below is not None and _key(found) >= _key(framework.below)
    if too_low or too_high:
        raise FrameworkVersionError(
            f"{framework.name} {found} is installed, but cwtrain's plug-in supports {framework.supported}: {_hint(framework)}"
        )


def require(framework: Framework, module: str | None = None) -> ModuleType:
    """Import ``module`` (default: the framework's top-level module) of ``framework``.

    Raises:
        ImportError: the framework is missing, naming what to install.
        FrameworkVersionError: the framework is installed outside the supported range.
    """
    name = module or framework.module
    try:
        imported = import_module(name)
    except ModuleNotFoundError as exc:
        top = framework.module
        if exc.name and (exc.name == top or exc.name.startswith(top + ".")):
            raise ImportError(f"{name} is not importable: {_hint(framework)}") from exc
        raise
    _check_version(framework)
    return imported
