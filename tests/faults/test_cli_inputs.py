"""The CLI's last line: no secret in any form, and no traceback, whatever the input.

``secret-forms``: an AWS key id and secret key with a trailing newline (botocore refuses
the signed header and quotes it as ``b'...\\n'``), an API header value with one, and a
password in the API URL. The ``error:`` line must hold none of each secret's forms: the
value, stripped, its ``repr`` and ``bytes`` escapes, percent-encoded, a URL's userinfo.

``cli-crash``: tokens, header values and origins httpx cannot send (non-ASCII, control
characters), fuzzed with hypothesis over the real CLI in-process against a loopback
server, and an exception that no row of the error table knows: one ``error:`` line, exit
1 or 2, no traceback.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from _recording import FUZZ_CLI, RecordingServer, run_cli
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cwtrain.errors import describe

pytestmark = [pytest.mark.faults]

KEY_ID = "AKIDSECRETFORMS01\n"
SECRET_KEY = "s3-secret-forms-key-0123456789\n"
HEADER_VALUE = "hdr-secret-forms-value\n"
URL_PASSWORD = "pw-secret-forms-42"
#: The derandomized settings of this file (CI runs the same examples every time).
FIXED = settings(FUZZ_CLI, derandomize=True)


def _forms(secret: str) -> list[str]:
    """The forms a secret takes in messages, each long enough to identify it."""
    forms = {secret, secret.strip(), repr(secret)[1:-1], repr(secret.encode())[2:-1], quote(secret, safe="")}
    return [form for form in forms if len(form) >= 8]


def _assert_masked(text: str, *secrets: str) -> None:
    leaks = [form for secret in secrets for form in _forms(secret) if form in text]
    assert not leaks, f"{leaks} in {text!r}"


def _error_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def api() -> Iterator[RecordingServer]:
    with RecordingServer() as server:
        yield server


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("CWTRAIN_API_HEADERS", "CWTRAIN_DEBUG", "CW_API_TOKEN", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COREWEAVE_API_TOKEN", "token-cli-inputs")
    return monkeypatch


# ---------------------------------------------------------------------- secret forms


@pytest.mark.fault_row("secret-forms")
def test_aws_keys_with_a_trailing_newline(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    clean_env.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    clean_env.setenv("AWS_REGION", "US-EAST-04A")
    clean_env.setenv("CW_S3_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    code, out, err = run_cli(["hotload", "check", "--bucket", "b", "--prefix", "p"])
    assert code == 1 and out == ""
    _assert_masked(_error_line(err), KEY_ID, SECRET_KEY)


@pytest.mark.fault_row("secret-forms")
def test_an_api_header_value_with_a_trailing_newline(clean_env: pytest.MonkeyPatch, api: RecordingServer) -> None:
    clean_env.setenv("CWTRAIN_API_HEADERS", json.dumps({"X-Org-Secret": HEADER_VALUE}))
    code, out, err = run_cli(["--base-url", api.url, "hotload", "cancel", "h-1"])
    line = _error_line(err)
    assert code == 1 and out == "" and "X-Org-Secret" in line
    _assert_masked(line, HEADER_VALUE)
    assert api.requests == []  # refused before sending


@pytest.mark.fault_row("secret-forms")
def test_a_password_in_the_api_url(clean_env: pytest.MonkeyPatch) -> None:
    url = f"http://user:{URL_PASSWORD}@127.0.0.1:{_closed_port()}"
    code, out, err = run_cli(["--base-url", url, "hotload", "cancel", "h-1"])
    line = _error_line(err)
    assert code == 1 and out == "" and "127.0.0.1" in line and "***@" in line
    _assert_masked(line, URL_PASSWORD)


@pytest.mark.fault_row("secret-forms")
@pytest.mark.parametrize(
    "template",
    [
        "{raw}",
        "header value {repr}",
        "Invalid header value b'{bytes}'",
        "GET https://api/x?token={quoted}",
        "{stripped} was refused",
        "https://someone:{raw}@host/",
    ],
)
def test_describe_masks_every_form(template: str) -> None:
    secret = "tok\tSECRET value/+=\n"
    text = template.format(
        raw=secret,
        repr=repr(secret),
        bytes=repr(secret.encode())[2:-1],
        quoted=quote(secret, safe=""),
        stripped=secret.strip(),
    )
    line = describe(RuntimeError(text), secrets={"token": secret})
    assert "***" in line
    _assert_masked(line, secret)


# -------------------------------------------------------------------------- crashes


@pytest.mark.fault_row("cli-crash")
@pytest.mark.parametrize("where", ["env", "option"])
def test_a_non_ascii_token_is_one_error_line(where: str, clean_env: pytest.MonkeyPatch, api: RecordingServer) -> None:
    argv = ["--base-url", api.url, "hotload", "cancel", "h-1"]
    if where == "env":
        clean_env.setenv("COREWEAVE_API_TOKEN", "tök-secret-ünicode")
    else:
        argv = ["--token", "tök-secret-ünicode", *argv]
    code, out, err = run_cli(argv)
    line = _error_line(err)
    assert code == 1 and out == "" and "token" in line and "printable ASCII" in line
    assert "tök" not in line and api.requests == []


@pytest.mark.fault_row("cli-crash")
@pytest.mark.parametrize("origin", ["http://[::1", "ftp://host", "http://", "://x", "http://h:99999"])
def test_a_bad_origin_is_one_error_line(origin: str, clean_env: pytest.MonkeyPatch) -> None:
    code, out, err = run_cli(["--base-url", origin, "hotload", "cancel", "h-1"])
    assert code == 1 and out == "" and "COREWEAVE_API_URL" in _error_line(err)


@pytest.mark.fault_row("cli-crash")
def test_an_exception_no_row_knows_is_one_error_line(clean_env: pytest.MonkeyPatch) -> None:
    import cwtrain.cli.hotload

    def client_from_args(args: Any) -> Any:
        raise KeyError("no-such-key")

    clean_env.setattr(cwtrain.cli.hotload, "client_from_args", client_from_args)
    code, out, err = run_cli(["hotload", "cancel", "h-1"])
    line = _error_line(err)
    assert code == 1 and out == "" and "internal error (KeyError" in line and "-v" in line


ENV_VALUE = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=24)
ANY_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=24)


@pytest.mark.fault_row("cli-crash")
@FIXED
@given(
    token=st.one_of(ENV_VALUE, st.sampled_from(["tök", "a\nb", "a\rb", "\x7f", "ab\u202e", "é" * 20])),
    header=st.one_of(st.none(), st.dictionaries(ENV_VALUE, ENV_VALUE, max_size=2)),
    origin=st.one_of(st.none(), ENV_VALUE, st.sampled_from(["http://[::1", "http://u:p@127.0.0.1:1", "ftp://x"])),
    resource=ANY_TEXT,
    via_option=st.booleans(),
)
@example(token="tök", header=None, origin=None, resource="h-1", via_option=False)
@example(token="t", header={"X-A": "v\n"}, origin=None, resource="h?x", via_option=True)
def test_fuzzed_credentials_and_ids_never_crash(
    token: str,
    header: dict[str, str] | None,
    origin: str | None,
    resource: str,
    via_option: bool,
    api: RecordingServer,
    clean_env: pytest.MonkeyPatch,
) -> None:
    clean_env.setenv("COREWEAVE_API_TOKEN", "fallback-token")
    argv = ["--base-url", origin if origin is not None else api.url]
    if via_option:
        argv += ["--token", token]
    else:
        clean_env.setenv("COREWEAVE_API_TOKEN", token)
    if header is None:
        clean_env.delenv("CWTRAIN_API_HEADERS", raising=False)
    else:
        clean_env.setenv("CWTRAIN_API_HEADERS", json.dumps(header))
    code, out, err = run_cli([*argv, "hotload", "cancel", resource])
    assert code in (1, 2), (code, out, err)  # the recording server answers every request 503
    assert "Traceback" not in err
    if code == 1:
        _error_line(err)
