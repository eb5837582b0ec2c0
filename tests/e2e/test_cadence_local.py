"""The chain cadence's rules on the local stack (issue 25): every cut taken for its reason.

Each rule (share of a FULL, replay budget, count bound, 63-delta limit) is run twice against
real engine replicas of :class:`~cwtrain.local.LocalStack`: through core's publish session
over a :class:`~cwtrain.hotload.HotLoader` (in-memory tensors, ``publish_tensors``) and
through one integration, miles' post-save hook (``PostSavePublisher``: each HF export as a
delta over the previous one, ``publish_diff``, or the export's directory when the cadence
cuts). The weights are the local engine's tiny model (22 BF16 tensors, 214 KiB); every
version is hot-loaded, served by the replica and verified before the next.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from cwtrain.hotload import HotLoader, HotLoadSettings, PublishOutcome, PublishSession
from cwtrain.hotload.lifecycle.cadence import CutReason
from cwtrain.infra import InferenceClient
from cwtrain.local import LocalStack
from cwtrain.local.engine.model import ModelConfig, init_weights, weights_to_safetensors, write_base_checkpoint

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

Weights = dict[str, torch.Tensor]
Step = Callable[[Weights, np.random.Generator], Weights]


def _moved(weights: Weights, rng: np.random.Generator, fraction: float, ulps: int) -> Weights:
    """``fraction`` of every tensor's values moved by 1..``ulps`` BF16 ulps."""
    out = {}
    for name, tensor in weights.items():
        bits = tensor.view(torch.int16).numpy().copy()
        flat = bits.reshape(-1)
        count = max(1, round(flat.size * fraction))
        index = rng.choice(flat.size, count, replace=False)
        moves = rng.integers(1, ulps + 1, count) * rng.choice(np.array([-1, 1]), count)
        flat[index] = (flat[index].astype(np.int32) + moves).astype(np.int16)
        out[name] = torch.from_numpy(bits).view(torch.bfloat16)
    return out


def sparse(weights: Weights, rng: np.random.Generator) -> Weights:
    return _moved(weights, rng, 0.005, 2)


def half(weights: Weights, rng: np.random.Generator) -> Weights:
    """60 % of the values moved by up to 64 ulps: a delta of about half a FULL."""
    return _moved(weights, rng, 0.6, 64)


def scrambled(weights: Weights, rng: np.random.Generator) -> Weights:
    """Every value new and finite, sign, exponent and mantissa random: an XOR that does not compress."""
    out = {}
    for name, tensor in weights.items():
        sign = rng.integers(0, 2, tensor.numel()) << 15
        exponent = rng.integers(1, 255, tensor.numel()) << 7
        mantissa = rng.integers(0, 128, tensor.numel())
        bits = (sign | exponent | mantissa).astype(np.uint16).view(np.int16).reshape(tuple(tensor.shape))
        out[name] = torch.from_numpy(bits.copy()).view(torch.bfloat16)
    return out


#: rule -> (settings, the steps after the baseline, the version its cut is expected at (None: the first cut))
RULES: dict[str, tuple[dict[str, Any], list[Step], CutReason, int | None]] = {
    "share": ({}, [sparse, scrambled, sparse], CutReason.SHARE, 2),
    "replay": ({}, [half] * 6, CutReason.REPLAY, None),
    "count": ({}, [sparse] * 21, CutReason.COUNT, 20),
    "chain_limit": ({"full_every": 0}, [sparse] * 65, CutReason.CHAIN_LIMIT, 64),
}


@pytest.fixture(scope="module")
def stack(shared_stack: Any) -> Iterator[LocalStack]:
    with shared_stack.view("cadence", replicas=1) as local:
        yield local


@pytest.fixture(scope="module")
def loader(stack: LocalStack) -> Iterator[HotLoader]:
    target = stack.deploy(name="cadence", replicas=1, seed=0)
    client = InferenceClient(stack.token, base_url=stack.api_url)
    yield HotLoader(client, target.deployment_id, s3=stack.s3_client(), timeout=120, poll_interval=0.05)
    client.close()


def _settings(loader: HotLoader, run_id: str, tmp_path: Path, **overrides: Any) -> HotLoadSettings:
    return HotLoadSettings(
        loader.deployment_id, run_id, verify=True, timeout=120.0, state_dir=str(tmp_path / "state"), **overrides
    )


