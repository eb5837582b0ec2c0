"""``cwtrain demo``: a real GRPO loop against the local stack, end to end, in about a minute.

What it does, all on loopback::

    cwtrain demo [--steps 40] [--seed 0] [--replicas 2] [--full-every auto|N] [--group-size 8] [--ahead]
                 [--slow-hot-load S] [--report PATH]

1. Starts :class:`~cwtrain.local.LocalStack` (moto S3, control plane, gateway, replicas) and
   uploads the tiny model's base weights.
2. Creates a gateway and a hot-load deployment (engine ``dynamo-vllm``, ``hotLoad`` with
   ``TRANSITION_MODE_ASYNC``) through :class:`cwtrain.infra.InferenceClient` and waits for
   READY.
3. Publishes the baseline ``demo-s<seed>-v000000`` (FULL), then every step:

   - samples one GRPO group per prompt through :mod:`cwtrain.integrations.rollout`
     (exact token ids and log-probs; each sample names the identity that served it),
   - scores them on :class:`~cwtrain.local.demo.grpo.ParityTask` and takes one GRPO step in torch,
   - publishes the new BF16 weights from memory through core's publish session
     (:class:`cwtrain.hotload.PublishSession`, as every integration does): an XOR+zstd delta
     against what replicas serve, or a FULL snapshot when the cadence cuts the chain: with
     ``--full-every auto`` (the default) when a delta would be at least 90 % of a FULL, when a
     cold replica would replay more than two FULLs' bytes of deltas, or after 19 deltas; with
     ``--full-every N`` every N versions,
   - waits until every replica serves the new identity (verified); with ``--ahead`` the next
     step samples and trains meanwhile (:class:`cwtrain.hotload.PublishAhead`: one version at a
     time, in order), its rollouts from the version the fleet serves, at most one behind the
     trainer's weights. Each step's line gives the seconds the loop waited for publishing and
     hot-loading (``hotload/trainer_wait_seconds``).

4. Deletes the deployment and gateway and stops the stack (also on Ctrl-C or an error).

**What it trains** (:data:`TASK`, :data:`PASS_RULE`; the same words are in ``cwtrain demo
--help``, the README and the report): each prompt is ``"even: "`` or ``"odd: "``, and a
completion's reward is the fraction of its ``--max-tokens`` slots holding a digit of that
parity, from 0 to 1. A fresh model scores about 0.07; it has to read the prompt to do well.

stderr shows one line per step (reward, snapshot type and size, why a FULL was cut, publish
and hot-load latency) and, last, the summary table and the verdict
(:mod:`cwtrain.local.demo.report`).
Every figure as one JSON document goes to stdout only with ``--json``, and to a file with
``--json-file PATH``; nothing is printed on stdout otherwise. ``--report PATH`` also writes
the run as one self-contained HTML page with its configuration and six plots (reward,
publish and hot-load latency, snapshot bytes FULL vs delta with each FULL's reason, time
per step, the canary's gap after each hot-load, the bytes a cold replica would replay at each version;
:mod:`cwtrain.local.demo.page`), a line explaining each FULL reason of the run, and a per-step table
(collapsed), which opens offline in any browser. The run is
reproducible: ``--seed`` fixes the base weights, the prompts and every sampling seed
(groups are sent as ``n = 1`` requests with seeds drawn from it; ``--group-requests`` sends
one unseeded ``n = group size`` request per group instead, faster but not reproducible).

Exit code (:data:`PASS_RULE`): 0 when the run finishes and, unless ``--no-check``, the final
mean reward is at least 0.5 and at least twice the first; 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from cwtrain.errors import ConfigError
from cwtrain.hotload import FullEvery, check_full_every, parse_full_every
from cwtrain.local.demo.report import PASS_RULE, TASK, LiveDisplay, StepRecord, print_summary, summarize

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from cwtrain.hotload import PublishOutcome
    from cwtrain.infra import Deployment, Gateway, InferenceClient
    from cwtrain.integrations.rollout import Canary, CompletionSampler, RolloutConfig, SamplingParams
    from cwtrain.local.demo.grpo import GRPOTrainer, ParityTask
    from cwtrain.local.engine.model import Tokenizer
    from cwtrain.local.stack import LocalStack

__all__ = ["PASS_RULE", "TASK", "DemoConfig", "StepRecord", "add_arguments", "main", "run_demo"]

log = logging.getLogger("cwtrain.local.demo.run")
_QUIET = ("cwtrain.hotload", "cwtrain.infra", "cwtrain.local", "cwtrain.integrations", "httpx", "botocore")
_MODEL = "cwtrain-tiny"


@dataclass(frozen=True)
class DemoConfig:
    """Settings of one demo run (the CLI options)."""

    steps: int = 40
    seed: int = 0
    replicas: int = 2
    full_every: FullEvery = "auto"
    group_size: int = 8
    prompts_per_step: int = 4
    max_tokens: int = 16
    lr: float = 3e-3
    temperature: float = 1.0
    group_requests: bool = False
    check: bool = True
    timeout: float = 120.0
    canary: bool = True
    ahead: bool = False
    slow_hot_load: float = 0.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``cwtrain demo`` options to ``parser``, and its task and pass rule to its epilog."""
    d = DemoConfig()
    parser.epilog = (
        f"Task: {TASK}. Pass rule: {PASS_RULE}. Output: one line per step and, last, a summary table "
        "(stderr); --json and --json-file give every figure as JSON, --report an HTML page."
    )
    parser.add_argument("--steps", type=int, default=d.steps, help=f"training steps (default {d.steps})")
    parser.add_argument("--seed", type=int, default=d.seed, help="seed of weights, prompts and sampling (default 0)")
    parser.add_argument("--replicas", type=int, default=d.replicas, help=f"engine replicas (default {d.replicas})")
    parser.add_argument(
        "--full-every",
        type=_full_every,
        default=d.full_every,
        metavar="auto|N",
        help="when to cut the chain with a FULL snapshot: auto (when a delta costs nearly a FULL, when a cold "
        "replica would replay more than two FULLs of deltas, or after 19 deltas) or every N versions, 0-64 "
        f"(default {d.full_every})",
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
        "--no-canary",
        dest="canary",
        action="store_false",
        help="skip the canary after each hot-load (the deployment's prompt log-probs of a fixed probe, compared "
        "with the trainer's: a replica serving wrong weights fails the publish and the fleet is brought back)",
    )
    parser.add_argument(
        "--ahead",
        action="store_true",
        help="one step ahead: train the next step while the last one's hot-load runs; rollouts come from the "
        "version the fleet serves, at most 1 behind the trainer's weights (CWTRAIN_ROLLOUT_MAX_STALENESS=1)",
    )
    parser.add_argument(
        "--slow-hot-load",
        type=float,
        default=d.slow_hot_load,
        metavar="S",
        help="make every hot-load last S seconds more on every replica, as a large model's does (default 0)",
    )
    parser.add_argument(
        "--no-check", dest="check", action="store_false", help="exit 0 even if the reward did not climb"
    )
    parser.add_argument(
        "--timeout", type=float, default=d.timeout, help="seconds per publish and hot-load (default 120)"
    )
    parser.add_argument(
        "--report",
        metavar="PATH",
        default=None,
        help="also write the run as a self-contained HTML page: its configuration, six plots and a per-step table "
        "(opens offline)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print every figure of the run as one JSON document on stdout"
    )
    parser.add_argument(
        "--json-file", metavar="PATH", default=None, help="write every figure of the run as one JSON document to PATH"
    )


