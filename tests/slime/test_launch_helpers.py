"""``python -m cwtrain.integrations.launch stage-model`` and the recipe launchers' helpers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cwtrain.errors import CWTrainError
from cwtrain.integrations.envforward import forwarded_env, is_secret_env_var, redacted_env
from cwtrain.integrations.launch import main
from cwtrain.integrations.patches import apply_patches
from cwtrain.integrations.staging import parse_s3_uri, stage_from_s3


def _put(s3: Any, bucket: str, files: dict[str, bytes]) -> None:
    for key, data in files.items():
        s3.put_object(Bucket=bucket, Key=key, Body=data)


def test_stage_model_copies_direct_objects_once(
    s3_bucket: tuple[Any, str], s3_env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s3, bucket = s3_bucket
    _put(
        s3,
        bucket,
        {
            "models/tiny/config.json": b'{"a": 1}',
            "models/tiny/model.safetensors": b"x" * 70_000,
            "models/tiny/extra/ignored.bin": b"deeper objects are not copied",
            "models/tiny-other/config.json": b"another prefix",
        },
    )
    dest = tmp_path / "hf" / "base"
    assert main(["stage-model", f"s3://{bucket}/models/tiny/", str(dest), "--workers", "2"]) == 0
    assert sorted(p.name for p in dest.iterdir()) == ["config.json", "model.safetensors"]
    assert (dest / "model.safetensors").read_bytes() == b"x" * 70_000
    assert not (tmp_path / "hf" / "base.partial").exists()
    assert capsys.readouterr().out.strip() == str(dest)
    # a second run finds config.json and copies nothing, even when the bucket changed
    _put(s3, bucket, {"models/tiny/config.json": b'{"a": 2}'})
    assert stage_from_s3(f"s3://{bucket}/models/tiny", dest) == dest
    assert (dest / "config.json").read_bytes() == b'{"a": 1}'


def test_stage_model_errors_exit_one_with_one_line(
    s3_bucket: tuple[Any, str], s3_env: dict[str, str], tmp_path: Path
) -> None:
    s3, bucket = s3_bucket
    _put(s3, bucket, {"weights/only/model.safetensors": b"x"})
    for uri, reason in (
        (f"s3://{bucket}/nothing-here", "no objects"),
        (f"s3://{bucket}/weights/only", "has no config.json"),
    ):
        result = subprocess.run(
            [sys.executable, "-m", "cwtrain.integrations.launch", "stage-model", uri, str(tmp_path / "dest")],
            capture_output=True,
            text=True,
            env=s3_env,
        )
        assert result.returncode == 1, result.stderr
        assert result.stderr.strip().splitlines()[-1].startswith("error: ") and reason in result.stderr
        assert "Traceback" not in result.stderr
    assert not (tmp_path / "dest").exists()


def test_parse_s3_uri() -> None:
    assert parse_s3_uri("s3://b/a/b/") == ("b", "a/b/")
    assert parse_s3_uri("s3://b") == ("b", "")
    with pytest.raises(CWTrainError, match="s3://"):
        parse_s3_uri("/local/path")
    with pytest.raises(CWTrainError, match="bucket"):
        parse_s3_uri("s3:///x")


def test_forwarded_env_and_secrets() -> None:
    env = {
        "CWTRAIN_HOTLOAD_DEPLOYMENT_ID": "d",
        "COREWEAVE_API_TOKEN": "tok",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_ACCESS_KEY_ID": "k",
        "HF_TOKEN": "h",
        "CW_S3_ENDPOINT": "http://cwlota.com",
        "PATH": "/bin",
        "CWTRAIN_EMPTY": "",
        "MY_VAR": "1",
    }
    forwarded = forwarded_env(env, extra=["MY_VAR"])
    assert set(forwarded) == set(env) - {"PATH", "CWTRAIN_EMPTY"}
    for name in (
        "COREWEAVE_API_TOKEN",
        "CWTRAIN_API_HEADERS",
        "AWS_SECRET_ACCESS_KEY",
        "HF_TOKEN",
        "CWTRAIN_ROLLOUT_API_KEY",
    ):
        assert is_secret_env_var(name), name
    for name in ("CWTRAIN_HOTLOAD_DEPLOYMENT_ID", "CW_S3_ENDPOINT", "AWS_REGION", "PATH"):
        assert not is_secret_env_var(name), name
    shown = redacted_env(env)
    assert shown["COREWEAVE_API_TOKEN"] == "***" and shown["CWTRAIN_HOTLOAD_DEPLOYMENT_ID"] == "d"


def test_apply_patches_once(tmp_path: Path) -> None:
    repo = tmp_path / "framework"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "train.py").write_text("a = 1\n")
    subprocess.run([*git, "add", "train.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    patch = tmp_path / "standalone.patch"
    patch.write_text(
        "--- a/train.py\n+++ b/train.py\n@@ -1 +1,2 @@\n a = 1\n+b = 2\n",
    )
    assert apply_patches(repo, [patch]) == ["standalone.patch"]
    assert (repo / "train.py").read_text() == "a = 1\nb = 2\n"
    assert apply_patches(repo, [patch]) == []  # already in: skipped
    (repo / "train.py").write_text("something else\n")
    with pytest.raises(CWTrainError, match="does not apply"):
        apply_patches(repo, [patch])
    with pytest.raises(CWTrainError, match="not a git checkout"):
        apply_patches(tmp_path, [patch])
