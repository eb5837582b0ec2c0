"""Applying a recipe's patches to a framework checkout, once.

Recipe launchers patch the framework they run (slime's standalone-publish patch, for
example) before training; running the launcher again must not fail on a patch that is
already in::

    from cwtrain.integrations.patches import apply_patches

    applied = apply_patches("/opt/slime", ["/opt/cwtrain/patches/slime-standalone-publish.patch"])

A patch that applies is applied (``git apply``); one whose reverse applies cleanly is
already in and skipped; one that applies neither way is an error naming the patch and the
checkout (the checkout is not the version the patch was written for).
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from cwtrain.errors import CWTrainError, UsageError

__all__ = ["apply_patches"]

log = logging.getLogger(__name__)


def apply_patches(checkout: str | os.PathLike[str], patches: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Apply each patch to a git checkout once; returns the names of the patches applied now.

    A patch whose reverse applies cleanly is already in and skipped; a patch that applies
    neither way raises, naming it and the checkout.

    Raises:
        UsageError: ``checkout`` is not a git checkout, or a patch file does not exist.
        CWTrainError: a patch does not apply.
    """
    root = Path(checkout)
    if not (root / ".git").exists():
        raise UsageError(f"{root} is not a git checkout: clone the framework first")
    applied: list[str] = []
    for patch in patches:
        path = Path(patch).resolve()
        if not path.is_file():
            raise UsageError(f"patch {path} does not exist")

        def git(*args: str, patch_path: Path = path) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                ["git", "-C", str(root), "apply", *args, str(patch_path)], capture_output=True, text=True, check=False
            )

        if git("--check").returncode == 0:
            result = git()
            if result.returncode != 0:
                raise CWTrainError(f"applying {path.name} to {root} failed: {result.stderr.strip()}")
            applied.append(path.name)
        elif git("--reverse", "--check").returncode == 0:
            log.info("%s is already applied to %s", path.name, root)
        else:
            detail = git("--check").stderr.strip().splitlines()
            raise CWTrainError(
                f"{path.name} does not apply to {root} ({detail[0] if detail else 'no detail'}): "
                "the checkout is not the version the patch was written for"
            )
    return applied
