"""Shared fixtures, each started once per session: a moto S3 server, a local stack, Ray.

* ``s3_server`` / ``s3_bucket`` / ``s3_env``: moto on loopback, a fresh bucket per test.
* ``shared_stack``: one :class:`cwtrain.local.LocalStack` (real engine replicas) for every
  module that needs *a* stack. A module takes its own view of it::

      @pytest.fixture(scope="module")
      def stack(shared_stack: SharedStack) -> Iterator[LocalStack]:
          with shared_stack.view("faults-api", replicas=2) as local:
              yield local

  The view is a ``LocalStack`` with the same control plane, object store, gateways,
  supervisor and fault hooks, but its own fresh bucket (so identities, prefixes and base
  paths never meet another module's) and its own default replica count. Leaving it disarms
  the faults still armed (API and replica faults) and deletes every deployment and gateway created meanwhile;
  entering the next view waits until they are gone (replicas stopped, while the tests in
  between ran) and clears the record of fired faults, so every module starts on an empty
  stack as it would on a fresh one. Modules that need a
  stack of their own still boot one: a different replica command or admin token, a check of
  everything the stack holds (``/hotLoads`` unfiltered), or ``LocalStack``'s own start/stop.
* ``ray_session``: one local Ray for the session (``ray.init`` takes seconds); its workers
  see the shared stack's endpoints and credentials and the test stand-ins on ``PYTHONPATH``.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_gpu = bool(torch.cuda.is_available())
    except ImportError:
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[Any]:
    """moto's S3 server in a child process on 127.0.0.1 (cwtrain.local.harness.objectstore)."""
    from cwtrain.local.harness.objectstore import MotoS3Server

    with MotoS3Server() as server:
        yield server


@pytest.fixture
def s3_bucket(s3_server: Any) -> tuple[Any, str]:
    """A fresh, empty bucket on the session's S3 server: ``(client, bucket_name)``."""
    from cwtrain.local.harness.objectstore import DEFAULT_REGION

    client = s3_server.client()
    name = f"test-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": DEFAULT_REGION})
    return client, name


