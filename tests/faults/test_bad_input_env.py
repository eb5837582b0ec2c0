"""Bad environment variable values, fuzzed with hypothesis, through the real readers.

``RolloutConfig.from_env``, the slime ``HookConfig.from_env``, ``cwtrain.config`` and the
readers built on it, ``SnapshotUpload`` and the CLI: every value either gives exactly what
the variable's rule says (an oracle written from docs/configuration.md) or a
``ConfigError`` naming the variable; ``CWTRAIN_API_HEADERS`` (a secret) is never echoed; the
CLI exits 1 with one ``error:`` line before sending anything.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import pytest
from _recording import FUZZ, FUZZ_CLI, JSON_VALUES, TOKEN, RecordingServer, is_json_object, one_error_line, run_cli
from hypothesis import example, given
from hypothesis import strategies as st

from cwtrain.config import env_bool, env_float, env_int
from cwtrain.errors import ConfigError
from cwtrain.infra import InferenceClient
from cwtrain.integrations.rollout import RolloutConfig

pytestmark = [pytest.mark.faults, pytest.mark.fault_row("bad-input")]

DEPLOYMENT = "dep-fuzz"


@pytest.fixture(scope="module")
def api() -> Iterator[RecordingServer]:
    with RecordingServer() as server:
        yield server


# ----------------------------------------------------- environment variable values

_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}
ENV_TEXT = st.one_of(
    st.sampled_from(["abc", "-1", "0", "65", "nan", "NaN", "inf", "-inf", "1e309", "1.5", "0x10", " 7 ", "", "maybe"]),
    st.sampled_from(["TRUE", "Off", "yes please", "2", "-0", "1e-9", "١٢", "1_0", "+3", "\t", "∞"]),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=10),
)


def _expect_int(value: str, default: int, lo: int, hi: int | None) -> int | None:
    """What a strict integer variable must give for ``value`` (``None``: refused)."""
    text = value.strip()
    if not text:
        return default
    try:
        number = int(text, 10)
    except ValueError:
        return None
    return number if number >= lo and (hi is None or number <= hi) else None


def _expect_float(value: str, default: float) -> float | None:
    text = value.strip()
    if not text:
        return default
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) and number > 0 else None


def _expect_bool(value: str, default: bool) -> bool | None:
    text = value.strip().lower()
    return default if not text else True if text in _TRUE else False if text in _FALSE else None


def _expect_full_every(value: str) -> int | str | None:
    """``auto`` (any case, the default when blank) or a strict integer in 0..64 (issue 25)."""
    return "auto" if value.strip().lower() in ("", "auto") else _expect_int(value, 20, 0, 64)


def _expect_share(value: str) -> float | None:
    number = _expect_float(value, 0.9)
    return number if number is not None and number <= 1 else None


def _expect_run_id(value: str) -> str | None:
    """The one run-id rule: 1-120 characters, one path segment, nothing that hides or reorders text."""
    import unicodedata

    text = value.strip() or "fallback"
    hidden = any(unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Zl", "Zp") for c in text)
    return text if len(text) <= 120 and "/" not in text and text not in (".", "..") and not hidden else None


# variable -> (reader, attribute, oracle)
ROLLOUT_VARS: dict[str, tuple[str, Any]] = {
    "CWTRAIN_ROLLOUT_CONCURRENCY": ("concurrency", lambda v: _expect_int(v, 16, 1, None)),
    "CWTRAIN_ROLLOUT_MAX_ATTEMPTS": ("max_attempts", lambda v: _expect_int(v, 6, 1, None)),
    "CWTRAIN_ROLLOUT_TIMEOUT": ("timeout", lambda v: _expect_float(v, 600.0)),
    "CWTRAIN_ROLLOUT_LOGPROBS": ("logprobs", lambda v: _expect_bool(v, True)),
    "CWTRAIN_ROLLOUT_TOKEN_IDS": ("token_ids", lambda v: _expect_bool(v, True)),
    "CWTRAIN_ROLLOUT_ROUTED_EXPERTS": ("routed_experts", lambda v: _expect_bool(v, False)),
    "CWTRAIN_ROLLOUT_SEEDS": ("seeds", lambda v: _expect_bool(v, True)),
}
HOOK_VARS: dict[str, tuple[str, Any]] = {
    "CWTRAIN_HOTLOAD_FULL_EVERY": ("full_every", _expect_full_every),
    "CWTRAIN_HOTLOAD_FULL_SHARE": ("full_share", _expect_share),
    "CWTRAIN_HOTLOAD_REPLAY_BUDGET": ("replay_budget", lambda v: _expect_float(v, 2.0)),
    "CWTRAIN_HOTLOAD_TIMEOUT": ("timeout", lambda v: _expect_float(v, 1800.0)),
    "CWTRAIN_HOTLOAD_UPLOAD_WORKERS": ("upload_workers", lambda v: _expect_int(v, 8, 1, None)),
    "CWTRAIN_HOTLOAD_WAIT": ("wait", lambda v: _expect_bool(v, True)),
    "CWTRAIN_HOTLOAD_VERIFY": ("verify", lambda v: _expect_bool(v, False)),
    "CWTRAIN_HOTLOAD_PUBLISH_BASELINE": ("publish_baseline", lambda v: _expect_bool(v, True)),
    "CWTRAIN_API_INSECURE": ("api_insecure", lambda v: _expect_bool(v, False)),
    "CWTRAIN_HOTLOAD_RUN_ID": ("run_id", _expect_run_id),
}
CORE_READERS: dict[str, tuple[Any, Any]] = {
    "CWTRAIN_HOTLOAD_FULL_EVERY": (
        lambda env: (
            __import__("cwtrain.hotload.lifecycle.settings", fromlist=["x"])
            .HotLoadSettings.from_env(env, default_run_id="r", require_deployment=False)
            .full_every
        ),
        _expect_full_every,
    ),
    "CWTRAIN_HOTLOAD_MEMORY_BUDGET": (
        lambda env: __import__("cwtrain.hotload.codec.common", fromlist=["x"]).memory_budget_from_env(env),
        lambda v: _expect_int(v, 1 << 30, 1 << 20, None),
    ),
    "CWTRAIN_HOTLOAD_TIMEOUT": (
        lambda env: env_float("CWTRAIN_HOTLOAD_TIMEOUT", 5.0, env),
        lambda v: _expect_float(v, 5.0),
    ),
    "CWTRAIN_ROLLOUT_SEEDS": (
        lambda env: env_bool("CWTRAIN_ROLLOUT_SEEDS", True, env),
        lambda v: _expect_bool(v, True),
    ),
    "CWTRAIN_HOTLOAD_UPLOAD_WORKERS": (
        lambda env: env_int("CWTRAIN_HOTLOAD_UPLOAD_WORKERS", 8, env, minimum=1),
        lambda v: _expect_int(v, 8, 1, None),
    ),
}


def _upload_setting(variable: str, attribute: str) -> Any:
    """A reader that builds a ``SnapshotUpload`` (which reads the variable from ``os.environ``)."""

    def read(env: dict[str, str]) -> Any:
        from cwtrain.hotload.store.snapshot_upload import SnapshotUpload

        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(variable, env[variable])
            return getattr(SnapshotUpload(object(), bucket="b", identity="fuzz-v000001"), attribute)

    return read


CORE_READERS["CWTRAIN_HOTLOAD_PART_SIZE"] = (
    _upload_setting("CWTRAIN_HOTLOAD_PART_SIZE", "part_size"),
    lambda v: _expect_int(v, 64 << 20, 50_000_000, 5 << 30),
)
CORE_READERS[
    "CWTRAIN_HOTLOAD_MEMORY_BUDGET (upload)"
] = (  # one budget rule: the encoder's, the decoders', the upload's
    lambda env: (
        _upload_setting("CWTRAIN_HOTLOAD_MEMORY_BUDGET", "_budget")(
            {"CWTRAIN_HOTLOAD_MEMORY_BUDGET": env["CWTRAIN_HOTLOAD_MEMORY_BUDGET (upload)"]}
        ).limit
    ),
    lambda v: _expect_int(v, 1 << 30, 1 << 20, None),
)
ROLLOUT_BASE = {"CWTRAIN_ROLLOUT_BASE_URL": "http://127.0.0.1:9/v1", "CWTRAIN_ROLLOUT_MODEL": "tiny"}
HOOK_BASE = {"CWTRAIN_HOTLOAD_DEPLOYMENT_ID": DEPLOYMENT, "CWTRAIN_HOTLOAD_RUN_ID": "fuzz"}


def _check_reader(read: Any, variable: str, value: str, expected: Any, attribute: str | None = None) -> None:
    try:
        result = read()
    except ConfigError as exc:
        assert expected is None, f"{variable}={value!r} should give {expected!r}, got {exc}"
        assert variable in str(exc), exc
        return
    got = getattr(result, attribute) if attribute else result
    assert expected is not None and got == expected, f"{variable}={value!r} accepted as {got!r}"


@FUZZ
@given(variable=st.sampled_from(sorted(ROLLOUT_VARS)), value=ENV_TEXT)
@example(variable="CWTRAIN_ROLLOUT_TIMEOUT", value="-1")
@example(variable="CWTRAIN_ROLLOUT_TIMEOUT", value="nan")
@example(variable="CWTRAIN_ROLLOUT_CONCURRENCY", value="0")
def test_rollout_variables(variable: str, value: str) -> None:
    attribute, oracle = ROLLOUT_VARS[variable]
    env = {**ROLLOUT_BASE, variable: value}
    _check_reader(lambda: RolloutConfig.from_env(env), variable, value, oracle(value), attribute)


@FUZZ
@given(variable=st.sampled_from(sorted(HOOK_VARS)), value=ENV_TEXT)
@example(variable="CWTRAIN_HOTLOAD_FULL_EVERY", value="abc")
@example(variable="CWTRAIN_HOTLOAD_FULL_EVERY", value=" AUTO ")
@example(variable="CWTRAIN_HOTLOAD_FULL_SHARE", value="1.5")
@example(variable="CWTRAIN_HOTLOAD_TIMEOUT", value="-5")
@example(variable="CWTRAIN_HOTLOAD_TIMEOUT", value="inf")
@example(variable="CWTRAIN_HOTLOAD_WAIT", value="maybe")
def test_slime_hook_variables(variable: str, value: str) -> None:
    from cwtrain.integrations.slime import HookConfig

    attribute, oracle = HOOK_VARS[variable]
    env = {**HOOK_BASE, variable: value}
    _check_reader(
        lambda: HookConfig.from_env(env, default_run_id="fallback"), variable, value, oracle(value), attribute
    )


@FUZZ
@given(variable=st.sampled_from(sorted(CORE_READERS)), value=ENV_TEXT)
@example(variable="CWTRAIN_HOTLOAD_FULL_EVERY", value="abc")
@example(variable="CWTRAIN_HOTLOAD_FULL_EVERY", value=" AUTO ")
@example(variable="CWTRAIN_HOTLOAD_MEMORY_BUDGET", value="-1")
@example(variable="CWTRAIN_HOTLOAD_PART_SIZE", value="1024")
@example(variable="CWTRAIN_HOTLOAD_PART_SIZE", value="52428800")
def test_core_config_readers(variable: str, value: str) -> None:
    read, oracle = CORE_READERS[variable]
    name = variable.split()[0]
    _check_reader(lambda: read({variable: value}), name, value, oracle(value))


HEADER_SECRET = "SeCrEt-h3ader-value"


def _is_header_object(text: str) -> bool:
    """Whether ``text`` is a valid CWTRAIN_API_HEADERS value (a JSON object of strings)."""
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())


BAD_HEADERS = st.one_of(
    st.sampled_from(
        [
            f'{{"Authorization": "Bearer {HEADER_SECRET}"',
            f'["{HEADER_SECRET}"]',
            HEADER_SECRET,
            f'"{HEADER_SECRET}"',
            f"{{'X-Key': '{HEADER_SECRET}'}}",
        ]
    ),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=8)
    .map(lambda junk: f'{{"X-Key": "{HEADER_SECRET}"{junk}')
    .filter(lambda text: not _is_header_object(text)),  # junk such as "}" can close a valid object
    JSON_VALUES.filter(lambda v: not isinstance(v, dict) and v is not None).map(
        lambda v: json.dumps([v, HEADER_SECRET])
    ),
)


@FUZZ
@given(value=BAD_HEADERS)
def test_bad_api_headers_are_refused_without_echoing_them(value: str) -> None:
    from cwtrain.integrations.slime import HookConfig

    for build in (
        lambda: InferenceClient(TOKEN, base_url="http://127.0.0.1:9", headers=None),
        lambda: HookConfig.from_env({**HOOK_BASE, "CWTRAIN_API_HEADERS": value}),
    ):
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("CWTRAIN_API_HEADERS", value)
            with pytest.raises(ConfigError) as caught:
                build()
        assert "CWTRAIN_API_HEADERS" in str(caught.value)
        assert HEADER_SECRET not in str(caught.value)


@FUZZ_CLI
@given(
    variable=st.sampled_from(["CWTRAIN_API_HEADERS", "CWTRAIN_API_INSECURE"]),
    value=BAD_HEADERS | ENV_TEXT.filter(lambda v: v.strip() != "" and _expect_bool(v, False) is None),
)
@example(variable="CWTRAIN_API_HEADERS", value="{not json")
@example(variable="CWTRAIN_API_INSECURE", value="maybe")
def test_bad_api_variables_through_cli(variable: str, value: str, api: RecordingServer) -> None:
    if variable == "CWTRAIN_API_HEADERS" and is_json_object(value.encode()):
        value = "[" + value  # keep it bad
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(variable, value)
        code, out, err = run_cli(["--base-url", api.url, "--token", TOKEN, "deployment", "get", "dep-1"])
    assert (code, out) == (1, ""), (code, out, err)
    line = one_error_line(err)
    assert variable in line, line
    if variable == "CWTRAIN_API_HEADERS":  # a secret: never echoed
        assert HEADER_SECRET not in err
    assert api.requests == []
