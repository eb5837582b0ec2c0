"""The one framework check: a missing or unsupported framework names the exact install."""

from __future__ import annotations

import sys
import types

import pytest

from cwtrain.integrations import frameworks
from cwtrain.integrations.frameworks import (
    Framework,
    FrameworkVersionError,
    install_line,
    installed_version,
    missing_module_hint,
    registered,
    require,
)


def test_missing_framework_names_the_install_from_this_repository() -> None:
    absent = Framework("Nothing", "cwtrain_no_such_framework", "cwtrain-slime", "its image ships it")
    with pytest.raises(ImportError) as caught:
        require(absent, "cwtrain_no_such_framework.sub")
    message = str(caught.value)
    assert "cwtrain_no_such_framework.sub is not importable" in message
    assert "pip install ./packages/cwtrain-slime" in message and "its image ships it" in message


def test_a_broken_dependency_inside_the_framework_is_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("cwtrain_fw_broken")
    module.__path__ = []  # a package whose submodule needs something else that is missing
    monkeypatch.setitem(sys.modules, "cwtrain_fw_broken", module)
    framework = Framework("Broken", "cwtrain_fw_other", "cwtrain-slime", "x")
    with pytest.raises(ModuleNotFoundError) as caught:
        require(framework, "cwtrain_fw_broken.sub")
    assert "not importable" not in str(caught.value)


def test_version_outside_the_range_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("cwtrain_fw_versioned")
    module.__version__ = "0.8.1"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cwtrain_fw_versioned", module)
    framework = Framework("Versioned", "cwtrain_fw_versioned", "cwtrain-nemo-rl", "x", (), "0.7.0", "0.8")
    assert framework.supported == "0.7.x"
    assert installed_version(framework) == "0.8.1"
    with pytest.raises(FrameworkVersionError, match=r"Versioned 0\.8\.1 is installed, but .* supports 0\.7\.x"):
        require(framework)
    module.__version__ = "0.7.0rc2"  # type: ignore[attr-defined]
    assert require(framework) is module


def test_install_lines_and_ranges() -> None:
    assert install_line("cwtrain-gym") == "pip install ./packages/cwtrain-gym"
    assert install_line("cwtrain-core[torch]") == 'pip install "./packages/cwtrain-core[torch]"'
    assert Framework("a", "a", "p", "w", (), "0.7.0", "0.8").supported == "0.7.x"
    assert Framework("a", "a", "p", "w", (), "0.6.0").supported == ">= 0.6.0"
    assert Framework("a", "a", "p", "w").supported == "any version"
    assert Framework("a", "a", "p", "w", (), "1.2", "2.0").supported == ">= 1.2, < 2.0"


class _EntryPoint:
    def __init__(self, value: object) -> None:
        self.value = value

    def load(self) -> object:
        if isinstance(self.value, Exception):
            raise self.value
        return self.value


def test_core_names_no_framework_and_finds_the_plugins_records(monkeypatch: pytest.MonkeyPatch) -> None:
    """The records live in the plug-ins (the ``cwtrain.frameworks`` entry points); core keeps the mechanism."""
    assert not [name for name in dir(frameworks) if isinstance(getattr(frameworks, name), Framework)]
    record = Framework("Thing", "cwtrain_thing", "cwtrain-slime", "the thing image ships it", (), "1.0", "2.0")
    points = {"cwtrain_thing": [_EntryPoint(RuntimeError("broken plug-in")), _EntryPoint(record)],
              "cwtrain_other": [_EntryPoint("not a record")]}  # fmt: skip

    def entry_points(group: str, name: str) -> list[_EntryPoint]:
        assert group == frameworks.ENTRY_POINT_GROUP
        return points.get(name, [])

    monkeypatch.setattr(frameworks, "entry_points", entry_points)
    assert registered("cwtrain_thing") is record
    assert registered("cwtrain_other") is None and registered("cwtrain_none") is None
    assert missing_module_hint("cwtrain_thing.sub") == (
        "cwtrain's Thing plug-in runs inside Thing >= 1.0, < 2.0 (the thing image ships it); "
        "install the plug-in from a cwtrain checkout: pip install ./packages/cwtrain-slime"
    )
    assert missing_module_hint("cwtrain_other") is None
