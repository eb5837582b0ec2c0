"""Bad input, fuzzed with hypothesis: a clear error naming the input, exit 1 or 2, nothing written or sent.

Inputs: deployment request files (garbage bytes, JSON that is not an object, objects still
holding ``<placeholders>``), snapshot index JSON, safetensors headers (garbage, broken
entries, oversized lengths), snapshot identities and CLI numbers (environment variable
values: ``test_bad_input_env.py``). The API is a loopback server that records every request
(``_recording``); the object store is the session's moto server, whose bucket must stay empty.
"""

from __future__ import annotations

import json
import math
import string
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _recording import (
    FUZZ,
    FUZZ_CLI,
    JSON_SCALARS,
    JSON_VALUES,
    TOKEN,
    RecordingServer,
    is_json_object,
    one_error_line,
    run_cli,
)
from hypothesis import example, given
from hypothesis import strategies as st

from cwtrain.errors import SnapshotError
from cwtrain.hotload.files.validate import inspect_snapshot
from cwtrain.hotload.format.identity import RESERVED_IDENTITIES, validate_identity
from cwtrain.hotload.format.index import INDEX_NAME, SINGLE_FILE_NAME
from cwtrain.hotload.format.safetensors import MAX_HEADER_BYTES, TensorEntry, encode_header
from cwtrain.hotload.loader import HotLoader
from cwtrain.infra import InferenceClient

pytestmark = [pytest.mark.faults, pytest.mark.fault_row("bad-input")]

DEPLOYMENT = "dep-fuzz"
SHARD = "model-00000-of-00001.safetensors"


# ------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bad-input")


@pytest.fixture
def api(s3_bucket: tuple[Any, str]) -> Iterator[RecordingServer]:
    """The recording API; its deployment ``dep-fuzz`` hot-loads into the test's moto bucket."""
    _, bucket = s3_bucket
    deployment = {
        "deployment": {
            "spec": {
                "id": DEPLOYMENT,
                "name": "fuzz",
                "gatewayIds": ["gw-1"],
                "runtime": {"engine": "dynamo-vllm", "version": "1.2.3"},
                "model": {"name": "tiny", "bucket": bucket, "path": "base"},
                "hotLoad": {"bucket": bucket, "pathPrefix": "hotload", "transitionMode": "TRANSITION_MODE_ASYNC"},
            },
            "status": {"status": "STATUS_READY", "conditions": []},
        }
    }
    with RecordingServer({f"/v1alpha1/inference/deployments/{DEPLOYMENT}": deployment}) as server:
        yield server


def _shard_bytes(values: np.ndarray | None = None) -> bytes:
    data = (np.arange(4, dtype=np.float32) if values is None else values).tobytes()
    return encode_header([TensorEntry("w", "F32", (4,), 0, len(data))]) + data


