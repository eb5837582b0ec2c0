"""``cwtrain snapshot diff|apply|verify`` in-process: one JSON document out, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from codec_helpers import save_checkpoint

from cwtrain.cli import main
from cwtrain.hotload.files.write import write_full_snapshot


def _weights(shift: float) -> dict[str, np.ndarray]:
    return {"a": np.arange(64, dtype=np.float32) + shift, "b": np.ones((4, 4), np.float16)}


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, object, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def test_diff_apply_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = save_checkpoint(tmp_path / "v1", _weights(0))
    new = save_checkpoint(tmp_path / "v2", _weights(1))
    code, summary, _ = _run(
        capsys,
        "snapshot",
        "diff",
        str(base),
        str(new),
        "--out",
        str(tmp_path / "d"),
        "--version",
        "000002",
        "--base-version",
        "000001",
    )
    assert code == 0 and isinstance(summary, dict)
    assert summary["tensors"] == 2 and summary["tensors_changed"] == 1 and summary["bytes_changed"] == 256
    assert 0 < summary["ratio"] < 1 and summary["seconds"] >= 0 and summary["shards"] == 1

    code, applied, _ = _run(capsys, "snapshot", "apply", str(base), str(tmp_path / "d"), "--out", str(tmp_path / "o"))
    assert code == 0 and applied["version"] == "000002" and applied["tensors_verified"] == 1  # type: ignore[index]
    reference = write_full_snapshot(new, tmp_path / "ref")
    assert (tmp_path / "o" / "model.safetensors").read_bytes() == (reference / "model.safetensors").read_bytes()

    code, verified, _ = _run(capsys, "snapshot", "verify", str(tmp_path / "o"))
    assert code == 0 and verified == {
        "path": str(tmp_path / "o"),
        "type": "FULL",
        "tensors": 2,
        "verified": 2,
        "unchecked": 0,
        "result": "ok",
    }
    code, verified, err = _run(capsys, "snapshot", "verify", str(tmp_path / "d"))  # no Adler-32 without the base
    assert code == 1 and verified["type"] == "INCREMENTAL" and verified["unchecked"] == 1  # type: ignore[index]
    assert verified["result"] == "unverified" and err.count("error:") == 1 and "--base" in err  # type: ignore[index]
    code, verified, _ = _run(capsys, "snapshot", "verify", str(tmp_path / "d"), "--base", str(base))
    assert code == 0 and verified["verified"] == 1  # type: ignore[index]


def test_failures_exit_1_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = save_checkpoint(tmp_path / "v1", _weights(0))
    new = save_checkpoint(tmp_path / "v2", _weights(1))
    _run(
        capsys,
        "snapshot",
        "diff",
        str(base),
        str(new),
        "--out",
        str(tmp_path / "d"),
        "--version",
        "2",
        "--base-version",
        "1",
    )
    code, out, err = _run(capsys, "snapshot", "verify", str(tmp_path / "d"), "--base", str(new))
    assert code == 1 and out is None and "error: " in err and "'a'" in err and "Adler-32" in err
    code, out, err = _run(
        capsys, "snapshot", "apply", str(base), str(tmp_path / "d"), "--out", str(tmp_path / "o"), "--base-version", "7"
    )
    assert code == 1 and "base_version" in err and not (tmp_path / "o").exists()
    full = save_checkpoint(tmp_path / "full", _weights(0))
    write_full_snapshot(full, tmp_path / "cut")
    shard = tmp_path / "cut" / "model.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    code, out, err = _run(capsys, "snapshot", "verify", str(tmp_path / "cut"))
    assert code == 1 and "error: " in err and "'b'" in err


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["snapshot", "diff", "a", "b"]) == 2
    assert (
        main(["snapshot", "diff", "a", "b", "--out", "o", "--version", "1", "--base-version", "0", "--workers", "0"])
        == 2
    )
    capsys.readouterr()


def test_diff_takes_identities_and_publish_finds_the_predecessor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = save_checkpoint(tmp_path / "v1", _weights(0))
    new = save_checkpoint(tmp_path / "v2", _weights(1))
    out = tmp_path / "d"
    argv = ["snapshot", "diff", str(base), str(new), "--out", str(out)]
    code, _, err = _run(capsys, *argv, "--identity", "run-v000002", "--previous-identity", "run-v000001")
    assert code == 0, err
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert (index["metadata"]["version"], index["metadata"]["base_version"]) == ("run-v000002", "run-v000001")
    code, info, _ = _run(capsys, "hotload", "inspect", str(out))  # no --previous-identity needed
    assert code == 0 and info["incremental"]["previous_snapshot_identity"] == "run-v000001"  # type: ignore[index]


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ([], "error: snapshot diff needs --version or --identity and --base-version or --previous-identity\n"),
        (["--identity", "v2"], "error: snapshot diff needs --base-version or --previous-identity\n"),
        (["--version", "2", "--identity", "v2", "--base-version", "1"], "not allowed with argument"),
        (["--base-version", "1", "--previous-identity", "v1", "--version", "2"], "not allowed with argument"),
    ],
)
def test_diff_needs_one_version_of_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str], needle: str
) -> None:
    code, out, err = _run(capsys, "snapshot", "diff", "a", "b", "--out", str(tmp_path / "o"), *options)
    assert code == 2 and out is None and (err == needle if needle.startswith("error:") else needle in err)
    assert not (tmp_path / "o").exists()


def test_diff_help_explains_the_versions(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["snapshot", "diff", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "metadata.version (what the delta makes) and metadata.base_version (what it applies to)" in text
    assert "give the snapshot identities (--identity/--previous-identity) and they are used as both" in text
    assert "all digits N -> weight_vNNNNNN" in text


def test_diff_progress_is_one_final_line_unless_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    base = save_checkpoint(tmp_path / "v1", _weights(0))
    new = save_checkpoint(tmp_path / "v2", _weights(1))
    argv = ["snapshot", "diff", str(base), str(new), "--version", "2", "--base-version", "1"]
    with caplog.at_level("INFO", logger="cwtrain.progress"):
        code, _, err = _run(capsys, *argv, "--out", str(tmp_path / "quiet"))  # stderr is not a terminal here
    assert code == 0 and "diff:" not in err
    logged = [r.getMessage() for r in caplog.records if r.name == "cwtrain.progress"]
    assert len(logged) == 1 and logged[0].startswith("diff: 288 B/288 B (100%)")
    caplog.clear()
    code, _, err = _run(capsys, *argv, "--out", str(tmp_path / "loud"), "--progress")
    drawn = [line for line in err.splitlines() if line.startswith("diff: ")]
    assert code == 0 and drawn and "\r" not in err and not caplog.records
    assert drawn[0] == "diff: 256 B/288 B (89%)"  # tensor "a" done; no rate in the first second
    assert drawn[-1].startswith("diff: 288 B/288 B (100%)")
