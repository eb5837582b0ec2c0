"""Smaller integrity faults of the snapshot tools and the client, one row each.

- ``out-link``: ``snapshot diff --out`` a link to an empty directory writes there; a link
  to a file or to nothing is refused before either checkpoint is read;
- ``many-tensors``: thousands of zero-size tensors give a few progress lines, and the time
  of ``snapshot diff`` and ``hotload inspect`` grows linearly with their count;
- ``id-escape``: ids holding ``?``, ``#``, ``%`` or ``:`` are sent as one percent-encoded
  path segment, so they never address another resource; ``parameters`` is no deployment
  or gateway id (it would address their parameters endpoint);
- ``identity-chars``: identities with control, format (bidi, zero-width) or separator
  characters are refused before anything is sent;
- ``metadata-clash``: a tensor named ``format`` beside ``"format": "pt"`` is refused by
  every writer of checksums instead of overwriting the entry, and ``snapshot diff`` (and
  ``hotload publish --base``) refuse the checkpoints ``snapshot apply`` refuses, up front;
- ``verify-nothing``: ``snapshot verify`` that checked no Adler-32 exits 1, never says ok.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import zlib
from pathlib import Path

import httpx
import numpy as np
import pytest
from _recording import run_cli
from safetensors.numpy import save_file

from cwtrain.errors import SnapshotError, UsageError
from cwtrain.hotload.codec.encode import DeltaEncoder
from cwtrain.hotload.files.mirror import WeightMirror
from cwtrain.hotload.files.write import write_delta, write_full_snapshot
from cwtrain.hotload.format.identity import validate_identity
from cwtrain.hotload.format.safetensors import TensorEntry, encode_header
from cwtrain.hotload.format.tensors import TensorData
from cwtrain.hotload.loader import HotLoader
from cwtrain.infra import InferenceClient

pytestmark = [pytest.mark.faults]


def _checkpoint(root: Path, weights: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> Path:
    root.mkdir(parents=True)
    save_file(weights, str(root / "model.safetensors"), metadata=metadata or {"format": "pt"})
    (root / "config.json").write_text("{}")
    return root


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    old = _checkpoint(tmp_path / "v1", {"a": np.zeros(64, np.float32), "b": np.ones(8, np.float16)})
    new = _checkpoint(tmp_path / "v2", {"a": np.arange(64, dtype=np.float32), "b": np.ones(8, np.float16)})
    return old, new


def _diff_argv(old: Path, new: Path, out: Path) -> list[str]:
    return ["snapshot", "diff", str(old), str(new), "--out", str(out), "--version", "2", "--base-version", "1"]


# ------------------------------------------------------------------------- out-link


@pytest.mark.fault_row("out-link")
def test_out_a_link_to_an_empty_directory_writes_there(pair: tuple[Path, Path], tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    code, out, err = run_cli(_diff_argv(*pair, tmp_path / "link"))
    assert code == 0, err
    assert json.loads(out)["tensors_changed"] == 1
    assert (tmp_path / "link").is_symlink() and (tmp_path / "real" / "model.safetensors.index.json").is_file()


@pytest.mark.fault_row("out-link")
@pytest.mark.parametrize("target", ["file", "nothing", "full"])
def test_out_a_bad_link_fails_before_any_work(target: str, pair: tuple[Path, Path], tmp_path: Path) -> None:
    destination = tmp_path / "target"
    if target == "file":
        destination.write_text("x")
    elif target == "full":
        destination.mkdir()
        (destination / "keep").write_text("x")
    (tmp_path / "link").symlink_to(destination)
    started: list[int] = []
    with pytest.raises(SnapshotError, match=r"link|not empty"):
        write_delta(*pair, tmp_path / "link", version="2", base_version="1", on_total=started.append)
    assert started == []  # refused before the checkpoints were read
    left = {"link", "v1", "v2"} | ({"target"} if target != "nothing" else set())
    assert {p.name for p in tmp_path.iterdir()} == left  # no staging directory left behind


# --------------------------------------------------------------------- many tensors


def _zero_tensors(root: Path, count: int, tail: bytes) -> Path:
    """A checkpoint of ``count`` zero-size tensors after a 16-byte tensor ``a`` holding ``tail``.

    ``a`` sorts first: once it is done the total is reached, and every zero-size tensor
    after it must not draw a line of its own.
    """
    root.mkdir(parents=True)
    entries = [TensorEntry("a", "U8", (16,), 0, 16)]
    entries += [TensorEntry(f"t{i:07d}", "U8", (0,), 16, 16) for i in range(count)]
    (root / "model.safetensors").write_bytes(encode_header(entries, {"format": "pt"}) + tail)
    (root / "config.json").write_text("{}")
    return root


@pytest.mark.fault_row("many-tensors")
def test_zero_size_tensors_give_a_few_progress_lines(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    old = _zero_tensors(tmp_path / "old", 3000, bytes(16))
    new = _zero_tensors(tmp_path / "new", 3000, bytes(range(16)))
    with caplog.at_level(logging.INFO, logger="cwtrain.progress"):
        code, _, err = run_cli(_diff_argv(old, new, tmp_path / "d"))
    assert code == 0, err
    lines = [r for r in caplog.records if r.name == "cwtrain.progress"]
    assert 1 <= len(lines) <= 3, f"{len(lines)} progress lines for 3001 tensors"


_CPU_PROBE = """
import sys, time
from pathlib import Path
from cwtrain.cli import main
from cwtrain.hotload.files.write import write_delta
old, new, out = (Path(p) for p in sys.argv[1:4])
best = float("inf")
for attempt in range(2):
    start = time.process_time()
    write_delta(old, new, out / str(attempt), version="2", base_version="1", workers=1)
    assert main(["hotload", "inspect", str(new)]) == 0
    best = min(best, time.process_time() - start)