def _full_every(text: str) -> FullEvery:
    """``--full-every``: ``auto`` or 0..64 (argparse turns the error into a usage line)."""
    try:
        return parse_full_every(text, "--full-every")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _config_from_args(args: argparse.Namespace) -> DemoConfig:
    fields = DemoConfig.__dataclass_fields__
    values = {name: getattr(args, name) for name in fields if hasattr(args, name)}
    config = DemoConfig(**values)
    problems = []
    if config.steps < 1:
        problems.append("--steps must be >= 1")
    if config.replicas < 1:
        problems.append("--replicas must be >= 1")
    try:
        check_full_every(config.full_every)
    except ConfigError:
        problems.append("--full-every must be auto or an integer in 0..64")
    if config.group_size < 2:
        problems.append("--group-size must be >= 2 (GRPO compares samples within a group)")
    if not 0 <= config.slow_hot_load <= 600:
        problems.append("--slow-hot-load must be in 0..600 seconds")
    if config.prompts_per_step < 1 or not 1 <= config.max_tokens <= 200:
        problems.append("--prompts-per-step must be >= 1 and --max-tokens in 1..200")
    if problems:
        raise ConfigError("; ".join(problems))
    return config


@dataclass
class _StepStats:
    """The rollout and training half of one step (nothing at step 0, the baseline)."""

    mean_reward: float | None = None
    logprob_gap: float | None = None
    served_identities: list[str] = field(default_factory=list)
    rollout_seconds: float = 0.0
    train_seconds: float = 0.0
    rollout_retries: int = 0
    sample_staleness: int | None = None


