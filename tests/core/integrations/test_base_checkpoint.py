"""The base checkpoint with core alone: ``fetch_base_checkpoint`` and ``cwtrain deployment base-checkpoint``.

Issue 33: only ``cwtrain local base-checkpoint`` could fetch the checkpoint a deployment
serves. Core now reads the deployment's model source (``spec.model``) and copies that prefix;
the local command is the same function with the stack's credentials.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cwtrain.cli import main
from cwtrain.errors import CWTrainError
from cwtrain.infra import Deployment
from cwtrain.integrations.staging import fetch_base_checkpoint, refuse_unless_new


class _API:
    """Answers ``get_deployment`` with one deployment body; counts the calls."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.calls = 0

    def get_deployment(self, deployment_id: str) -> Deployment:
        self.calls += 1
        return Deployment.from_api({"deployment": {"spec": {"id": deployment_id, **self.spec}}})


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, list[str]]:
    capsys.readouterr()
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if captured.out.strip() else None, captured.err.strip().splitlines()


def test_a_directory_in_use_is_refused_before_anything_is_asked(tmp_path: Path) -> None:
    out = tmp_path / "base"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    api = _API({"model": {"name": "m", "bucket": "b", "path": "p"}})
    with pytest.raises(CWTrainError, match=r"base is not empty; name a new or empty directory$"):
        fetch_base_checkpoint("d1", out, api=api)  # type: ignore[arg-type]
    assert api.calls == 0 and (out / "mine.txt").read_text() == "keep"
    afile = tmp_path / "a-file"
    afile.write_text("x")
    with pytest.raises(CWTrainError, match=r"^--out x is not a directory; name a new or empty directory$"):
        refuse_unless_new(afile, "--out x")
    refuse_unless_new(tmp_path / "new")
    (tmp_path / "empty").mkdir()
    refuse_unless_new(tmp_path / "empty")


def test_a_deployment_without_a_model_source_is_one_clear_line(tmp_path: Path) -> None:
    api = _API({"model": {"name": "m"}})
    with pytest.raises(CWTrainError) as caught:
        fetch_base_checkpoint("d1", tmp_path / "base", api=api)  # type: ignore[arg-type]
    assert str(caught.value) == (
        "deployment d1 has no model source (spec.model names no bucket): no base checkpoint to fetch"
    )
    assert not (tmp_path / "base").exists() and not (tmp_path / "base.partial").exists()


def test_the_command_needs_a_deployment_and_a_free_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CWTRAIN_HOTLOAD_DEPLOYMENT_ID", raising=False)
    code, out, err = _run(capsys, "deployment", "base-checkpoint", "--out", str(tmp_path / "base"))
    assert (code, out, err) == (2, None, ["error: no deployment: pass ID or set CWTRAIN_HOTLOAD_DEPLOYMENT_ID"])
    used = tmp_path / "used"
    used.mkdir()
    (used / "x").write_text("x")
    code, out, err = _run(capsys, "deployment", "base-checkpoint", "some-id", "--out", str(used))
    assert (code, out, err) == (1, None, [f"error: --out {used} is not empty; name a new or empty directory"])


@pytest.fixture(scope="module")
def deployed(shared_stack: Any) -> Iterator[tuple[Any, str]]:
    with shared_stack.view("base-checkpoint", replicas=1) as stack:
        yield stack, str(stack.deploy(name="base-ckpt", replicas=1).deployment_id)


def test_the_command_copies_the_served_checkpoint_with_core_alone(
    deployed: tuple[Any, str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from cwtrain.local.engine.model import init_weights, load_checkpoint

    stack, deployment_id = deployed
    for key, value in {**stack.env(), "CWTRAIN_HOTLOAD_DEPLOYMENT_ID": deployment_id}.items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "base"
    out.mkdir()  # an empty directory is taken
    code, doc, _ = _run(capsys, "deployment", "base-checkpoint", "--out", str(out))
    assert code == 0
    assert doc["path"] == str(out) and doc["deployment_id"] == deployment_id
    assert doc["source"].startswith("s3://") and doc["source"].endswith("/") and doc["model"]
    assert doc["files"] == sorted(p.name for p in out.iterdir())
    assert {"config.json", "model.safetensors"} <= set(doc["files"])
    assert not (tmp_path / "base.partial").exists()
    _, weights = load_checkpoint(out)
    expected = init_weights(seed=0)  # the weights the local deployment starts with
    assert weights.keys() == expected.keys() and all(torch.equal(weights[k], expected[k]) for k in expected)
    # the same through the library, by id
    fetched = fetch_base_checkpoint(deployment_id, tmp_path / "again")
    assert fetched.to_json() == {**doc, "path": str(tmp_path / "again")}


def test_cwtrain_rollout_is_the_samplers_public_names() -> None:
    """The short import re-exports every public name of cwtrain.integrations.rollout, the same objects."""
    import cwtrain.integrations.rollout as long
    import cwtrain.rollout as short

    assert sorted(short.__all__) == sorted(long.__all__)
    assert all(getattr(short, name) is getattr(long, name) for name in long.__all__)
