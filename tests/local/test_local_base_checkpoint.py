"""``cwtrain local base-checkpoint`` is core's ``fetch_base_checkpoint`` with the running stack's credentials.

The stack is the session's shared one; the state file ``local up`` would write is made by
hand, held by a live process whose command line looks like ``cwtrain local`` (as
``tests/local/test_local_cli.py`` does), so the command reads the stack's environment from it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cwtrain.cli import main


def test_local_base_checkpoint_prints_what_it_printed_before(
    shared_stack: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with shared_stack.view("local-base-checkpoint", replicas=1) as stack:
        deployment_id = str(stack.deploy(name="local-base", replicas=1).deployment_id)
        holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "cwtrain", "local"])
        try:
            state_file = tmp_path / "stack.json"
            env = {**stack.env(), "CWTRAIN_HOTLOAD_DEPLOYMENT_ID": deployment_id}
            state_file.write_text(json.dumps({"pid": holder.pid, "env": env, "deployment_id": deployment_id}))
            out = tmp_path / "base"
            capsys.readouterr()
            code = main(["local", "base-checkpoint", "--out", str(out), "--state-file", str(state_file)])
            doc = json.loads(capsys.readouterr().out)
        finally:
            holder.kill()
            holder.wait()
    assert code == 0
    assert sorted(doc) == ["deployment_id", "files", "model", "path", "source"]
    assert doc["path"] == str(out) and doc["deployment_id"] == deployment_id
    assert doc["files"] == ["config.json", "model.safetensors", "model.safetensors.index.json", "tokenizer_config.json"]
    assert doc["files"] == sorted(p.name for p in out.iterdir())
    assert doc["source"].startswith("s3://") and doc["source"].endswith("/") and doc["model"] == "cwtrain-tiny"
