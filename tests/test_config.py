"""Strict parsing of environment variables."""

from __future__ import annotations

import pytest

from cwtrain.config import VARIABLES, env_bool, env_float, env_int, env_str
from cwtrain.errors import ConfigError


@pytest.mark.parametrize(
    ("raw", "value"),
    [("1", True), ("TRUE", True), ("yes", True), ("On", True), ("0", False), ("off", False), ("No", False)],
)
def test_booleans(raw: str, value: bool) -> None:
    assert env_bool("CWTRAIN_HOTLOAD_WAIT", not value, {"CWTRAIN_HOTLOAD_WAIT": raw}) is value


def test_blank_is_unset_and_garbage_names_the_variable() -> None:
    assert env_bool("CWTRAIN_HOTLOAD_WAIT", True, {"CWTRAIN_HOTLOAD_WAIT": "  "}) is True
    assert env_str("CWTRAIN_HOTLOAD_RUN_ID", {"CWTRAIN_HOTLOAD_RUN_ID": " "}) is None
    with pytest.raises(ConfigError, match="CWTRAIN_HOTLOAD_WAIT='maybe'"):
        env_bool("CWTRAIN_HOTLOAD_WAIT", True, {"CWTRAIN_HOTLOAD_WAIT": "maybe"})


def test_integers_are_strict_and_range_checked() -> None:
    env = {"CWTRAIN_HOTLOAD_FULL_EVERY": "abc"}
    with pytest.raises(ConfigError, match="CWTRAIN_HOTLOAD_FULL_EVERY='abc' is not an integer"):
        env_int("CWTRAIN_HOTLOAD_FULL_EVERY", 20, env, minimum=0, maximum=64)
    with pytest.raises(ConfigError, match="out of range"):
        env_int("CWTRAIN_HOTLOAD_FULL_EVERY", 20, {"CWTRAIN_HOTLOAD_FULL_EVERY": "65"}, minimum=0, maximum=64)
    with pytest.raises(ConfigError):
        env_int("CWTRAIN_HOTLOAD_FULL_EVERY", 20, {"CWTRAIN_HOTLOAD_FULL_EVERY": "2.0"})
    assert env_int("CWTRAIN_HOTLOAD_FULL_EVERY", 20, {"CWTRAIN_HOTLOAD_FULL_EVERY": "64"}, minimum=0, maximum=64) == 64
    assert env_int("CWTRAIN_HOTLOAD_FULL_EVERY", 20, {}) == 20


@pytest.mark.parametrize("raw", ["-5", "0", "nan", "inf", "ten"])
def test_timeouts_must_be_finite_and_positive(raw: str) -> None:
    with pytest.raises(ConfigError, match="CWTRAIN_HOTLOAD_TIMEOUT"):
        env_float("CWTRAIN_HOTLOAD_TIMEOUT", 1800.0, {"CWTRAIN_HOTLOAD_TIMEOUT": raw})


def test_undeclared_variables_are_refused() -> None:
    with pytest.raises(KeyError):
        env_str("CWTRAIN_NOT_A_VARIABLE", {})


def test_secret_variables_are_marked() -> None:
    secrets = {name for name, var in VARIABLES.items() if var.secret}
    assert {"COREWEAVE_API_TOKEN", "CW_API_TOKEN", "CWTRAIN_ROLLOUT_API_KEY"} <= secrets


def test_configuration_docs_list_every_variable() -> None:
    import runpy
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    render = runpy.run_path(str(root / "scripts" / "gen_config_docs.py"))["render"]
    assert (root / "docs" / "configuration.md").read_text() == render(), "run scripts/gen_config_docs.py"
