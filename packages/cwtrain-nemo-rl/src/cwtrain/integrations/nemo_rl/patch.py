"""Apply the small GRPO patch that makes NeMo-RL v0.7.0 accept ``backend: coreweave``.

NeMo-RL's ``setup`` dispatches on ``policy.generation.backend`` with no ``else``, so an
unknown backend dies on an unbound name, and ``_should_use_nemo_gym`` insists on async
rollouts. The patch (``nemo-rl-coreweave-backend.patch``, shipped in this package) adds a
``coreweave`` branch building the policy through ``policy_factory`` and
:class:`~cwtrain.integrations.nemo_rl.generation.CoreWeaveGeneration`, an ``else`` that
names an unknown backend, and lets NeMo Gym run with this backend.

::

    python -m cwtrain.integrations.nemo_rl.patch            # apply to the installed nemo_rl
    python -m cwtrain.integrations.nemo_rl.patch --check    # only check that it applies

Refuses any NeMo-RL other than :data:`NEMO_RL_VERSION` (the patch is written against its
source); applying twice is a no-op. Uses ``git apply`` (plain file patching; the install
need not be a git checkout).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from cwtrain.errors import CWTrainError
from cwtrain.integrations.frameworks import installed_version, require
from cwtrain.integrations.nemo_rl.framework import NEMO_RL

__all__ = ["NEMO_RL_VERSION", "PATCH_NAME", "apply_patch", "main", "patch_text"]

NEMO_RL_VERSION = "0.7.0"
PATCH_NAME = "nemo-rl-coreweave-backend.patch"
_MARKER = 'backend == "coreweave"'


def patch_text() -> str:
    """The patch, from this package's data."""
    return resources.files(__package__).joinpath(PATCH_NAME).read_text()


def apply_patch(root: str | Path | None = None, *, check_only: bool = False, installed: str | None = None) -> str:
    """Apply (or check) the patch; returns ``"applied"``, ``"already applied"`` or ``"applies"``.

    Args:
        root: the directory holding ``nemo_rl/`` (default: where ``nemo_rl`` is imported from).
        check_only: only check that it applies.
        installed: the NeMo-RL version (default:
            :func:`cwtrain.integrations.frameworks.installed_version`).

    Raises:
        CWTrainError: NeMo-RL is missing or not v0.7.0, or the patch does not apply.
    """
    found = installed if installed is not None else installed_version(NEMO_RL)
    if found is None:
        raise CWTrainError(
            f"NeMo-RL is not installed in this environment: the patch is for nemo_rl v{NEMO_RL_VERSION} "
            f"({NEMO_RL.where}); run it with the Python that has NeMo-RL (the recipe's image), where the "
            "plug-in is installed too"
        )
    if found.split("+")[0] != NEMO_RL_VERSION:
        raise CWTrainError(
            f"NeMo-RL {found} is installed; the coreweave patch is written for v{NEMO_RL_VERSION} only "
            "(use the recipe's image, or port the patch)"
        )
    if root is None:
        root = Path(str(require(NEMO_RL).__file__)).resolve().parent.parent
    root = Path(root)
    grpo = root / "nemo_rl" / "algorithms" / "grpo.py"
    if not grpo.is_file():
        raise CWTrainError(f"{grpo} not found: pass the directory that holds nemo_rl/")
    if _MARKER in grpo.read_text():
        return "already applied"
    text = patch_text()
    check = subprocess.run(["git", "apply", "--check", "-"], input=text, text=True, cwd=root, capture_output=True)
    if check.returncode != 0:
        raise CWTrainError(f"the coreweave patch does not apply to {grpo}: {check.stderr.strip()}")
    if check_only:
        return "applies"
    done = subprocess.run(["git", "apply", "-"], input=text, text=True, cwd=root, capture_output=True)
    if done.returncode != 0:
        raise CWTrainError(f"applying the coreweave patch to {grpo} failed: {done.stderr.strip()}")
    return "applied"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cwtrain.integrations.nemo_rl.patch [--check] [--root DIR]``."""
    parser = argparse.ArgumentParser(
        prog="python -m cwtrain.integrations.nemo_rl.patch", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--check", action="store_true", help="only check that the patch applies")
    parser.add_argument("--root", help="directory holding nemo_rl/ (default: the installed package)")
    args = parser.parse_args(argv)
    try:
        print(apply_patch(args.root, check_only=args.check))
    except CWTrainError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
