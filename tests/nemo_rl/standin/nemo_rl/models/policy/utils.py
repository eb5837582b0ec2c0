from typing import Any


def get_runtime_env_for_policy_worker(policy_worker_name: str) -> dict[str, Any]:
    return {"env_vars": {"NEMO_RL_STANDIN_WORKER": policy_worker_name}}
