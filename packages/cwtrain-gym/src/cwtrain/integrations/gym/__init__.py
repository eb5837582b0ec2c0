"""cwtrain-gym: a scored NeMo Gym evaluation against a temporary deployment.

The cycle: create a Dedicated Inference deployment from a CreateDeploymentRequest, wait
until it is READY, point NeMo Gym's policy model server at its OpenAI endpoint
(``policy_base_url`` = the rollout base URL, ``policy_api_key`` = the CoreWeave token,
``policy_model_name`` = ``spec.model.name``, and the ``vllm_model`` token-id option), run
Gym's rollout collection, score the rollouts, and delete the deployment whatever happens
(success, failure, Ctrl-C) unless asked to keep it.

Command line (the ``gym`` group of ``cwtrain``)::

    cwtrain gym eval --request deployment.json --config env.yaml \\
        --input rows.jsonl --output rollouts.jsonl [--keep] [--agent NAME] \\
        [--limit N] [--num-repeats K] [--concurrency C] [--token-ids]

Python::

    from pathlib import Path
    from cwtrain.infra import InferenceClient, token_from_env
    from cwtrain.integrations.gym import evaluate, load_request

    with InferenceClient() as api:
        result = evaluate(
            api,
            load_request("recipes/nemo-gym/deployment.json"),
            config_paths=[Path("env.yaml")],
            input_path=Path("rows.jsonl"),
            output_path=Path("out/rollouts.jsonl"),
            api_key=token_from_env(),   # coreWeaveAuth gateways take the API token
        )
    print(result.scores.mean_reward, result.output_path)

NeMo Gym is not a dependency of this package (it is installed in its own image or
environment): the default collection step, :class:`GymCLICollector`, drives its ``gym``
command line and raises :class:`GymNotInstalledError` (an ``ImportError``) naming the
install when it is missing. Pass ``collector=`` to :func:`evaluate` to run the collection
any other way (a function ``collector(job: CollectionJob) -> CollectionResult | None``).

Environment: ``COREWEAVE_API_TOKEN``/``CW_API_TOKEN`` (API token, Inference Admin role),
``COREWEAVE_API_URL``; the CLI uses ``CWTRAIN_ROLLOUT_API_KEY`` as the endpoint key when
set, else the API token. The recipe in ``recipes/nemo-gym`` runs this as a Kubernetes Job.

For training, :mod:`~cwtrain.integrations.gym.model_server` (:class:`GymModelServer`) is the
OpenAI endpoint Gym's stock ``vllm_model`` model server samples the deployment through: chats
rendered with the trainer's tokenizer become token-id completions, with exact ids kept across
turns (NeMo-RL's ``coreweave`` backend starts it; ``python -m
cwtrain.integrations.gym.model_server`` serves it on its own).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from cwtrain.integrations.gym.collect import GymNotInstalledError

if TYPE_CHECKING:  # what type checkers see; the names load on first use (_LAZY)
    from cwtrain.integrations.gym.collect import (
        CheckedCollector,
        CollectionJob,
        CollectionResult,
        Collector,
        GymCLICollector,
        GymEndpoint,
        policy_overlay,
        require_gym,
    )
    from cwtrain.integrations.gym.evaluation import GymEvalResult, evaluate, load_request
    from cwtrain.integrations.gym.model_server import (
        ChatRenderer,
        ChatTokenizer,
        GymModel,
        GymModelError,
        GymModelServer,
    )
    from cwtrain.integrations.gym.scores import AgentScore, GymScores, read_scores

_LAZY = {
    "CheckedCollector": "cwtrain.integrations.gym.collect",
    "CollectionJob": "cwtrain.integrations.gym.collect",
    "CollectionResult": "cwtrain.integrations.gym.collect",
    "Collector": "cwtrain.integrations.gym.collect",
    "GymCLICollector": "cwtrain.integrations.gym.collect",
    "GymEndpoint": "cwtrain.integrations.gym.collect",
    "policy_overlay": "cwtrain.integrations.gym.collect",
    "require_gym": "cwtrain.integrations.gym.collect",
    "AgentScore": "cwtrain.integrations.gym.scores",
    "GymScores": "cwtrain.integrations.gym.scores",
    "read_scores": "cwtrain.integrations.gym.scores",
    "GymEvalResult": "cwtrain.integrations.gym.evaluation",
    "evaluate": "cwtrain.integrations.gym.evaluation",
    "load_request": "cwtrain.integrations.gym.evaluation",
    "ChatRenderer": "cwtrain.integrations.gym.model_server",
    "ChatTokenizer": "cwtrain.integrations.gym.model_server",
    "GymModel": "cwtrain.integrations.gym.model_server",
    "GymModelError": "cwtrain.integrations.gym.model_server",
    "GymModelServer": "cwtrain.integrations.gym.model_server",
}

__all__ = [
    "AgentScore",
    "ChatRenderer",
    "ChatTokenizer",
    "CheckedCollector",
    "CollectionJob",
    "CollectionResult",
    "Collector",
    "GymCLICollector",
    "GymEndpoint",
    "GymEvalResult",
    "GymModel",
    "GymModelError",
    "GymModelServer",
    "GymNotInstalledError",
    "GymScores",
    "evaluate",
    "load_request",
    "policy_overlay",
    "read_scores",
    "require_gym",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
