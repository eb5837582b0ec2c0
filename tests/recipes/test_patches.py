"""The framework patches of the slime and NeMo-RL recipes.

The upstream sources are not vendored, so these tests check what can be checked offline:
each patch is a well-formed unified diff of the files the spec names (hunk line counts
add up), adds what frameworks.md says it must, removes nothing but the lines it replaces,
states the version it was written against, and is shipped to the pod by the recipe.
"""

from __future__ import annotations

import re

import pytest
import yaml
from recipe_files import RECIPES_DIR

PATCHES = {
    "slime": (
        RECIPES_DIR / "slime" / "patches" / "slime-standalone-publish.patch",
        {"slime/backends/megatron_utils/actor.py", "slime/utils/arguments.py"},
        ["--update-weight-standalone-publish", "connect_rollout_engines(", "update_weight_standalone_publish"],
        "624b824",
    ),
    "nemo-rl": (
        RECIPES_DIR.parent
        / "packages/cwtrain-nemo-rl/src/cwtrain/integrations/nemo_rl/nemo-rl-coreweave-backend.patch",
        {"nemo_rl/algorithms/grpo.py"},
        [
            'elif backend == "coreweave":',
            "CoreWeaveGeneration(generation_config, tokenizer)",
            "init_policy()",
            'policy_generation.configure_nemo_gym(env_configs["nemo_gym"])',
        ],
        "v0.7.0",
    ),
}

HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def parse(text: str) -> dict[str, list[str]]:
    """``{file: hunk body lines}``, checking every hunk's line counts."""
    files: dict[str, list[str]] = {}
    lines = text.splitlines()
    i = 0
    current = ""
    while i < len(lines):
        line = lines[i]
        if line.startswith("+++ b/"):
            current = line[len("+++ b/") :]
            files[current] = []
        match = HUNK.match(line)
        if match:
            old = int(match.group(2) or 1)
            new = int(match.group(4) or 1)
            i += 1
            while old > 0 or new > 0:
                body = lines[i]
                kind = body[:1]
                assert kind in (" ", "+", "-"), f"bad hunk line {body!r}"
                old -= kind in (" ", "-")
                new -= kind in (" ", "+")
                files[current].append(body)
                i += 1
            assert old == 0 and new == 0, "hunk line counts do not add up"
            continue
        i += 1
    return files


@pytest.mark.parametrize("recipe", sorted(PATCHES))
def test_patch_is_well_formed_and_does_what_the_spec_says(recipe: str) -> None:
    path, touched, needles, pinned = PATCHES[recipe]
    text = path.read_text(encoding="utf-8")
    header = text.split("diff --git", 1)[0]
    assert pinned in header, "the patch must say which version it was written against"
    assert "git apply --check" in header
    files = parse(text)
    assert set(files) == touched
    added = "\n".join(line[1:] for body in files.values() for line in body if line.startswith("+"))
    for needle in needles:
        assert needle in added, needle
    removed = [line[1:].strip() for body in files.values() for line in body if line.startswith("-")]
    assert len(removed) <= 2, f"the patch should only extend the framework, it removes {removed}"


def test_slime_flag_is_opt_in() -> None:
    path = PATCHES["slime"][0]
    added = "\n".join(line for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("+"))
    assert 'action="store_true"' in added and "default=False" in added
    # without the flag the early return is kept
    assert "and not standalone:" in added


@pytest.mark.parametrize("recipe", sorted(PATCHES))
def test_patch_reaches_the_pod(recipe: str) -> None:
    path = PATCHES[recipe][0]
    launcher = (RECIPES_DIR / recipe / "launch.sh").read_text(encoding="utf-8")
    if recipe == "nemo-rl":  # shipped inside cwtrain-nemo-rl, applied by its version-checking helper
        assert "python -m cwtrain.integrations.nemo_rl.patch --root" in launcher
        return
    kust = yaml.safe_load((RECIPES_DIR / recipe / "kustomization.yaml").read_text(encoding="utf-8"))
    shipped = [f for g in kust["configMapGenerator"] for f in g["files"]]
    assert str(path.relative_to(RECIPES_DIR / recipe)) in shipped
    assert path.name in launcher
    assert 'git -C "$FRAMEWORK_DIR" apply --check "$PATCH"' in launcher


def test_nemo_rl_driver_rebinds_refit_and_setup() -> None:
    text = (RECIPES_DIR / "nemo-rl" / "run_grpo_coreweave.py").read_text(encoding="utf-8")
    # the rebindings live in cwtrain-nemo-rl (tested in tests/nemo_rl); the driver calls them
    assert "from cwtrain.integrations.nemo_rl import DTENSOR_WORKER_FQN, install" in text
    assert 'install(os.environ.get("CWTRAIN_POLICY_WORKER") or DTENSOR_WORKER_FQN)' in text
    config = yaml.safe_load((RECIPES_DIR / "nemo-rl" / "grpo-coreweave.yaml").read_text(encoding="utf-8"))
    generation = config["policy"]["generation"]
    assert generation["backend"] == "coreweave"
    assert generation["colocated"]["enabled"] is True
    assert config["grpo"]["async_grpo"]["enabled"] is False
    assert config["data"]["train"]["dataset_name"] == "DAPOMath17K"
    assert generation["top_k"] is None
