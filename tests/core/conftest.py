"""The core tests, one folder per wing of cwtrain-core (docs/internals.md), and their shared helpers.

The helpers stay here, beside the folders: ``fakeapi`` (the in-memory API stand-in),
``codec_helpers``, ``_upload_util`` and ``rollout_fake``. Tests import them as top-level
modules, so this folder goes on ``sys.path`` for every test below it (pytest puts only a test
file's own folder there). Other suites (tests/slime, tests/nemo_rl, tests/faults) and the
mypy run of scripts/test.sh find them at ``tests/core`` too.
"""

from __future__ import annotations

import sys
from pathlib import Path

HELPERS = str(Path(__file__).resolve().parent)
if HELPERS not in sys.path:
    sys.path.insert(0, HELPERS)