def _start_deployment(
    stack: LocalStack, client: InferenceClient, config: DemoConfig
) -> tuple[Gateway, Deployment, str]:
    """Create the demo's gateway and hot-load deployment through the API; wait for READY."""
    from cwtrain.infra import lifecycle
    from cwtrain.local.stack import deployment_request, gateway_request

    gateway = lifecycle.create_gateway(
        client, gateway_request("demo-gateway", stack.region), gateway_id=str(uuid.uuid4())
    )
    gateway = lifecycle.wait_for_gateway(client, gateway.id, timeout=config.timeout, poll_interval=0.05)
    request = deployment_request(
        "demo",
        gateway_id=gateway.id,
        model=_MODEL,
        bucket=stack.bucket,
        base_path="base/demo",
        replicas=config.replicas,
        hot_load_prefix="demo",
    )
    deployment = lifecycle.create_deployment(client, request, deployment_id=str(uuid.uuid4()))
    deployment = lifecycle.wait_for_deployment(client, deployment.id, timeout=config.timeout, poll_interval=0.1)
    base_url = lifecycle.rollout_base_url(lifecycle.endpoints(client, deployment)[0])
    return gateway, deployment, base_url


class _Fleet:
    """What the step's sampler is told of the run's versions: served (followers), burned, handed over (ahead)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.served: int | None = None
        self.publishing: int | None = None
        self.burned: set[int] = set()
        self.sampler: CompletionSampler | None = None
        self._lock = threading.Lock()

    def attach(self, sampler: CompletionSampler) -> None:
        """Tell ``sampler`` what is known now, and from now on what the publish path says."""
        with self._lock:
            self.sampler = sampler
            for version in sorted(self.burned):
                sampler.note_burned(version, run_id=self.run_id)
            if self.served is not None:
                sampler.note_published(self.served, run_id=self.run_id)
            if self.publishing is not None:
                sampler.note_publishing(self.publishing, run_id=self.run_id)

    def detach(self) -> None:
        with self._lock:
            self.sampler = None

    def published(self, run_id: str, version: int) -> None:
        with self._lock:
            self.served = version
            if self.sampler is not None:
                self.sampler.note_published(version, run_id=run_id)

    def burn(self, run_id: str, version: int) -> None:
        with self._lock:
            self.burned.add(version)
            if self.sampler is not None:
                self.sampler.note_burned(version, run_id=run_id)

    def handed_over(self, run_id: str, version: int) -> None:
        with self._lock:
            self.publishing = version
            if self.sampler is not None:
                self.sampler.note_publishing(version, run_id=run_id)


def _rollout_and_train(
    step: int,
    config: DemoConfig,
    task: ParityTask,
    trainer: GRPOTrainer,
    rollout_config: RolloutConfig,
    params: SamplingParams,
    fleet: _Fleet,
) -> _StepStats:
    """Sample one GRPO group per prompt from the deployment, score them and take one step."""
    from cwtrain.hotload import identity_version
    from cwtrain.integrations.rollout import CompletionSampler

    t_start = time.monotonic()
    prompts = task.prompts(config.prompts_per_step)
    # a sampler per step, seeded from (seed, step): retry jitter in one step
    # cannot shift the sampling seeds of the next
    with CompletionSampler(
        rollout_config, group_size=config.group_size, seed=config.seed * 1_000_003 + step, run_id=fleet.run_id
    ) as sampler:
        fleet.attach(sampler)
        try:
            batch = sampler.sample_groups_sync(
                [ids for _, ids in prompts], config.group_size, params, split=not config.group_requests
            )
        finally:
            fleet.detach()
    # the trainer's weights are version step - 1 (handed over; one step ahead, maybe not served yet)
    versions = [identity_version(identity, fleet.run_id) for identity in batch.identities]
    staleness = max(((step - 1) - v for v in versions if v is not None), default=None)
    groups = [
        [(list(c.prompt_ids), list(c.response_ids), task.reward(kind, c.response_ids), c.logprobs) for c in group]
        for (kind, _), group in zip(prompts, batch.groups)
    ]
    t_rollout = time.monotonic() - t_start
    stats = trainer.step(groups, config.max_tokens)
    return _StepStats(
        mean_reward=stats.mean_reward,
        logprob_gap=None if stats.logprob_gap != stats.logprob_gap else stats.logprob_gap,
        served_identities=list(batch.identities),
        rollout_seconds=t_rollout,
        train_seconds=time.monotonic() - t_start - t_rollout,
        rollout_retries=int(batch.metrics.get("coreweave/retries", 0)),
        sample_staleness=staleness,
    )


#: The canary's probe: prompts in the task's own form, a parity word and digits after it.
_PROBE = ("even: 0 2 4 6 8", "odd: 1 3 5 7 9", "even: 8 6 4 2", "odd: 9 7 5 3")


def _canary(rollout_config: RolloutConfig, tokenizer: Tokenizer, published: Callable[[], Any]) -> Canary:
    """The canary of the demo: the deployment's log-probs of :data:`_PROBE` against those of ``published()``'s weights."""
    from cwtrain.integrations.rollout import Canary, CanaryProbe
    from cwtrain.local.engine.model import token_logprobs

    def trainer_logprobs(prompts: Sequence[Sequence[int]]) -> list[list[float]]:
        weights = published()  # the version just hot-loaded (one step ahead the trainer has moved on)
        return [token_logprobs(weights, prompt[:1], prompt[1:]) for prompt in prompts]

    probe = CanaryProbe.from_prompts([tokenizer.encode(text) for text in _PROBE], count=len(_PROBE))
    return Canary(rollout_config, probe, trainer_logprobs)


def run_demo(config: DemoConfig, *, stream: TextIO | None = None) -> dict[str, Any]:
    """Run the demo and return its summary (what ``cwtrain demo`` prints as JSON)."""
    import torch

    from cwtrain.hotload import AHEAD_MAX_STALENESS, CutReason, HotLoadSettings, PublishAhead, PublishSession, Target
    from cwtrain.infra import InferenceClient, lifecycle
    from cwtrain.integrations.rollout import RolloutConfig, SamplingParams
    from cwtrain.local import LocalStack
    from cwtrain.local.demo.grpo import GRPOTrainer, ParityTask
    from cwtrain.local.engine.model import ModelConfig, Tokenizer

    torch.manual_seed(config.seed)
    torch.set_num_threads(1)
    display = LiveDisplay(stream or sys.stderr, config.steps)
    started = time.monotonic()
    run_id = f"demo-s{config.seed}"
    records: list[StepRecord] = []
    tokenizer = Tokenizer()
    task = ParityTask(tokenizer, config.max_tokens, seed=config.seed)
    trainer = GRPOTrainer(seed=config.seed, lr=config.lr)
    config_json = json.dumps(ModelConfig().to_json() | {"seed": config.seed}, indent=2, sort_keys=True).encode()

    display.say(f"cwtrain demo: starting the local stack ({config.replicas} replicas) ...")
    with LocalStack(replicas=config.replicas, hot_load_delay=config.slow_hot_load) as stack:
        base_uri = stack.seed_base_model("base/demo", seed=config.seed)
        client = InferenceClient(stack.token, base_url=stack.api_url)
        gateway, deployment, base_url = _start_deployment(stack, client, config)
        display.say(
            f"deployment {deployment.id} READY ({config.replicas} replicas, base {base_uri}); rollouts at {base_url}"
        )
        target = Target(client, deployment.id, poll_interval=0.05, s3=stack.s3_client())
        # the demo's publisher is core's session, as every integration's is; verify: every replica on the identity
        settings = HotLoadSettings(
            deployment.id, run_id, timeout=config.timeout, full_every=config.full_every, verify=True
        )
        # one step ahead: a sample may be one version behind the trainer's weights, never from one not served yet
        staleness = AHEAD_MAX_STALENESS if config.ahead else None
        rollout_config = RolloutConfig(
            base_url=base_url, model=_MODEL, api_key=stack.token, concurrency=16, max_staleness=staleness
        )
        fleet = _Fleet(run_id)
        session = PublishSession(settings, target=target, followers=[fleet.published], on_burned=[fleet.burn])
        params = SamplingParams(max_tokens=config.max_tokens, temperature=config.temperature)
        stats_of: dict[int, _StepStats] = {}

        def record(outcome: PublishOutcome) -> None:
            """The row of the step that published ``outcome``'s version, once its publish ended."""
            records.append(
                StepRecord(
                    step=outcome.version,
                    identity=outcome.identity or session.served_identity or "initial",
                    snapshot_type=outcome.kind,
                    snapshot_bytes=outcome.snapshot_bytes,
                    tensors_changed=outcome.tensors_changed,
                    publish_seconds=outcome.upload_seconds,
                    hot_load_seconds=outcome.hot_load_seconds,
                    replicas_serving=outcome.replicas_verified,
                    canary_gap=outcome.canary_gap if outcome.canary_checked else None,
                    cut_reason=CutReason(outcome.cut_reason).label,
                    replay_bytes=outcome.replay_bytes,
                    trainer_wait_seconds=outcome.trainer_wait_seconds,
                    **asdict(stats_of.pop(outcome.version)),
                )
            )
            display.row(records[-1])

        # synchronously each hand-over returns once the version is served; one step ahead it returns at
        # once and the next one (or the end) waits for it. Either way the same publish path, in order.
        ahead = PublishAhead(session, on_publishing=[fleet.handed_over])
        if config.canary:
            session.canary = _canary(rollout_config, tokenizer, lambda: ahead.tensors_in_flight)
        loop_started = time.monotonic()
        try:
            for step in range(config.steps + 1):
                stats_of[step] = (
                    _rollout_and_train(step, config, task, trainer, rollout_config, params, fleet)
                    if step
                    else _StepStats()
                )
                done = ahead.publish_tensors(
                    trainer.served_weights(), version=step, extra_files={"config.json": config_json}
                )
                if done is not None:
                    record(done)
                # synchronous: wait for it now; ahead too for the baseline, served before any rollout
                if (step == 0 or not config.ahead) and (done := ahead.collect()) is not None:
                    record(done)
            if (done := ahead.collect()) is not None:
                record(done)
            loop_seconds = time.monotonic() - loop_started
        finally:
            ahead.close()
            teardown = time.monotonic()
            try:
                lifecycle.delete_deployment(client, deployment.id, timeout=60, poll_interval=0.1)
                lifecycle.delete_gateway(client, gateway.id, timeout=60, poll_interval=0.1)
            except Exception as exc:  # the stack stops everything anyway
                log.warning("cleanup through the API failed (%s); stopping the stack", exc)
            client.close()
            teardown_seconds = time.monotonic() - teardown
    summary = summarize(asdict(config), records, time.monotonic() - started, teardown_seconds, deployment.id)
    if settings.full_every == "auto" and records:  # a cold start reads at most the FULL and this many FULLs of deltas
        summary["replay_budget_bytes"] = round((1 + settings.replay_budget) * records[0].snapshot_bytes)
    # the cadence's thresholds, so the report can say in numbers why a FULL was cut (share, replay)
    summary["full_share"], summary["replay_budget"] = settings.full_share, settings.replay_budget
    summary["rollout_base_url"] = base_url
    summary["steps_per_minute"] = 60 * config.steps / loop_seconds if loop_seconds > 0 else None
    summary["task"], summary["pass_rule"] = TASK, PASS_RULE
    return summary