print(best)
"""


def _cpu_seconds(tmp_path: Path, count: int) -> float:
    """CPU time of snapshot diff plus hotload inspect of the delta, best of two runs.

    Measured in a child process: the suite's own threads (a shared local stack, S3 servers) would
    otherwise add their CPU time to whichever size happens to run beside them.
    """
    old = _zero_tensors(tmp_path / f"old{count}", count, bytes(16))
    new = _zero_tensors(tmp_path / f"new{count}", count, bytes(range(16)))
    out = tmp_path / f"d{count}"
    out.mkdir()
    probe = subprocess.run(
        [sys.executable, "-c", _CPU_PROBE, str(old), str(new), str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert probe.returncode == 0, probe.stderr
    return float(probe.stdout.split()[-1])


@pytest.mark.fault_row("many-tensors")
def test_diff_and_inspect_grow_linearly_with_the_tensor_count(tmp_path: Path) -> None:
    small, large = _cpu_seconds(tmp_path, 2000), _cpu_seconds(tmp_path, 16000)
    assert large < 20 * small, f"8x the tensors took {large / small:.1f}x the CPU time ({small:.2f}s, {large:.2f}s)"


# ----------------------------------------------------------------------- id-escape


@pytest.mark.fault_row("id-escape")
@pytest.mark.parametrize("resource", ["abc?junk", "abc#frag", "abc%2Fx", "abc:cancel", "abc ?", "ab%3Fc"])
def test_ids_are_one_percent_encoded_segment(resource: str) -> None:
    seen: list[httpx.URL] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url)
        return httpx.Response(404, json={"code": "not_found", "message": "no"})

    with InferenceClient("token-id-escape", transport=httpx.MockTransport(handler), max_retries=1) as api:
        for call in (api.get_hot_load, api.delete_deployment, api.get_gateway, api.cancel_hot_load):
            with pytest.raises(Exception, match="no"):
                call(resource)
    assert len(seen) == 4
    for url in seen:
        assert url.query == b"" and url.fragment == ""
        segment = url.raw_path.decode().split("/")[-1].removesuffix(":cancel")
        assert httpx.URL("http://x/" + segment).path.removeprefix("/") == resource.strip()


@pytest.mark.fault_row("id-escape")
def test_parameters_is_no_deployment_or_gateway_id() -> None:
    sent: list[httpx.Request] = []
    transport = httpx.MockTransport(lambda request: sent.append(request) or httpx.Response(200, json={}))
    with InferenceClient("token-id-escape", transport=transport, max_retries=1) as api:
        for call in (api.get_deployment, api.delete_deployment, api.get_gateway, api.delete_gateway):
            with pytest.raises(UsageError, match="parameters endpoint"):
                call("parameters")
    assert sent == []  # `deployment get parameters` no longer prints the parameters as an empty deployment


# ------------------------------------------------------------------ identity chars

BAD_CHARACTERS = ["\u202e", "\u2066", "\u200b", "\u200f", "\x00", "\n", "\x1b", "\u2028", "\ufeff", "\ue000"]


@pytest.mark.fault_row("identity-chars")
@pytest.mark.parametrize("character", BAD_CHARACTERS)
def test_identities_with_hiding_characters_are_refused_before_sending(character: str) -> None:
    identity = f"run{character}-v000001"
    with pytest.raises(SnapshotError, match=f"U\\+{ord(character):04X}"):
        validate_identity(identity)
    sent: list[httpx.Request] = []
    transport = httpx.MockTransport(lambda request: sent.append(request) or httpx.Response(500))
    with InferenceClient("token-identity", transport=transport, max_retries=1) as api:
        loader = HotLoader(api, "dep-1", s3=object(), timeout=1)
        with pytest.raises(SnapshotError):
            loader.trigger(identity)
        with pytest.raises(SnapshotError):
            loader.trigger("run-v000002", previous_identity=identity)
    assert sent == []


# ------------------------------------------------------------------ metadata clash


@pytest.mark.fault_row("metadata-clash")
def test_a_tensor_named_format_is_refused_by_every_checksum_writer(tmp_path: Path) -> None:
    weights = {"format": np.arange(4, dtype=np.float32), "w": np.ones(4, np.float32)}
    src = _checkpoint(tmp_path / "src", weights)
    with pytest.raises(SnapshotError, match="'format'"):
        write_full_snapshot(src, tmp_path / "full")
    assert not (tmp_path / "full").exists()
    with pytest.raises(SnapshotError, match="'format'"):
        WeightMirror.create(src).write_full_snapshot(tmp_path / "mirror-full")
    tensors = {n: TensorData("F32", a.shape, a) for n, a in weights.items()}
    with DeltaEncoder(workers=1) as encoder, pytest.raises(SnapshotError, match="'format'"):
        encoder.encode_full(tensors)  # the default __metadata__ is {"format": "pt"}
    from cwtrain.hotload.files.write import write_applied_snapshot  # what `cwtrain snapshot apply` runs

    new = _checkpoint(tmp_path / "new", {**weights, "w": np.zeros(4, np.float32)})
    same_bytes = _checkpoint(tmp_path / "same", weights, {"origin": "no format entry"})  # a delta that fits src
    write_delta(same_bytes, new, tmp_path / "delta", version="2", base_version="1")
    with pytest.raises(SnapshotError, match="'format'"):
        write_applied_snapshot(src, tmp_path / "delta", tmp_path / "applied")
    assert not (tmp_path / "applied").exists()


CLASHES = [  # (the base's shard __metadata__, its tensors): snapshot diff and snapshot apply agree on each
    pytest.param({"format": "pt"}, ["format", "w"], False, id="format-beside-format-pt"),
    pytest.param({"format": "pt", "origin": "trainer"}, ["origin", "w"], False, id="another-entry"),
    pytest.param({"format": "pt"}, ["formats", "w"], True, id="no-clash"),
    pytest.param({"format": "<adler32>"}, ["format", "w"], True, id="entry-that-is-the-tensors-checksum"),
]


@pytest.mark.fault_row("metadata-clash")
@pytest.mark.parametrize(("metadata", "names", "accepted"), CLASHES)
def test_snapshot_diff_and_apply_refuse_the_same_checkpoints(
    metadata: dict[str, str], names: list[str], accepted: bool, tmp_path: Path
) -> None:
    """Issue 26 item 10: diff accepted a checkpoint (a tensor `format`) whose delta apply then refused."""
    base_weights = {name: np.arange(4, dtype=np.float32) + i for i, name in enumerate(names)}
    adler = f"{zlib.adler32(base_weights[names[0]].tobytes()):08x}"
    metadata = {key: adler if value == "<adler32>" else value for key, value in metadata.items()}
    base = _checkpoint(tmp_path / "base", base_weights, metadata)
    new = _checkpoint(tmp_path / "new", {**base_weights, "w": np.zeros(4, np.float32)}, metadata)
    code, _, err = run_cli(_diff_argv(base, new, tmp_path / "delta"))
    assert (code == 0) is accepted, err
    if not accepted:
        assert "tensors named like the shard's __metadata__ entries" in err and "could never apply" in err
        assert not (tmp_path / "delta").exists() and not list(tmp_path.glob(".delta.*"))
        same = _checkpoint(tmp_path / "same", base_weights, {"origin2": "x"})  # the same bytes, no clash
        assert run_cli(_diff_argv(same, new, tmp_path / "delta"))[0] == 0
    code, _, err = run_cli(["snapshot", "apply", str(base), str(tmp_path / "delta"), "--out", str(tmp_path / "out")])
    assert (code == 0) is accepted, err
    if not accepted:
        assert "tensors named like the shard's __metadata__ entries" in err and not (tmp_path / "out").exists()
        loader = HotLoader(InferenceClient("t" * 16, base_url="http://127.0.0.1:9"), "dep")  # refused before any call
        with pytest.raises(SnapshotError, match="could never apply"):
            loader.publish_diff(new, base, "run-v000002", previous_identity="run-v000001")


# ------------------------------------------------------------------ verify nothing


@pytest.mark.fault_row("verify-nothing")
def test_verify_without_any_checksum_is_not_ok(pair: tuple[Path, Path], tmp_path: Path) -> None:
    old, new = pair
    code, out, err = run_cli(["snapshot", "verify", str(old)])  # a HF checkpoint: no Adler-32 anywhere
    assert code == 1 and json.loads(out)["result"] == "unverified" and json.loads(out)["verified"] == 0
    assert "no Adler-32" in err
    write_delta(old, new, tmp_path / "d", version="2", base_version="1")
    code, out, err = run_cli(["snapshot", "verify", str(tmp_path / "d")])
    assert code == 1 and json.loads(out)["result"] == "unverified" and "--base" in err
    write_delta(old, old, tmp_path / "empty", version="2", base_version="1")
    code, out, err = run_cli(["snapshot", "verify", str(tmp_path / "empty")])
    assert code == 1 and json.loads(out)["tensors"] == 0 and "empty delta" in err
    code, out, err = run_cli(["snapshot", "verify", str(tmp_path / "d"), "--base", str(old)])
    assert code == 0 and json.loads(out) == {
        "path": str(tmp_path / "d"),
        "type": "INCREMENTAL",
        "tensors": 1,
        "verified": 1,
        "unchecked": 0,
        "result": "ok",
    }
    assert os.listdir(tmp_path / "d")
