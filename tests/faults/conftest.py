"""The fault suite (``-m faults``): one file per group of rows of docs/reliability.md.

The hooks that record which fault rows held (``CWTRAIN_FAULT_RESULTS``) live in
``tests/conftest.py``, so that rows whose tests sit outside this folder
(``kill-publisher``, ``race`` in ``tests/core/store/test_upload_processes.py``) are recorded too.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _silent import Silent


@pytest.fixture
def silent() -> Iterator[Silent]:
    server = Silent()
    yield server
    server.close()