def main(args: argparse.Namespace) -> int:
    """``cwtrain demo`` handler: run; the JSON where asked (``--json``, ``--json-file``); the summary table last (stderr)."""
    from cwtrain.cli import emit

    config = _config_from_args(args)
    json_file = getattr(args, "json_file", None)
    for option, path in (("--json-file", json_file), ("--report", getattr(args, "report", None))):
        if path and Path(path).is_dir():  # found now, not after the run
            raise ConfigError(f"{option} {path} is a directory; give a file path")
    quiet = [] if getattr(args, "verbose", False) else [logging.getLogger(name) for name in _QUIET]
    levels = [(logger, logger.level) for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.WARNING)
    try:
        summary = run_demo(config)
    finally:  # the run's quiet is its own: callers in the same process keep their log levels
        for logger, level in levels:
            logger.setLevel(level)
    report = getattr(args, "report", None)
    if report:
        from cwtrain.local.demo.page import write_report

        print(f"report: {write_report(summary, report)}", file=sys.stderr, flush=True)
    if json_file:
        target = Path(json_file)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        print(f"figures (JSON): {target}", file=sys.stderr, flush=True)
    if getattr(args, "json", False):
        emit(summary)
        sys.stdout.flush()
    print_summary(summary, sys.stderr)  # last: what a person reads when the run ends
    return 0 if summary["reward_goal_met"] or not config.check else 1