@pytest.fixture
def s3_env(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Environment variables pointing boto3 and cwtrain at the session's S3 server."""
    for key, value in s3_server.credentials.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return dict(os.environ)


# ------------------------------------------------------------ one local stack, one Ray


class SharedStack:
    """The session's :class:`~cwtrain.local.LocalStack` and the per-module views of it."""

    def __init__(self, stack: Any) -> None:
        self.stack = stack
        # what the last view left: deployments being deleted, gateways to delete after them
        self._leftovers: tuple[list[str], list[str]] = ([], [])

    @contextlib.contextmanager
    def view(self, label: str, *, replicas: int = 2) -> Iterator[Any]:
        """The stack with its own fresh bucket and ``replicas``; cleaned up on exit (see the module doc)."""
        self.settle()
        stack = self.stack
        state = stack.state
        assert state is not None
        stack.faults.api.clear()
        stack.faults.api.fired.clear()
        stack.faults.replicas.clear()
        with state.lock:
            gateways, deployments = set(state.gateways), set(state.deployments)
            hot_load_enabled = state.hot_load_enabled
        bucket = f"{re.sub(r'[^a-z0-9-]', '-', label.lower())[:40]}-{uuid.uuid4().hex[:10]}"
        stack.s3_client().create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": stack.region})
        # A shallow copy shares every running component (they are attributes holding the same
        # objects); only the plain values set here differ. The session owns start and stop.
        view = copy.copy(stack)
        view.bucket, view.replicas = bucket, replicas
        view.start = lambda: view
        view.stop = lambda: None
        try:
            yield view
        finally:
            stack.faults.api.clear()
            stack.faults.replicas.clear()
            proxy = stack.faults.s3
            if proxy is not None:  # S3Proxy has no public disarm: drop cuts a failed test left armed
                with proxy._lock:
                    proxy._cuts.clear()
            with state.lock:
                state.hot_load_enabled = hot_load_enabled
                new_deployments = sorted(set(state.deployments) - deployments)
                new_gateways = sorted(set(state.gateways) - gateways)
            self._delete("deployment", new_deployments)
            self._leftovers = (new_deployments, new_gateways)

    def settle(self, timeout: float = 120.0) -> None:
        """Finish the last view's clean-up: its deployments gone (replicas stopped), then its gateways."""
        deployments, gateways = self._leftovers
        self._leftovers = ([], [])
        self._wait_gone("deployment", deployments, timeout)
        self._delete("gateway", gateways)  # refused while a deployment is attached
        self._wait_gone("gateway", gateways, timeout)

    def _delete(self, kind: str, ids: list[str]) -> None:
        for resource_id in ids:
            status, payload = self.stack.api("DELETE", f"/{kind}s/{resource_id}")
            assert status in (200, 404), (kind, resource_id, status, payload)

    def _wait_gone(self, kind: str, ids: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for resource_id in ids:
            while self.stack.api("GET", f"/{kind}s/{resource_id}")[0] != 404:
                assert time.monotonic() < deadline, f"{kind} {resource_id} was not deleted within {timeout:g} s"
                time.sleep(0.05)


@pytest.fixture(scope="session")
def shared_stack() -> Iterator[SharedStack]:
    """One local stack with real engine replicas for the whole session; modules take views of it."""
    from cwtrain.local import LocalStack

    with LocalStack(replicas=2) as stack:
        yield SharedStack(stack)


@pytest.fixture(scope="session")
def ray_session(shared_stack: SharedStack) -> Iterator[Any]:
    """Ray, started once: 2 CPUs, no dashboard; workers get the shared stack's environment.

    Workers do not see variables a test sets later, so they get the shared stack's endpoints
    and credentials from the start (``CWTRAIN_LOCAL_BUCKET`` differs per module and is left
    out), and ``PYTHONPATH`` with the NeMo-RL stand-ins and the repository root.
    """
    ray = pytest.importorskip("ray")
    env = {k: v for k, v in shared_stack.stack.env().items() if k != "CWTRAIN_LOCAL_BUCKET"}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(TESTS / "nemo_rl" / "standin"), str(TESTS.parent), os.environ.get("PYTHONPATH", "")]
    )
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env})
    try:
        yield ray
    finally:
        ray.shutdown()


# ------------------------------------------------ fault matrix (docs/reliability.md)
# Each test marked ``fault_row("<id>")`` is counted per row and outcome; with
# CWTRAIN_FAULT_RESULTS=path the counts are written there as JSON at the end of the session
# ({"<row>": {"passed": n, "failed": m, ...}}), which scripts/reliability_table.py reads.
# Deselected items are remembered so that tests/faults/test_reliability_doc.py can count
# every test of a row also when ``-m``/``-k`` left some out.

_FAULT_RESULTS: dict[tuple[str, str], int] = {}
DESELECTED = pytest.StashKey[list[pytest.Item]]()


def pytest_deselected(items: list[pytest.Item]) -> None:
    if items:
        items[0].config.stash.setdefault(DESELECTED, []).extend(items)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    outcome = yield
    marker = item.get_closest_marker("fault_row")
    if marker is not None:
        outcome.get_result().fault_row = marker.args[0]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    row = getattr(report, "fault_row", None)
    if row and (report.when == "call" or report.outcome != "passed"):
        key = (row, report.outcome)
        _FAULT_RESULTS[key] = _FAULT_RESULTS.get(key, 0) + 1


_SESSION_START: list[float] = []


def pytest_sessionstart(session: pytest.Session) -> None:
    import time

    _SESSION_START.append(time.monotonic())


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = os.environ.get("CWTRAIN_FAULT_RESULTS")
    if target and _FAULT_RESULTS:
        import json
        import time
        from pathlib import Path

        rows: dict[str, Any] = {}
        for (row, outcome), count in sorted(_FAULT_RESULTS.items()):
            rows.setdefault(row, {})[outcome] = count
        if _SESSION_START:  # not a row: the session's wall time
            rows["_session"] = {"seconds": round(time.monotonic() - _SESSION_START[0], 1)}
        Path(target).write_text(json.dumps(rows, indent=2, sort_keys=True) + "\n")