def _snapshot(root: Path) -> Path:
    """A valid FULL snapshot directory: config.json, one shard, its index."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text('{"model_type": "tiny"}')
    (root / SHARD).write_bytes(_shard_bytes())
    (root / INDEX_NAME).write_text(json.dumps({"metadata": {"total_size": 16}, "weight_map": {"w": SHARD}}))
    return root


def _listing(root: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.iterdir())}


def _stored(s3_bucket: tuple[Any, str]) -> list[str]:
    """Every object key and open multipart upload in the bucket."""
    client, bucket = s3_bucket
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]
    uploads = [u["Key"] for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]
    return keys + uploads


# ------------------------------------------------------------------ request files


PLACEHOLDER = st.builds(
    lambda name, before, after: f"{before}<{name}>{after}",
    st.text(string.ascii_letters, min_size=1, max_size=1).flatmap(
        lambda first: st.text(st.characters(blacklist_characters="<>"), max_size=10).map(lambda rest: first + rest)
    ),
    st.text(st.characters(blacklist_characters="<>"), max_size=6),
    st.text(st.characters(blacklist_characters="<>"), max_size=6),
)


@st.composite
def placeholder_requests(draw: st.DrawFn) -> bytes:
    """A JSON object with a ``<placeholder>`` at a random place outside runtime.engineConfig/engineEnv."""
    body = draw(st.dictionaries(st.text(max_size=8), JSON_SCALARS, max_size=4))
    path = draw(st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=3))
    if path[0] == "runtime":
        path[0] = "runtime_"
    value: Any = draw(PLACEHOLDER)
    if draw(st.booleans()):
        value = [draw(JSON_SCALARS), value]
    for key in reversed(path[1:]):
        value = {key: value}
    body[path[0]] = value
    return json.dumps(body, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")


REQUEST_FILES = st.one_of(
    st.binary(max_size=200).filter(lambda b: not is_json_object(b)),
    JSON_VALUES.filter(lambda v: not isinstance(v, dict)).map(lambda v: json.dumps(v).encode()),
    placeholder_requests(),
)


@FUZZ_CLI
@given(content=REQUEST_FILES)
@example(content=b"")
@example(content=b"\xef\xbb\xbf{}")
@example(content=b'{"name": "x", "model": {"bucket": "<bucket>"}}')
def test_bad_request_file_is_refused_before_any_request(content: bytes, api: RecordingServer, workdir: Path) -> None:
    path = Path(tempfile.mkstemp(suffix=".json", prefix="request-", dir=workdir)[1])
    path.write_bytes(content)
    code, out, err = run_cli(["--base-url", api.url, "--token", TOKEN, "deployment", "create", "-f", str(path)])
    assert code == 1, err
    assert out == ""
    line = one_error_line(err)
    assert line.startswith("error: ") and str(path) in line, line
    assert api.requests == []
    assert path.read_bytes() == content


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_unreadable_request_file(kind: str, api: RecordingServer, tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    if kind == "directory":
        path.mkdir()
    code, out, err = run_cli(["--base-url", api.url, "--token", TOKEN, "deployment", "create", "-f", str(path)])
    assert (code, out) == (1, "")
    assert str(path) in one_error_line(err)
    assert api.requests == []


# ------------------------------------------------------------------ CLI numbers


def _positive_finite(text: str) -> bool:
    try:
        value = float(text)
    except ValueError:
        return False
    return math.isfinite(value) and value > 0


def _positive_int(text: str) -> bool:
    try:
        return int(text, 10) > 0
    except ValueError:
        return False


BAD_SECONDS = st.one_of(
    st.sampled_from(["-1", "nan", "NaN", "inf", "-inf", "Infinity", "0", "-0", "1e400", "", "1s", "10 min"]),
    st.floats(max_value=0.0).map(repr),
    st.text(max_size=10).filter(lambda s: not _positive_finite(s)),
)
BAD_COUNTS = st.one_of(
    st.sampled_from(["0", "-1", "1.5", "eight", "", "0x8"]),
    st.integers(max_value=0).map(str),
    st.text(max_size=8).filter(lambda s: not _positive_int(s)),
)


@FUZZ_CLI
@given(value=BAD_SECONDS, command=st.sampled_from(["create", "delete", "wait", "publish"]))
def test_bad_timeout_is_a_usage_error(value: str, command: str, api: RecordingServer, workdir: Path) -> None:
    argv = {
        "create": ["deployment", "create", "-f", str(workdir / "r.json")],
        "delete": ["deployment", "delete", "dep-1", "--wait"],
        "wait": ["hotload", "wait", "hl-1"],
        "publish": ["hotload", "publish", "--deployment", DEPLOYMENT, "--checkpoint", str(workdir), "--identity", "a"],
    }[command]
    code, out, err = run_cli(["--base-url", api.url, "--token", TOKEN, *argv, f"--timeout={value}"])
    assert (code, out) == (2, "")
    assert err.startswith("usage: cwtrain"), err
    assert "--timeout" in one_error_line(err)
    assert api.requests == []


@FUZZ_CLI
@given(value=BAD_COUNTS)
def test_bad_workers_is_a_usage_error(value: str, api: RecordingServer, workdir: Path) -> None:
    argv = ["hotload", "publish", "--deployment", DEPLOYMENT, "--checkpoint", str(workdir), "--identity", "a"]
    code, out, err = run_cli(["--base-url", api.url, "--token", TOKEN, *argv, f"--workers={value}"])
    assert (code, out) == (2, "")
    assert err.startswith("usage: cwtrain"), err
    assert "--workers" in one_error_line(err)
    assert api.requests == []


# --------------------------------------------------------------- index JSON


INDEX_OBJECTS = st.fixed_dictionaries(
    {},
    optional={
        "metadata": JSON_VALUES,
        "weight_map": JSON_VALUES
        | st.dictionaries(
            st.sampled_from(["w", "v", "w2"]) | st.text(max_size=4),
            st.sampled_from([SHARD, "other.safetensors", "../x.safetensors", ".h.safetensors", "a/b.safetensors"])
            | JSON_SCALARS,
            max_size=3,
        ),
        "extra": JSON_VALUES,
    },
)


def _broken_index(value: Any) -> bool:
    """Refused by the index parser itself (so the message must name the index file)."""
    if not isinstance(value, dict) or not isinstance(value.get("weight_map"), dict):
        return True
    return value.get("metadata") is not None and not isinstance(value["metadata"], dict)


@FUZZ
@given(
    raw=st.one_of(
        st.binary(max_size=64),
        JSON_VALUES.map(lambda v: json.dumps(v).encode()),
        INDEX_OBJECTS.map(lambda v: json.dumps(v).encode()),
    )
)
@example(raw=b'{"weight_map": {"w": "model.safetensors"}}')
@example(raw=b'{"metadata": {"delta_encoding": "xor"}, "weight_map": {"w": "' + SHARD.encode() + b'"}}')
def test_fuzzed_index_json(raw: bytes, workdir: Path) -> None:
    root = _snapshot(Path(tempfile.mkdtemp(prefix="index-", dir=workdir)))
    (root / INDEX_NAME).write_bytes(raw)
    before = _listing(root)
    try:
        parsed: Any = json.loads(raw.decode("utf-8"))
    except ValueError:
        parsed = None
    try:
        inspect_snapshot(root)
    except SnapshotError as exc:
        assert str(root) in str(exc)
        if parsed is None or _broken_index(parsed):
            assert str(root / INDEX_NAME) in str(exc), exc
    else:
        assert not _broken_index(parsed) and parsed["weight_map"] == {"w": SHARD}, "a broken index was accepted"
    assert _listing(root) == before


@FUZZ_CLI
@given(raw=st.binary(max_size=64) | JSON_VALUES.map(lambda v: json.dumps(v).encode()))
def test_fuzzed_index_through_cli(raw: bytes, workdir: Path) -> None:
    root = _snapshot(Path(tempfile.mkdtemp(prefix="index-cli-", dir=workdir)))
    (root / INDEX_NAME).write_bytes(raw)
    before = _listing(root)
    code, out, err = run_cli(["hotload", "inspect", str(root)])
    assert (code, out) == (1, ""), (code, out, err)
    assert str(root) in one_error_line(err)
    assert _listing(root) == before


# ------------------------------------------------------------ safetensors headers


def _entry(**changes: Any) -> dict[str, Any]:
    return {"dtype": "F32", "shape": [4], "data_offsets": [0, 16], **changes}


BROKEN_ENTRIES = st.one_of(
    JSON_SCALARS.map(lambda v: {"w": v}),
    st.text(max_size=6).filter(lambda d: d not in ("F32", "I32", "U32")).map(lambda d: {"w": _entry(dtype=d)}),
    JSON_VALUES.filter(lambda v: v != [4]).map(lambda s: {"w": _entry(shape=s)}),
    JSON_VALUES.filter(lambda v: v != [0, 16]).map(lambda o: {"w": _entry(data_offsets=o)}),
    st.integers(1, 64).map(lambda gap: {"w": _entry(data_offsets=[gap, gap + 16])}),
    st.just({"w": _entry(), "v": _entry()}),  # overlap
    JSON_VALUES.filter(lambda v: not isinstance(v, dict) and v is not None).map(lambda m: {"__metadata__": m}),
    st.dictionaries(st.text(max_size=4), JSON_SCALARS.filter(lambda v: not isinstance(v, str)), min_size=1).map(
        lambda m: {"__metadata__": m, "w": _entry()}
    ),
    st.just({}),  # no tensors
    st.just({"__metadata__": None}),
)


def _header_file(header: bytes, data: bytes = b"\0" * 16) -> bytes:
    return len(header).to_bytes(8, "little") + header + data


SAFETENSORS_FILES = st.one_of(
    st.binary(max_size=7),  # shorter than the length prefix
    st.binary(max_size=80).map(_header_file),  # garbage header
    BROKEN_ENTRIES.map(lambda h: _header_file(json.dumps(h).encode())),
    st.integers(1, 64).map(lambda extra: _header_file(json.dumps({"w": _entry()}).encode(), b"\0" * (16 + extra))),
    st.integers(0, 15).map(lambda n: _header_file(json.dumps({"w": _entry()}).encode(), b"\0" * n)),  # truncated
    st.integers(MAX_HEADER_BYTES + 1, 2**64 - 1).map(lambda n: n.to_bytes(8, "little") + b"{}"),  # oversized
    st.integers(3, MAX_HEADER_BYTES).map(lambda n: n.to_bytes(8, "little") + b"{}"),  # runs past the end
)


@FUZZ
@given(blob=SAFETENSORS_FILES)
def test_fuzzed_safetensors_header(blob: bytes, workdir: Path) -> None:
    root = Path(tempfile.mkdtemp(prefix="header-", dir=workdir))
    (root / "config.json").write_text("{}")
    (root / SINGLE_FILE_NAME).write_bytes(blob)
    before = _listing(root)
    with pytest.raises(SnapshotError) as caught:
        inspect_snapshot(root)
    assert SINGLE_FILE_NAME in str(caught.value)
    assert _listing(root) == before


@FUZZ_CLI
@given(blob=SAFETENSORS_FILES)
def test_fuzzed_shard_header_through_cli(blob: bytes, workdir: Path) -> None:
    root = _snapshot(Path(tempfile.mkdtemp(prefix="shard-cli-", dir=workdir)))
    (root / SHARD).write_bytes(blob)
    before = _listing(root)
    code, out, err = run_cli(["hotload", "inspect", str(root)])
    assert (code, out) == (1, ""), (code, out, err)
    assert str(root / SHARD) in one_error_line(err)
    assert _listing(root) == before


# ------------------------------------------------------------------- identities


BAD_IDENTITIES = st.one_of(
    st.just(""),
    st.sampled_from([".", "..", *sorted(RESERVED_IDENTITIES)]),
    st.text(min_size=129, max_size=200).filter(lambda s: "/" not in s),
    st.tuples(st.text(max_size=12), st.text(max_size=12)).map("/".join),
)
BAD_PREDECESSORS = BAD_IDENTITIES.filter(lambda s: s not in ("", "initial"))  # "" means none


_LOADERS: dict[tuple[str, str], HotLoader] = {}


def _loader(api: RecordingServer, s3_bucket: tuple[Any, str]) -> HotLoader:
    """One loader per (API, bucket): the examples of one test share it."""
    key = (api.url, s3_bucket[1])
    if key not in _LOADERS:
        client = InferenceClient(TOKEN, base_url=api.url, max_retries=1)
        _LOADERS[key] = HotLoader(client, DEPLOYMENT, s3=s3_bucket[0], timeout=5, poll_interval=0.1)
    return _LOADERS[key]


def _tensors(shift: float = 0.0) -> dict[str, np.ndarray]:
    return {"w": np.arange(4, dtype=np.float32) + shift}


def test_a_valid_identity_does_write_and_send(api: RecordingServer, s3_bucket: tuple[Any, str], workdir: Path) -> None:
    """The control for the identity cases: the same harness sees a real upload and the API calls."""
    _loader(api, s3_bucket).upload(_snapshot(workdir / "control"), "fuzz-v000001")
    assert any(key.endswith("fuzz-v000001/" + INDEX_NAME) for key in _stored(s3_bucket))
    assert api.requests


@FUZZ
@given(
    identity=BAD_IDENTITIES, path=st.sampled_from(["validate", "publish-dir", "publish-tensors", "upload", "trigger"])
)
@example(identity="a" * 129, path="publish-dir")
def test_bad_identity_writes_and_sends_nothing(
    identity: str, path: str, api: RecordingServer, s3_bucket: tuple[Any, str], workdir: Path
) -> None:
    loader = _loader(api, s3_bucket)
    snapshot = _snapshot(workdir / "identity-src")
    with pytest.raises(SnapshotError) as caught:
        if path == "validate":
            validate_identity(identity)
        elif path == "publish-dir":
            loader.publish(snapshot, identity)
        elif path == "publish-tensors":
            loader.publish(_tensors(), identity, extra_files={"config.json": b"{}"})
        elif path == "upload":
            loader.upload(snapshot, identity)
        else:
            loader.trigger(identity)
    assert repr(identity) in str(caught.value)
    assert api.requests == []
    assert _stored(s3_bucket) == []


@FUZZ
@given(previous=BAD_PREDECESSORS, path=st.sampled_from(["publish-tensors", "publish-dir", "trigger"]))
def test_bad_previous_identity_writes_and_sends_nothing(
    previous: str, path: str, api: RecordingServer, s3_bucket: tuple[Any, str], workdir: Path
) -> None:
    loader = _loader(api, s3_bucket)
    with pytest.raises(SnapshotError) as caught:
        if path == "publish-tensors":
            loader.publish(_tensors(1.0), "fuzz-v000002", previous_identity=previous, base=_tensors())
        elif path == "publish-dir":
            loader.publish(_snapshot(workdir / "previous-src"), "fuzz-v000002", previous_identity=previous)
        else:
            loader.trigger("fuzz-v000002", previous_identity=previous)
    assert repr(previous) in str(caught.value)
    assert api.requests == []
    assert _stored(s3_bucket) == []


@FUZZ_CLI
@given(identity=BAD_IDENTITIES, command=st.sampled_from(["publish", "trigger", "trigger-previous"]))
def test_bad_identity_through_cli(
    identity: str, command: str, api: RecordingServer, s3_bucket: tuple[Any, str], s3_env: Any, workdir: Path
) -> None:
    snapshot = _snapshot(workdir / "identity-cli")
    argv = ["--base-url", api.url, "--token", TOKEN, "hotload"]
    if command == "publish":
        argv += ["publish", "--deployment", DEPLOYMENT, "--checkpoint", str(snapshot), f"--identity={identity}"]
    elif command == "trigger":
        argv += ["trigger", "--deployment", DEPLOYMENT, f"--identity={identity}"]
    else:
        if identity in ("", "initial"):  # an empty predecessor means none; "initial" is a valid one
            identity = "_preflight"
        argv += ["trigger", "--deployment", DEPLOYMENT, "--identity=fuzz-v000003", f"--previous-identity={identity}"]
    code, out, err = run_cli(argv)
    assert (code, out) == (1, ""), (code, out, err)
    line = one_error_line(err)
    assert "identity" in line and " ".join(repr(identity).split()) in line, line
    assert api.requests == []
    assert _stored(s3_bucket) == []
