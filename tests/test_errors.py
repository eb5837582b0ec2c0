"""Every error class pickles with its fields; API codes map to the right classes."""

from __future__ import annotations

import inspect
import pickle
from typing import Any

import pytest

import cwtrain.errors as errors
from cwtrain.errors import CWTrainError


def _all_subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found.add(sub)
        found |= _all_subclasses(sub)
    return found


def _sample_args(cls: type[BaseException]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    params = [
        p
        for p in inspect.signature(cls.__init__).parameters.values()
        if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    samples: dict[str, Any] = {
        "code": "failed_precondition",
        "message": "hot-load already in progress",
        "http_status": 400,
        "details": [{"@type": "x"}],
        "identity": "run-v000001",
        "conflicts": ["a (not part of this snapshot)", "b", "c", "d"],
        "uri": "s3://bucket/hotload/",
        "action": "s3:PutObject",
        "upload_id": "up-1",
        "hot_load": {"id": "hl"},
        "replicas": [],
        "problems": ["r0 serves initial"],
        "timeout": 12.5,
    }
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for p in params:
        value = samples.get(p.name, f"<{p.name}>")
        if p.kind == p.KEYWORD_ONLY:
            kwargs[p.name] = value
        else:
            args.append(value)
    return tuple(args), kwargs


def test_error_tree_has_the_documented_branches() -> None:
    names = {cls.__name__ for cls in _all_subclasses(CWTrainError)}
    for required in (
        "APIError", "InvalidArgumentError", "NotFoundError", "AlreadyExistsError", "PermissionDeniedError",
        "UnauthenticatedError", "UnavailableError", "UnimplementedError", "FailedPreconditionError",
        "HotLoadInProgressError", "TransportError", "LifecycleError", "SnapshotError", "SnapshotConflictError",
        "SnapshotAccessError", "SnapshotChecksumError", "HotLoadFailedError", "HotLoadVerificationError",
        "HotLoadTimeoutError", "MirrorError", "RolloutError", "ConfigError", "UsageError",
    ):  # fmt: skip
        assert required in names
    assert issubclass(errors.HotLoadInProgressError, errors.FailedPreconditionError)
    assert issubclass(errors.UsageError, ValueError) and issubclass(errors.SnapshotNotFoundError, FileNotFoundError)
    assert issubclass(errors.ConfigError, ValueError)
    # "the transport failed" is a branch of its own, apart from "the server said no"
    assert errors.TransportError.__bases__ == (CWTrainError,)
    assert not issubclass(errors.TransportError, errors.APIError)


def test_the_docstring_draws_the_tree_as_it_is() -> None:
    doc = errors.__doc__ or ""
    tree = [line for line in doc.splitlines() if ("├──" in line or "└──" in line) and "Error" in line]
    depth_of = {}
    for line in tree:
        marker = line.index("── ")
        name = line[marker + 3 :].split()[0]
        depth_of[name] = marker
        parents = [n for n, d in depth_of.items() if d < marker]
        cls = getattr(errors, name)
        expected_parent = parents[-1] if parents else "CWTrainError"
        assert getattr(errors, expected_parent) in cls.__mro__[1:], (name, expected_parent)


@pytest.mark.parametrize("cls", sorted(_all_subclasses(CWTrainError) | {CWTrainError}, key=lambda c: c.__name__))
def test_every_error_survives_pickle_with_its_fields(cls: type[CWTrainError]) -> None:
    args, kwargs = _sample_args(cls)
    original = cls(*args, **kwargs)
    copy = pickle.loads(pickle.dumps(original))
    assert type(copy) is cls
    assert str(copy) == str(original)
    assert copy.args == original.args
    assert copy.__dict__ == original.__dict__


@pytest.mark.parametrize(
    ("code", "message", "expected"),
    [
        ("not_found", "no such deployment", errors.NotFoundError),
        ("failed_precondition", "a hot-load is already in progress", errors.HotLoadInProgressError),
        ("failed_precondition", "deployment not ready", errors.FailedPreconditionError),
        ("unavailable", "try again", errors.UnavailableError),
        ("data_loss", "?", errors.APIError),
    ],
)
def test_api_error_maps_codes(code: str, message: str, expected: type[errors.APIError]) -> None:
    err = errors.api_error(code, message, http_status=400)
    assert type(err) is expected
    assert str(err) == f"{code}: {message}"
    assert err.code == code and err.http_status == 400


def test_conflict_error_shows_three_and_counts_the_rest() -> None:
    err = errors.SnapshotConflictError("run-v000002", ["a", "b", "c", "d", "e"])
    assert "a; b; c; and 2 more" in str(err)
    assert err.conflicts == ["a", "b", "c", "d", "e"] and err.identity == "run-v000002"


def test_transient_flags() -> None:
    assert errors.api_error("unavailable", "x").transient
    transport = errors.TransportError("connection refused", http_status=200)
    assert transport.transient and transport.http_status == 200
    assert str(transport) == "unavailable: connection refused"
    assert not errors.api_error("unimplemented", "x", http_status=501).transient
    assert not errors.api_error("invalid_argument", "x", http_status=400).transient
