"""An identity swapped in the middle of a batch, on the local stack: fenced samples and the batch's counters.

The sampler splits each GRPO group into ``n = 1`` requests (so one group can straddle a swap).
A transport in front of the real HTTP one holds every request after the sixth; while they
wait, the trainer publishes the next version (a FULL hot-load that both replicas complete)
and tells the sampler (``note_published``), then lets them go. With
``CWTRAIN_ROLLOUT_MAX_STALENESS=0`` every returned completion comes from the newest
identity and the counters say how many were re-requested; with no limit the batch returns
both versions, each group from one identity, and the counters report the mix.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import torch

from cwtrain.hotload.loader import HotLoader
from cwtrain.infra import InferenceClient
from cwtrain.integrations.rollout import CompletionSampler, RolloutConfig, SamplingParams
from cwtrain.local import LocalStack
from cwtrain.local.engine.model import ModelConfig, Tokenizer, init_weights

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TOK = Tokenizer()
GROUPS, GROUP = 6, 4
PASS = 6  # requests let through before the swap: group 0 whole, half of group 1


class Gate(httpx.AsyncBaseTransport):
    """Real HTTP, holding every request after the first ``PASS`` until :attr:`release` is set."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.count = 0
        self.reached = threading.Event()
        self.release = threading.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.count += 1
        if self.count > PASS:
            self.reached.set()
            await asyncio.to_thread(self.release.wait, 120)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.fixture(scope="module")
def local(shared_stack: Any) -> Iterator[tuple[LocalStack, Any]]:
    with shared_stack.view("e2e-fence", replicas=2) as stack:
        yield stack, stack.deploy(name="fence", timeout=120)


def _publish(loader: HotLoader, run: str, version: int) -> None:
    weights = init_weights(seed=version)  # every version a different FULL
    config = {"config.json": json.dumps(ModelConfig().to_json()).encode()}
    loader.publish({k: v.to(torch.bfloat16) for k, v in weights.items()}, f"{run}-v{version:06d}", extra_files=config)


@pytest.mark.parametrize("limit", [0, None], ids=["max-staleness-0", "no-limit"])
def test_a_swap_in_the_middle_of_a_batch(local: tuple[LocalStack, Any], limit: int | None) -> None:
    stack, target = local
    run = f"fence{limit}"
    with InferenceClient(stack.token, base_url=stack.api_url) as client:
        loader = HotLoader(client, target.deployment_id, s3=stack.s3_client(), timeout=120, poll_interval=0.1)
        _publish(loader, run, 0)
        gate = Gate()
        config = RolloutConfig(target.base_url, target.model, api_key=stack.token, concurrency=1, max_staleness=limit)
        prompts = [TOK.encode(f"prompt {i}") for i in range(GROUPS)]
        with CompletionSampler(config, transport=gate, group_size=GROUP, run_id=run) as sampler:
            sampler.note_published(0)
            with ThreadPoolExecutor(1) as pool:
                running = pool.submit(
                    sampler.sample_groups_sync, prompts, GROUP, SamplingParams(max_tokens=4), split=True
                )
                assert gate.reached.wait(60), "the batch never reached the gate"
                _publish(loader, run, 1)  # both replicas swap while the rest of the batch waits
                sampler.note_published(1)
                gate.release.set()
                batch = running.result(timeout=300)

    identities = [{c.identity for c in group} for group in batch]
    assert all(len(ids) == 1 for ids in identities), identities  # never a group from two identities
    assert all(len(group) == GROUP for group in batch)
    metrics = batch.metrics
    assert metrics["coreweave/mixed_groups_resampled"] >= 1  # group 1 straddled the swap
    if limit == 0:
        assert {i for ids in identities for i in ids} == {f"{run}-v000001"}  # every completion from the newest
        assert batch.versions == {1: GROUPS * GROUP}
        assert metrics["coreweave/stale_rerequested"] >= GROUP  # group 0, served by v0, went stale and came back
        assert metrics["coreweave/served_version_min"] == metrics["coreweave/served_version_max"] == 1.0
    else:
        assert batch.versions == {0: GROUP, 1: (GROUPS - 1) * GROUP}  # group 0 before the swap, the rest after
        assert metrics["coreweave/stale_rerequested"] == 0.0
        assert (metrics["coreweave/served_version_min"], metrics["coreweave/served_version_max"]) == (0.0, 1.0)
        assert metrics["coreweave/served_version_samples/0"] == GROUP
        assert metrics["coreweave/staleness_max"] == 1.0
    assert all(c.version == int(c.identity[-6:]) for group in batch for c in group)
