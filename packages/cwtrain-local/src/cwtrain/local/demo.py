"""``cwtrain demo``: a real GRPO loop against the local stack, end to end, in about a minute.

What it does, all on loopback::

    cwtrain demo [--steps 40] [--seed 0] [--replicas 2] [--full-every 10] [--group-size 8]

1. Starts :class:`~cwtrain.local.LocalStack` (moto S3, control plane, gateway, replicas) and
   uploads the tiny model's base weights.
2. Creates a gateway and a hot-load deployment (engine ``dynamo-vllm``, ``hotLoad`` with
   ``TRANSITION_MODE_ASYNC``) through :class:`cwtrain.infra.InferenceClient` and waits for
   READY.
3. Publishes the baseline ``demo-s<seed>-v000000`` (FULL), then every step:

   - samples one GRPO group per prompt through :mod:`cwtrain.integrations.rollout`
     (exact token ids and log-probs; each sample names the identity that served it),
   - scores them on :class:`~cwtrain.local.grpo.ParityTask` and takes one GRPO step in torch,
   - publishes the new BF16 weights from memory with :meth:`cwtrain.HotLoader.publish`:
     an XOR+zstd delta against what replicas serve, a FULL snapshot every ``--full-every``
     versions,
   - waits until every replica serves the new identity.

4. Deletes the deployment and gateway and stops the stack (also on Ctrl-C or an error).

stderr shows one line per step (reward, snapshot type and size, publish and hot-load
latency) and a summary table; stdout gets one JSON document with every figure. The run
is reproducible: ``--seed`` fixes the base weights, the prompts and every sampling seed
(groups are sent as ``n = 1`` requests with seeds drawn from it; ``--group-requests`` sends
one unseeded ``n = group size`` request per group instead, faster but not reproducible).

Exit code 0 when the run finishes and, unless ``--no-check``, the final mean reward is at
least 0.5 and at least twice the first; 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

from cwtrain.hotload.chain import MAX_FULL_EVERY, ChainCadence
from cwtrain.infra.objectstore import ObjectStore

__all__ = ["DemoConfig", "StepRecord", "add_arguments", "main", "run_demo"]

log = logging.getLogger("cwtrain.local.demo")
_QUIET = ("cwtrain.hotload", "cwtrain.infra", "cwtrain.local", "cwtrain.integrations", "httpx", "botocore")


@dataclass(frozen=True)
class DemoConfig:
    """Settings of one demo run (the CLI options)."""

    steps: int = 40
    seed: int = 0
    replicas: int = 2
    full_every: int = 10
    group_size: int = 8
    prompts_per_step: int = 4
    max_tokens: int = 16
    lr: float = 3e-3
    temperature: float = 1.0
    group_requests: bool = False
    check: bool = True
    timeout: float = 120.0


@dataclass
class StepRecord:
    """One row of the live display and the summary."""

    step: int
    identity: str
    snapshot_type: str
    mean_reward: float | None
    snapshot_bytes: int
    tensors_changed: int
    publish_seconds: float
    hot_load_seconds: float
    replicas_serving: int
    served_identities: list[str] = field(default_factory=list)
    logprob_gap: float | None = None
    rollout_seconds: float = 0.0
    train_seconds: float = 0.0
    rollout_retries: int = 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``cwtrain demo`` options to ``parser``."""
    d = DemoConfig()
    parser.add_argument("--steps", type=int, default=d.steps, help=f"training steps (default {d.steps})")
    parser.add_argument("--seed", type=int, default=d.seed, help="seed of weights, prompts and sampling (default 0)")
    parser.add_argument("--replicas", type=int, default=d.replicas, help=f"engine replicas (default {d.replicas})")
    parser.add_argument(
        "--full-every",
        type=int,
        default=d.full_every,
        help=f"a FULL snapshot every N versions (default {d.full_every})",
    )
    parser.add_argument(
        "--group-size", type=int, default=d.group_size, help=f"GRPO group size (default {d.group_size})"
    )
    parser.add_argument(
        "--prompts-per-step",
        type=int,
        default=d.prompts_per_step,
        help=f"groups per step (default {d.prompts_per_step})",
    )
    parser.add_argument(
        "--max-tokens", type=int, default=d.max_tokens, help=f"tokens per completion (default {d.max_tokens})"
    )
    parser.add_argument("--lr", type=float, default=d.lr, help=f"Adam learning rate (default {d.lr})")
    parser.add_argument(
        "--group-requests",
        action="store_true",
        help="one unseeded n=group-size request per group (faster, not reproducible)",
    )
    parser.add_argument(
        "--no-check", dest="check", action="store_false", help="exit 0 even if the reward did not climb"
    )
    parser.add_argument(
        "--timeout", type=float, default=d.timeout, help="seconds per publish and hot-load (default 120)"
    )


