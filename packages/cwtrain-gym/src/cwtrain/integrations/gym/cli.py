"""``cwtrain gym eval``: a scored NeMo Gym evaluation on a temporary deployment.

::

    cwtrain gym eval --request deployment.json --config env.yaml \\
        --input rows.jsonl --output rollouts.jsonl [--keep] [--prompt-config P]

Creates the deployment of ``--request`` (placeholders refused), waits until it is READY,
runs NeMo Gym's rollout collection against its endpoint, prints the scores as one JSON
document and deletes the deployment, also when the evaluation fails or is interrupted
(Ctrl-C or SIGTERM); ``--keep`` leaves it running. The endpoint key is the API token
(``--token``, ``COREWEAVE_API_TOKEN``, ``CW_API_TOKEN``) unless ``CWTRAIN_ROLLOUT_API_KEY``
is set. Needs NeMo Gym's ``gym`` command on ``PATH`` (``pip install "nemo-gym>=0.6.0"``).
Relative ``--config``, ``--input`` and ``--prompt-config`` paths resolve as Gym resolves them
(``NEMO_GYM_EXTRA_ROOTS``, the working directory, Gym's install root). stdout carries only
the JSON document: Gym's own output (progress, metric blocks) goes to stderr.

Output: ``{"deployment": {"id", "name", "deleted"}, "model", "rollout_base_url",
"output", "aggregate_metrics", "scores": {"rollouts", "scored", "mean_reward",
"by_agent", "aggregate_metrics"}, "seconds"}``.
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path
from typing import Any

from cwtrain.cli import client_from_args, command_group, interrupt_on_signal, positive_float, positive_int
from cwtrain.integrations.gym.framework import GYM

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the ``gym`` group (``gym eval``) to the ``cwtrain`` parser."""
    commands = command_group(subparsers, "gym", "scored NeMo Gym evaluations on a temporary deployment")
    ev = commands.add_parser(
        "eval",
        help="create a deployment, evaluate it with NeMo Gym, delete it",
        description=(
            "Create the deployment of --request (placeholders refused), wait until it is READY, run NeMo "
            "Gym's rollout collection against its endpoint, print the scores as one JSON document and delete "
            "the deployment, also after a failure, Ctrl-C or SIGTERM (--keep leaves it). Needs NeMo Gym's "
            f"`gym` command on PATH ({GYM.where})."
        ),
    )
    ev.add_argument("--request", required=True, type=Path, help="CreateDeploymentRequest JSON file (- = stdin)")
    ev.add_argument(
        "--config", required=True, action="append", type=Path, help="Gym config YAML (repeatable, in order)"
    )
    ev.add_argument("--input", required=True, type=Path, help="input JSONL of Gym rows")
    ev.add_argument("--output", required=True, type=Path, help="rollouts JSONL to write")
    ev.add_argument("--keep", action="store_true", help="leave the deployment running afterwards")
    ev.add_argument("--agent", help="agent for rows without agent_ref")
    ev.add_argument("--limit", type=positive_int, help="at most this many input rows")
    ev.add_argument("--num-repeats", type=positive_int, default=1, help="rollouts per row (1)")
    ev.add_argument("--concurrency", type=positive_int, help="rollouts in flight")
    ev.add_argument(
        "--prompt-config",
        type=Path,
        help="prompt template YAML for rows with only fields (aime24: benchmarks/prompts/generic/math.yaml)",
    )
    ev.add_argument(
        "--token-ids",
        action="store_true",
        help="return_token_id_information on Gym's vllm_model server (as for training)",
    )
    ev.add_argument("--timeout", type=positive_float, default=3600.0, help="seconds to wait for READY (3600)")
    ev.add_argument(
        "--delete-timeout", type=positive_float, default=600.0, help="seconds to wait for the deletion (600)"
    )
    ev.add_argument(
        "--server-timeout", type=positive_float, default=900.0, help="seconds for Gym's servers to start (900)"
    )
    ev.add_argument(
        "--poll-interval", type=positive_float, default=10.0, help="seconds between deployment status polls (10)"
    )
    ev.set_defaults(func=_eval)


def _eval(args: argparse.Namespace) -> int:
    # Imported here: registration stays cheap (no httpx, no YAML) for every other command.
    from cwtrain.cli import emit
    from cwtrain.integrations.gym.evaluation import load_request

    request = load_request(args.request)
    previous: Any = None
    if threading.current_thread() is threading.main_thread():
        # A Kubernetes Job is stopped with SIGTERM: treat it like Ctrl-C so the deployment is deleted
        # (exit 143, cwtrain.cli.signals).
        previous = signal.signal(signal.SIGTERM, interrupt_on_signal)
    try:
        result = _run(args, request)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    emit(
        {
            "deployment": {
                "id": result.deployment_id,
                "name": result.deployment_name,
                "deleted": result.deployment_deleted,
            },
            "model": result.model,
            "rollout_base_url": result.rollout_base_url,
            "output": result.output_path,
            "aggregate_metrics": result.aggregate_metrics_path,
            "scores": result.scores,
            "seconds": round(result.seconds, 3),
        }
    )
    return 0


def _run(args: argparse.Namespace, request: dict[str, Any]) -> Any:
    from cwtrain.config import env_str
    from cwtrain.infra import token_from_env
    from cwtrain.integrations.gym.collect import GymCLICollector
    from cwtrain.integrations.gym.evaluation import evaluate

    api_key = env_str("CWTRAIN_ROLLOUT_API_KEY") or args.token or token_from_env()
    with client_from_args(args) as client:
        return evaluate(
            client,
            request,
            config_paths=list(args.config),
            input_path=args.input,
            output_path=args.output,
            api_key=api_key,
            agent=args.agent,
            limit=args.limit,
            num_repeats=args.num_repeats,
            concurrency=args.concurrency,
            prompt_config=args.prompt_config,
            token_ids=args.token_ids,
            keep=args.keep,
            ready_timeout=args.timeout,
            delete_timeout=args.delete_timeout,
            poll_interval=args.poll_interval,
            collector=GymCLICollector(server_timeout=args.server_timeout),
            source=str(args.request),
        )
