"""NeMo-RL stand-ins on sys.path for every test in this folder."""

from __future__ import annotations

import sys
from pathlib import Path

STANDIN = str(Path(__file__).resolve().parent / "standin")
if STANDIN not in sys.path:
    sys.path.insert(0, STANDIN)
