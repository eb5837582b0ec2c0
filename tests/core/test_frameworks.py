"""The one framework check: a missing or unsupported framework names the exact install."""

from __future__ import annotations

import sys
import types

import pytest

from cwtrain.integrations.frameworks import (
    NEMO_RL,
    Framework,
    FrameworkVersionError,
    install_line,
    installed_version,
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
    assert NEMO_RL.supported == "0.7.x"
    assert Framework("a", "a", "p", "w", (), "0.6.0").supported == ">= 0.6.0"
    assert Framework("a", "a", "p", "w").supported == "any version"
    assert Framework("a", "a", "p", "w", (), "1.2", "2.0").supported == ">= 1.2, < 2.0"