def _config_from_args(args: argparse.Namespace) -> DemoConfig:
    fields = DemoConfig.__dataclass_fields__
    values = {name: getattr(args, name) for name in fields if hasattr(args, name)}
    config = DemoConfig(**values)
    problems = []
    if config.steps < 1:
        problems.append("--steps must be >= 1")
    if config.replicas < 1:
        problems.append("--replicas must be >= 1")
    if not 0 <= config.full_every <= MAX_FULL_EVERY:
        problems.append(f"--full-every must be in 0..{MAX_FULL_EVERY}")
    if config.group_size < 2:
        problems.append("--group-size must be >= 2 (GRPO compares samples within a group)")
    if config.prompts_per_step < 1 or not 1 <= config.max_tokens <= 200:
        problems.append("--prompts-per-step must be >= 1 and --max-tokens in 1..200")
    if problems:
        from cwtrain.errors import ConfigError

        raise ConfigError("; ".join(problems))
    return config


def _bar(value: float, width: int = 20) -> str:
    filled = round(max(0.0, min(1.0, value)) * width)
    return "█" * filled + "·" * (width - filled)


def _kib(n: int) -> str:
    return f"{n / 1024:7.1f} KiB"


class _Display:
    """The live lines on stderr."""

    def __init__(self, stream: TextIO, total: int) -> None:
        self.stream = stream
        self.total = total

    def say(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def row(self, rec: StepRecord) -> None:
        reward = "   —  " if rec.mean_reward is None else f"{rec.mean_reward:6.3f}"
        bar = _bar(rec.mean_reward or 0.0)
        self.say(
            f"step {rec.step:>3}/{self.total}  reward {reward} {bar}  {rec.snapshot_type:<11} "
            f"{_kib(rec.snapshot_bytes)}  publish {rec.publish_seconds * 1000:6.0f} ms  "
            f"hot-load {rec.hot_load_seconds * 1000:5.0f} ms  rollout {rec.rollout_seconds * 1000:5.0f} ms  "
            f"train {rec.train_seconds * 1000:4.0f} ms  serving {rec.identity} on {rec.replicas_serving}"
        )


def _snapshot_bytes(s3: ObjectStore, bucket: str, prefix: str) -> int:
    return sum(obj.size for obj in s3.list_objects(bucket, prefix))


def run_demo(config: DemoConfig, *, stream: TextIO | None = None) -> dict[str, Any]:
    """Run the demo and return its summary (what ``cwtrain demo`` prints as JSON)."""
    import torch

    from cwtrain.hotload import HotLoader
    from cwtrain.hotload.identity import snapshot_prefix
    from cwtrain.infra import InferenceClient, lifecycle
    from cwtrain.integrations.rollout import CompletionSampler, RolloutConfig, SamplingParams
    from cwtrain.local import LocalStack
    from cwtrain.local.grpo import GRPOTrainer, ParityTask
    from cwtrain.local.model import ModelConfig, Tokenizer

    torch.manual_seed(config.seed)
    torch.set_num_threads(1)
    display = _Display(stream or sys.stderr, config.steps)
    started = time.monotonic()
    run_id = f"demo-s{config.seed}"
    records: list[StepRecord] = []
    tokenizer = Tokenizer()
    task = ParityTask(tokenizer, config.max_tokens, seed=config.seed)
    trainer = GRPOTrainer(seed=config.seed, lr=config.lr)
    config_json = json.dumps(ModelConfig().to_json() | {"seed": config.seed}, indent=2, sort_keys=True).encode()

    display.say(f"cwtrain demo: starting the local stack ({config.replicas} replicas) ...")
    with LocalStack(replicas=config.replicas) as stack:
        base_uri = stack.seed_base_model("base/demo", seed=config.seed)
        client = InferenceClient(stack.token, base_url=stack.api_url)
        gateway = lifecycle.create_gateway(
            client,
            {
                "name": "demo-gateway",
                "zones": [stack.region],
                "coreWeaveAuth": {},
                "bodyBasedRouting": {"apiType": "API_TYPE_OPENAI"},
            },
            gateway_id=str(uuid.uuid4()),
        )
        gateway = lifecycle.wait_for_gateway(client, gateway.id, timeout=config.timeout, poll_interval=0.05)
        deployment = lifecycle.create_deployment(
            client,
            {
                "name": "demo",
                "gatewayIds": [gateway.id],
                "runtime": {"engine": "dynamo-vllm", "version": "1.2.3", "engineConfig": {}, "engineEnv": {}},
                "resources": {"instanceType": "CPU_LOCAL", "gpuCount": 1},
                "model": {"name": "cwtrain-tiny", "bucket": stack.bucket, "path": "base/demo"},
                "autoscaling": {"min": config.replicas, "max": config.replicas, "concurrency": 64},
                "traffic": {"weight": 100},
                "hotLoad": {"bucket": stack.bucket, "pathPrefix": "demo", "transitionMode": "TRANSITION_MODE_ASYNC"},
            },
            deployment_id=str(uuid.uuid4()),
        )
        deployment = lifecycle.wait_for_deployment(client, deployment.id, timeout=config.timeout, poll_interval=0.1)
        endpoints = lifecycle.endpoints(client, deployment)
        base_url = lifecycle.rollout_base_url(endpoints[0])
        display.say(
            f"deployment {deployment.id} READY ({config.replicas} replicas, base {base_uri}); rollouts at {base_url}"
        )
        loader = HotLoader(client, deployment.id, s3=stack.s3_client(), timeout=config.timeout, poll_interval=0.05)
        rollout_config = RolloutConfig(base_url=base_url, model="cwtrain-tiny", api_key=stack.token, concurrency=16)
        params = SamplingParams(max_tokens=config.max_tokens, temperature=config.temperature)
        served: dict[str, torch.Tensor] | None = None
        identity = "initial"
        cadence = ChainCadence(config.full_every)
        try:
            for step in range(config.steps + 1):
                mean_reward: float | None = None
                gap: float | None = None
                seen: list[str] = []
                t_rollout = t_train = 0.0
                retries = 0
                if step > 0:
                    t_start = time.monotonic()
                    prompts = task.prompts(config.prompts_per_step)
                    # a sampler per step, seeded from (seed, step): retry jitter in one step
                    # cannot shift the sampling seeds of the next
                    with CompletionSampler(
                        rollout_config, group_size=config.group_size, seed=config.seed * 1_000_003 + step
                    ) as sampler:
                        batch = sampler.sample_groups_sync(
                            [ids for _, ids in prompts], config.group_size, params, split=not config.group_requests
                        )
                    retries = int(batch.metrics.get("coreweave/retries", 0))
                    seen = list(batch.identities)
                    groups = [
                        [
                            (list(c.prompt_ids), list(c.response_ids), task.reward(kind, c.response_ids), c.logprobs)
                            for c in group
                        ]
                        for (kind, _), group in zip(prompts, batch.groups)
                    ]
                    t_rollout = time.monotonic() - t_start
                    stats = trainer.step(groups, config.max_tokens)
                    t_train = time.monotonic() - t_start - t_rollout
                    mean_reward = stats.mean_reward
                    gap = None if stats.logprob_gap != stats.logprob_gap else stats.logprob_gap
                new = trainer.served_weights()
                version = f"{run_id}-v{step:06d}"
                full = served is None or cadence.is_full(step)
                changed = len(new)
                if not full and served is not None:
                    changed = sum(1 for k in new if not torch.equal(new[k], served[k]))
                if not full and changed == 0:
                    records.append(
                        StepRecord(
                            step,
                            identity,
                            "SKIPPED",
                            mean_reward,
                            0,
                            0,
                            0.0,
                            0.0,
                            0,
                            seen,
                            gap,
                            t_rollout,
                            t_train,
                            retries,
                        )
                    )
                    display.row(records[-1])
                    continue
                t0 = time.monotonic()
                hot_load = loader.publish(
                    new,
                    version,
                    previous_identity=None if full else identity,
                    base=None if full else served,
                    wait=False,
                    extra_files={"config.json": config_json} if full else None,
                )
                t1 = time.monotonic()
                loader.wait(hot_load.id)
                replicas = loader.verify_served(hot_load.id, version)
                t2 = time.monotonic()
                served, identity = new, version
                cadence.published(full=full)
                size = _snapshot_bytes(loader.s3, stack.bucket, snapshot_prefix("demo", version) + "/")
                rec = StepRecord(
                    step,
                    version,
                    "FULL" if full else "INCREMENTAL",
                    mean_reward,
                    size,
                    changed,
                    t1 - t0,
                    t2 - t1,
                    len(replicas),
                    seen,
                    gap,
                    t_rollout,
                    t_train,
                    retries,
                )
                records.append(rec)
                display.row(rec)
        finally:
            teardown = time.monotonic()
            try:
                lifecycle.delete_deployment(client, deployment.id, timeout=60, poll_interval=0.1)
                lifecycle.delete_gateway(client, gateway.id, timeout=60, poll_interval=0.1)
            except Exception as exc:  # the stack stops everything anyway
                log.warning("cleanup through the API failed (%s); stopping the stack", exc)
            client.close()
            teardown_seconds = time.monotonic() - teardown
    summary = _summary(config, records, time.monotonic() - started, teardown_seconds, deployment.id)
    summary["rollout_base_url"] = base_url
    return summary


def _summary(
    config: DemoConfig, records: list[StepRecord], seconds: float, teardown: float, deployment_id: str
) -> dict[str, Any]:
    rewards = [r.mean_reward for r in records if r.mean_reward is not None]
    published = [r for r in records if r.snapshot_type != "SKIPPED"]
    deltas = [r for r in published if r.snapshot_type == "INCREMENTAL"]
    fulls = [r for r in published if r.snapshot_type == "FULL"]
    first = rewards[0] if rewards else 0.0
    final = rewards[-1] if rewards else 0.0
    met = final >= 0.5 and final >= 2 * first
    return {
        "config": asdict(config),
        "deployment_id": deployment_id,
        "first_reward": first,
        "final_reward": final,
        "reward_goal_met": met,
        "rewards": rewards,
        "published": len(published),
        "full_snapshots": len(fulls),
        "delta_snapshots": len(deltas),
        "median_delta_bytes": statistics.median(r.snapshot_bytes for r in deltas) if deltas else None,
        "median_full_bytes": statistics.median(r.snapshot_bytes for r in fulls) if fulls else None,
        "median_publish_seconds": statistics.median(r.publish_seconds for r in published) if published else None,
        "median_hot_load_seconds": statistics.median(r.hot_load_seconds for r in published) if published else None,
        "max_hot_load_seconds": max((r.hot_load_seconds for r in published), default=None),
        "median_rollout_seconds": statistics.median(r.rollout_seconds for r in records[1:])
        if len(records) > 1
        else None,
        "median_train_seconds": statistics.median(r.train_seconds for r in records[1:]) if len(records) > 1 else None,
        "final_identity": published[-1].identity if published else "initial",
        "every_replica_served_every_version": all(r.replicas_serving == config.replicas for r in published),
        "rollouts_served_by_latest": all(
            r.served_identities == [records[i - 1].identity] for i, r in enumerate(records) if i > 0
        ),
        "rollout_retries": sum(r.rollout_retries for r in records),
        "teardown_seconds": teardown,
        "total_seconds": seconds,
        "steps": [asdict(r) for r in records],
    }


def _print_summary(summary: dict[str, Any], stream: TextIO) -> None:
    def ms(value: float | None) -> str:
        return "—" if value is None else f"{value * 1000:.0f} ms"

    rows = [
        ("steps", str(summary["config"]["steps"])),
        ("first mean reward", f"{summary['first_reward']:.3f}"),
        ("final mean reward", f"{summary['final_reward']:.3f}"),
        ("snapshots (FULL / delta)", f"{summary['full_snapshots']} / {summary['delta_snapshots']}"),
        (
            "median delta size",
            "—" if summary["median_delta_bytes"] is None else _kib(int(summary["median_delta_bytes"])).strip(),
        ),
        (
            "median FULL size",
            "—" if summary["median_full_bytes"] is None else _kib(int(summary["median_full_bytes"])).strip(),
        ),
        ("median publish", ms(summary["median_publish_seconds"])),
        ("median hot-load (all replicas)", ms(summary["median_hot_load_seconds"])),
        (
            "median rollout / train per step",
            f"{ms(summary['median_rollout_seconds'])} / {ms(summary['median_train_seconds'])}",
        ),
        ("final identity", summary["final_identity"]),
        ("every replica on every version", "yes" if summary["every_replica_served_every_version"] else "NO"),
        ("rollouts from the latest version", "yes" if summary["rollouts_served_by_latest"] else "NO"),
        ("total time", f"{summary['total_seconds']:.1f} s"),
    ]
    width = max(len(k) for k, _ in rows)
    print("", file=stream)
    print(f"{'summary'.ljust(width)}  value", file=stream)
    print(f"{'-' * width}  {'-' * 24}", file=stream)
    for key, value in rows:
        print(f"{key.ljust(width)}  {value}", file=stream)
    verdict = "reward climbed" if summary["reward_goal_met"] else "reward did NOT reach the goal (≥ 0.5 and ≥ 2× first)"
    print(f"\n{verdict}; everything torn down.", file=stream, flush=True)


def main(args: argparse.Namespace) -> int:
    """``cwtrain demo`` handler: run, print the summary table (stderr) and JSON (stdout)."""
    from cwtrain.cli.output import emit

    config = _config_from_args(args)
    if not getattr(args, "verbose", False):
        for name in _QUIET:
            logging.getLogger(name).setLevel(logging.WARNING)
    summary = run_demo(config)
    _print_summary(summary, sys.stderr)
    emit(summary)
    return 0 if summary["reward_goal_met"] or not config.check else 1
