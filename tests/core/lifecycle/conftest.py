"""The lifecycle tests' API stand-in: one gateway and one hot-load deployment whose bucket is the session's moto bucket."""

from __future__ import annotations

from typing import Any

import pytest
from fakeapi import FakeAPI


@pytest.fixture
def fake(s3_bucket: tuple[Any, str]) -> FakeAPI:
    """``dep-1`` on a gateway, hot-loading from the test's bucket."""
    api = FakeAPI()
    api.add_gateway()
    api.add_deployment()
    api.deployments["dep-1"]["spec"]["hotLoad"]["bucket"] = s3_bucket[1]
    return api