def _through_session(
    loader: HotLoader, run_id: str, tmp_path: Path, settings: dict[str, Any], steps: list[Step]
) -> list[PublishOutcome]:
    outcomes: list[PublishOutcome] = []
    session = PublishSession(
        _settings(loader, run_id, tmp_path, **settings), target=loader.target, sink=outcomes.append
    )
    files = {"config.json": json.dumps(ModelConfig().to_json()).encode()}
    rng = np.random.default_rng(0)
    served = init_weights(seed=0)
    session.publish_tensors(session.begin(), served, extra_files=files)
    for step in steps:
        new = step(served, rng)
        session.publish_tensors(session.begin(), new, base=served, extra_files=files)
        served = new
    return outcomes


def _through_miles(
    loader: HotLoader, run_id: str, tmp_path: Path, settings: dict[str, Any], steps: list[Step]
) -> list[PublishOutcome]:
    from cwtrain.integrations.miles.post_save import COMPLETE_MARKER, PostSavePublisher

    outcomes: list[PublishOutcome] = []
    publisher = PostSavePublisher(_settings(loader, run_id, tmp_path, **settings), loader)
    publisher.session.sink = outcomes.append
    base = tmp_path / "hf"
    write_base_checkpoint(base, seed=0)
    args = argparse.Namespace(hf_checkpoint=str(base))
    config = (base / "config.json").read_bytes()
    rng = np.random.default_rng(0)
    served = init_weights(seed=0)
    for rollout_id, step in enumerate(steps):
        served = step(served, rng)
        export = tmp_path / "exports" / f"iter_{rollout_id:07d}"
        export.mkdir(parents=True)
        (export / "model.safetensors").write_bytes(weights_to_safetensors(served, {"format": "pt"}))
        (export / "config.json").write_bytes(config)
        (export / COMPLETE_MARKER).write_text("")
        publisher.publish(args, rollout_id, str(export))  # version rollout_id + 1
    return outcomes


@pytest.mark.parametrize("through", ["session", "miles"])
@pytest.mark.parametrize("rule", sorted(RULES))
def test_each_cut_is_taken_for_its_reason(rule: str, through: str, loader: HotLoader, tmp_path: Path) -> None:
    settings, steps, reason, version = RULES[rule]
    publish = _through_session if through == "session" else _through_miles
    outcomes = publish(loader, f"{rule.replace('_', '-')}-{through}", tmp_path, settings, steps)
    assert len(outcomes) == len(steps) + 1 and all(o.completed and o.replicas_verified == 1 for o in outcomes)
    reasons = [CutReason(o.cut_reason) for o in outcomes]
    assert reasons[0] is CutReason.FIRST  # the baseline
    cuts = [(o.version, CutReason(o.cut_reason)) for o in outcomes[1:] if o.chain_cut]
    assert cuts, f"no cut: {reasons}"
    cut_version, cut_reason = cuts[0]
    assert cut_reason is reason, reasons
    if version is not None:
        assert cut_version == version
    assert all(not o.chain_cut for o in outcomes[1:cut_version])  # deltas until the cut
    full_bytes = outcomes[0].snapshot_bytes
    before = outcomes[cut_version - 1]
    if reason is CutReason.COUNT:
        assert before.chain_length == 19  # the 20th version after a FULL
    if reason is CutReason.CHAIN_LIMIT:
        assert before.chain_length == 63  # a 64th delta would pass what a cold replica replays
    if reason is CutReason.REPLAY:  # the chain was near the budget of two FULLs, and never passed it
        assert 1.4 * full_bytes < before.replay_bytes <= 3 * full_bytes
    if reason is CutReason.SHARE:
        assert outcomes[cut_version].snapshot_bytes >= 0.9 * full_bytes
    if settings.get("full_every") != 0:  # auto: a cold start never reads more than three FULLs
        assert all(o.replay_bytes <= 3 * full_bytes for o in outcomes)
    after = outcomes[cut_version]
    assert after.replay_bytes == after.snapshot_bytes and after.chain_length == 0
    if len(outcomes) > cut_version + 1:  # the chain goes on from the cut
        assert outcomes[cut_version + 1].incremental and outcomes[cut_version + 1].chain_length == 1
