"""A scored NeMo Gym evaluation on a temporary deployment.

:func:`evaluate` runs the whole cycle and always cleans up::

    create the deployment (client-chosen id, logged first)
      -> wait until READY -> rollout base URL and model name
      -> the collection step (NeMo Gym against that endpoint)
      -> scores from the rollouts file
    finally: delete the deployment and wait until it is gone
             (on success, on failure, on Ctrl-C; not with keep=True)

The id is chosen before the create request, so a create interrupted mid-flight is still
found and deleted. An ``id`` in the request naming a deployment that already exists is
refused before anything is sent: the evaluation deletes what it created, and nothing else.
"""

from __future__ import annotations

import logging
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cwtrain.errors import CWTrainError, NotFoundError
from cwtrain.infra import Deployment, InferenceClient, lifecycle
from cwtrain.integrations.gym.collect import (
    CheckedCollector,
    CollectionJob,
    CollectionResult,
    Collector,
    GymCLICollector,
    GymEndpoint,
    aggregate_metrics_path,
    gym_install_root,
    resolve_gym_path,
)
from cwtrain.integrations.gym.scores import GymScores, read_scores

__all__ = ["GymEvalResult", "evaluate", "load_request"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GymEvalResult:
    """What one evaluation produced.

    Attributes:
        deployment_id: the temporary deployment's id.
        deployment_name: its name.
        model: the OpenAI model name the rollouts used.
        rollout_base_url: the endpoint the rollouts came from.
        output_path: the rollouts JSONL.
        aggregate_metrics_path: Gym's aggregate metrics, when written.
        scores: rollouts, mean reward, per agent, Gym's aggregate metrics.
        deployment_deleted: whether the deployment was deleted (``False`` with ``keep``).
        seconds: wall time of the whole cycle.
    """

    deployment_id: str
    deployment_name: str
    model: str
    rollout_base_url: str
    output_path: Path
    aggregate_metrics_path: Path | None
    scores: GymScores
    deployment_deleted: bool
    seconds: float = field(default=0.0, compare=False)


def load_request(path: str | Path) -> dict[str, Any]:
    """Read a CreateDeploymentRequest JSON file (``-`` = stdin) and refuse ``<placeholders>``.

    Raises:
        CWTrainError: the file is missing, not JSON or not an object.
        UsageError: a string value still holds a ``<placeholder>`` (fill in the file first).
    """
    return lifecycle.load_request(path)


def _refuse_existing(client: InferenceClient, deployment_id: str) -> None:
    try:
        existing = client.get_deployment(deployment_id)
    except NotFoundError:
        return
    raise CWTrainError(
        f"deployment {deployment_id} ({existing.name!r}) already exists; gym eval creates and deletes a "
        "temporary deployment of its own: remove `id` from the request"
    )


def _endpoint_url(client: InferenceClient, deployment: Deployment) -> str:
    url = lifecycle.deployment_base_url(client, deployment)
    if url is None:
        raise CWTrainError(
            f"deployment {deployment.id} is READY but its gateways list no endpoint; check them with "
            f"`cwtrain deployment get {deployment.id}`"
        )
    return url


def evaluate(
    client: InferenceClient,
    request: Mapping[str, Any],
    *,
    config_paths: tuple[Path, ...] | list[Path],
    input_path: Path,
    output_path: Path,
    api_key: str | None,
    agent: str | None = None,
    limit: int | None = None,
    num_repeats: int = 1,
    concurrency: int | None = None,
    prompt_config: Path | None = None,
    token_ids: bool = False,
    extra_args: tuple[str, ...] = (),
    keep: bool = False,
    ready_timeout: float = 3600.0,
    delete_timeout: float = 600.0,
    poll_interval: float = 10.0,
    collector: Collector | None = None,
    workdir: Path | None = None,
    source: str = "the request",
) -> GymEvalResult:
    """Run a scored NeMo Gym evaluation against a temporary deployment.

    Args:
        client: the API client (its token needs the Inference Admin role).
        request: the CreateDeploymentRequest (placeholders are refused).
        config_paths: Gym configs of the environment to evaluate; relative paths resolve as
            Gym resolves them (:func:`~cwtrain.integrations.gym.collect.resolve_gym_path`: its
            extra roots, the working directory, its install root).
        input_path: the input JSONL (resolved the same way).
        output_path: the rollouts JSONL to write.
        api_key: the endpoint's bearer key (the CoreWeave token for ``coreWeaveAuth`` gateways).
        agent: the agent for rows without ``agent_ref``.
        limit: at most this many rows.
        num_repeats: rollouts per row.
        concurrency: rollouts in flight.
        prompt_config: a prompt template YAML for rows that carry only fields (resolved the same
            way), e.g. ``benchmarks/prompts/generic/math.yaml`` for ``aime24``.
        token_ids: set ``return_token_id_information`` on Gym's ``vllm_model`` server.
        extra_args: more arguments for Gym's collection command.
        keep: leave the deployment running afterwards (its id is in the result).
        ready_timeout: seconds to wait for READY.
        delete_timeout: seconds to wait until the deployment is gone.
        poll_interval: seconds between status polls.
        collector: the collection step (default :class:`GymCLICollector`); its ``check()``, if any, runs
            before the deployment is created. Tests pass a stand-in.
        workdir: scratch directory (default: a private temporary one, removed afterwards).
        source: how the request is named in errors (its file name).

    Raises:
        CWTrainError: any step failed; the deployment has been deleted (unless ``keep``).
        KeyboardInterrupt: interrupted; the deployment has been deleted (unless ``keep``).
    """
    started = time.monotonic()
    if num_repeats < 1 or (limit is not None and limit < 1) or (concurrency is not None and concurrency < 1):
        raise CWTrainError("num_repeats, limit and concurrency must be at least 1")
    lifecycle.refuse_placeholders(request, source)
    step = collector or GymCLICollector()
    install_root = gym_install_root(getattr(step, "tools", None))
    configs = tuple(resolve_gym_path(p, install_root=install_root) for p in config_paths)
    rows = resolve_gym_path(input_path, install_root=install_root)
    prompt = resolve_gym_path(prompt_config, install_root=install_root) if prompt_config is not None else None
    for given, path in [(input_path, rows), *zip(config_paths, configs), (prompt_config, prompt)]:
        if path is not None and not path.is_file():
            raise CWTrainError(
                f"{given} does not exist or is not a file (looked in NEMO_GYM_EXTRA_ROOTS, {Path.cwd()}"
                + (f" and Gym's install root {install_root})" if install_root else ")")
            )
    if isinstance(step, CheckedCollector):
        step.check()  # e.g. Gym missing: say so before a deployment is created for nothing
    deployment_id = str(request.get("id") or "") or str(uuid.uuid4())
    _refuse_existing(client, deployment_id)
    log.info("temporary deployment %r: id %s", request.get("name"), deployment_id)
    deleted = False
    try:
        lifecycle.create_deployment(client, request, deployment_id=deployment_id, source=source)
        deployment = lifecycle.wait_for_deployment(
            client, deployment_id, timeout=ready_timeout, poll_interval=poll_interval
        )
        endpoint = GymEndpoint(
            base_url=_endpoint_url(client, deployment),
            model=deployment.model_name,
            api_key=api_key,
            token_ids=token_ids,
        )
        log.info("deployment %s is READY: %s (model %s)", deployment_id, endpoint.base_url, endpoint.model)
        output_path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="cwtrain-gym-") as scratch:
            job = CollectionJob(
                endpoint=endpoint,
                config_paths=tuple(p.resolve() for p in configs),
                input_path=rows.resolve(),
                output_path=output_path.resolve(),
                workdir=workdir or Path(scratch),
                agent=agent,
                limit=limit,
                num_repeats=num_repeats,
                concurrency=concurrency,
                prompt_config=prompt.resolve() if prompt is not None else None,
                extra_args=tuple(extra_args),
            )
            produced = step(job) or CollectionResult(job.output_path, None)
        metrics = produced.aggregate_metrics_path
        if metrics is None and aggregate_metrics_path(produced.output_path).exists():
            metrics = aggregate_metrics_path(produced.output_path)
        scores = read_scores(produced.output_path, metrics)
        log.info("%d rollouts, mean reward %s", scores.rollouts, scores.mean_reward)
    finally:
        if keep:
            log.info(
                "keeping deployment %s (delete it with `cwtrain deployment delete %s`)", deployment_id, deployment_id
            )
        else:
            deleted = _delete(client, deployment_id, delete_timeout, poll_interval)
    return GymEvalResult(
        deployment_id=deployment_id,
        deployment_name=deployment.name,
        model=endpoint.model,
        rollout_base_url=endpoint.base_url,
        output_path=produced.output_path,
        aggregate_metrics_path=metrics,
        scores=scores,
        deployment_deleted=deleted,
        seconds=time.monotonic() - started,
    )


def _delete(client: InferenceClient, deployment_id: str, timeout: float, poll_interval: float) -> bool:
    """Delete the temporary deployment and wait until it is gone; a second Ctrl-C is reported, not hidden."""
    log.info("deleting temporary deployment %s", deployment_id)
    try:
        existed = lifecycle.delete_deployment(
            client, deployment_id, timeout=timeout, poll_interval=min(poll_interval, 5.0)
        )
    except BaseException:
        log.error(
            "could not confirm that deployment %s is deleted; check with `cwtrain deployment get %s` and delete "
            "it with `cwtrain deployment delete %s --wait`",
            deployment_id,
            deployment_id,
            deployment_id,
        )
        raise
    log.info("deployment %s %s", deployment_id, "deleted" if existed else "was never created")
    return True
