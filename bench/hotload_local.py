"""Publish → every replica serving, for deltas of the demo model on the local stack.

Starts :class:`cwtrain.local.LocalStack` with ``--replicas`` engine replicas, publishes a
FULL baseline of the tiny model, then ``--publishes`` deltas, each one what a GRPO step
would produce (every BF16 weight nudged by Adam-sized noise), from in-memory tensors with
:meth:`cwtrain.HotLoader.publish`. Each publish is timed from the call (encode, upload,
hot-load creation) until the hot-load is COMPLETED with every replica READY on the new
identity; the replicas' answer is then checked with a completion that names the identity.

Goal (issue 6): median ≤ 1 s on loopback. ``--poll-interval`` is HotLoader's (default 5 s,
what a user gets; polling adapts below it, issue 27); ``polls_per_wait`` counts the passes
of each wait (two requests each). ``--compare-fixed`` waits for every other publish with the
schedule before issue 27 instead (a pass, then ``--poll-interval`` seconds, as
``poll(budget, interval)`` without ``adaptive``) and prints both medians and their ratio, from
the same run. Prints one JSON document::

    .venv-3.12/bin/python bench/hotload_local.py --publishes 10 --replicas 2
    .venv-3.12/bin/python bench/hotload_local.py --publishes 8 --compare-fixed   # adaptive vs fixed 5 s
    .venv-3.12/bin/python bench/hotload_local.py --poll-interval 0.02      # a hand-tuned interval
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time

import httpx
import torch

from cwtrain.hotload import HotLoader
from cwtrain.infra import InferenceClient
from cwtrain.infra.enums import HotLoadState
from cwtrain.local import LocalStack
from cwtrain.local.engine.model import ModelConfig, init_weights
from cwtrain.polling import Budget, poll

GOAL_SECONDS = 1.0


def _adaptive_wait(loader: HotLoader, hot_load_id: str) -> int:
    """``HotLoader.wait`` (adaptive polling); returns its passes."""
    passes: list[object] = []
    loader.wait(hot_load_id, on_progress=passes.append)
    return len(passes)


def _fixed_wait(client: InferenceClient, hot_load_id: str, identity: str, interval: float) -> int:
    """The wait before issue 27: a pass (hot-load and replicas), then ``interval`` seconds, until served."""
    for count in poll(Budget(120.0), interval):
        hot_load = client.get_hot_load(hot_load_id)
        replicas = client.list_hot_load_replicas(hot_load_id)
        if hot_load.state is HotLoadState.COMPLETED and all(r.caught_up(identity) for r in replicas):
            return count
    raise SystemExit(f"hot-load {hot_load_id} did not complete within 120 s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--publishes", type=int, default=10, help="deltas to publish (10)")
    parser.add_argument("--replicas", type=int, default=2, help="engine replicas (2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--poll-interval", type=float, default=5.0, help="HotLoader's poll_interval (5, its default)")
    parser.add_argument(
        "--compare-fixed", action="store_true", help="every other wait with the fixed schedule before issue 27"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(args.seed)
    master = {k: v.float() for k, v in init_weights(seed=args.seed).items()}
    config_json = json.dumps(ModelConfig().to_json()).encode()

    with LocalStack(replicas=args.replicas) as stack:
        target = stack.deploy(name="bench", replicas=args.replicas, seed=args.seed)
        client = InferenceClient(stack.token, base_url=stack.api_url)
        loader = HotLoader(
            client, target.deployment_id, s3=stack.s3_client(), timeout=120, poll_interval=args.poll_interval
        )
        served = {k: v.to(torch.bfloat16) for k, v in master.items()}
        previous = "bench-v000000"
        loader.publish(served, previous, extra_files={"config.json": config_json})
        totals: list[float] = []
        fixed_totals: list[float] = []
        uploads, waits, polls = [], [], []
        http = httpx.Client(base_url=target.base_url, headers={"Authorization": f"Bearer {stack.token}"}, timeout=30)
        for version in range(1, args.publishes + 1):
            for value in master.values():
                value.add_(torch.randn(value.shape, generator=gen) * 3e-3)
            new = {k: v.to(torch.bfloat16) for k, v in master.items()}
            identity = f"bench-v{version:06d}"
            start = time.perf_counter()
            hot_load = loader.publish(new, identity, previous_identity=previous, base=served, wait=False)
            triggered = time.perf_counter()
            fixed = args.compare_fixed and version % 2 == 0
            passes = (
                _fixed_wait(client, hot_load.id, identity, args.poll_interval)
                if fixed
                else _adaptive_wait(loader, hot_load.id)
            )
            done = time.perf_counter()
            loader.verify_served(hot_load.id, identity)
            answer = http.post("/completions", json={"model": target.model, "prompt": "x", "max_tokens": 1})
            if answer.headers.get("x-cwtrain-snapshot-identity") != identity:
                raise SystemExit(f"the gateway answered from {answer.headers.get('x-cwtrain-snapshot-identity')}")
            (fixed_totals if fixed else totals).append(done - start)
            uploads.append(triggered - start)
            waits.append(done - triggered)
            polls.append(passes)
            served, previous = new, identity
        http.close()
        client.close()

    median = statistics.median(totals)
    result = {
        "publishes": args.publishes,
        "replicas": args.replicas,
        "poll_interval": args.poll_interval,
        "median_seconds": median,
        "p90_seconds": sorted(totals)[max(0, round(0.9 * len(totals)) - 1)],
        "max_seconds": max(totals),
        "median_upload_and_trigger_seconds": statistics.median(uploads),
        "median_hot_load_wait_seconds": statistics.median(waits),
        "polls_per_wait": polls,
        **(
            {
                "fixed_schedule_median_seconds": statistics.median(fixed_totals),
                "fixed_over_adaptive": statistics.median(fixed_totals) / median,
            }
            if fixed_totals
            else {}
        ),
        "goal_seconds": GOAL_SECONDS,
        "goal_met": median <= GOAL_SECONDS,
    }
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0 if result["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
