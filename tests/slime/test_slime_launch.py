"""``python -m cwtrain.integrations.slime.launch`` runs slime's script with the actor injected."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TRAIN_PY = """
import json, sys
from slime.ray.placement_group import create_training_models

actor, critic = create_training_models(__import__("argparse").Namespace(), {}, None)
json.dump({"argv": sys.argv[1:], "actor": type(actor).__name__, "name": __name__,
           "bases": [b.__name__ for b in type(actor).__mro__]}, open(OUT, "w"))
"""


def test_launch_runs_the_script_with_the_publishing_actor(slime_stubs: Path, tmp_path: Path) -> None:
    from cwtrain.integrations.slime.launch import main

    out = tmp_path / "out.json"
    script = tmp_path / "train.py"
    script.write_text(f"OUT = {str(out)!r}\n" + TRAIN_PY)
    assert main([str(script), "--hf-checkpoint", "/m", "--rollout-num-gpus", "0"]) == 0
    seen = json.loads(out.read_text())
    assert seen["argv"] == ["--hf-checkpoint", "/m", "--rollout-num-gpus", "0"]
    assert seen["name"] == "__main__"
    assert seen["actor"] == "CoreWeaveTrainRayActor" and "MegatronTrainRayActor" in seen["bases"]


def test_an_explicit_actor_cls_still_wins(slime_stubs: Path) -> None:
    from slime.backends.megatron_utils.actor import MegatronTrainRayActor

    from cwtrain.integrations.slime.launch import inject_actor_cls

    class Mine(MegatronTrainRayActor):
        pass

    inject_actor_cls()
    import slime.ray.placement_group as placement

    actor, _ = placement.create_training_models(__import__("argparse").Namespace(), {}, None, actor_cls=Mine)
    assert type(actor) is Mine


def test_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cwtrain.integrations.slime.launch import main

    assert main([]) == 2
    assert main([str(tmp_path / "missing.py")]) == 2
    assert "train.py" in capsys.readouterr().err
    with pytest.raises(ImportError, match=r"pip install \./packages/cwtrain-slime"):
        main([__file__])


def test_the_actor_names_missing_configuration(slime_stubs: Path, tmp_path: Path) -> None:
    import argparse

    from slime.backends.megatron_utils.actor import MegatronTrainRayActor

    from cwtrain.errors import CWTrainError
    from cwtrain.integrations.slime import make_actor_cls

    actor = make_actor_cls(MegatronTrainRayActor)(1, 0, None, None)
    actor.init(argparse.Namespace(update_weight_disk_dir=str(tmp_path / "w")), "actor")
    with pytest.raises(CWTrainError, match="CWTRAIN_HOTLOAD_DEPLOYMENT_ID"):
        actor.update_weights()
    actor.args.debug_train_only = True
    assert actor.update_weights() is None  # slime's debug modes publish nothing
