"""``policy.generation.coreweave_cfg``: the backend's settings, with variables as fallback.

Precedence (interface.md §2): a key in ``coreweave_cfg`` beats the matching variable,
which beats the default. Rollout keys map onto ``CWTRAIN_ROLLOUT_*`` (core's
``RolloutConfig``), hot-load keys onto ``CWTRAIN_HOTLOAD_*`` (core's ``HotLoadSettings``,
whose rules and defaults are every framework's: a run id is 1-120 characters, one path
segment, not ``.`` or ``..``); errors name the config key when it was the source.
NeMo-RL's own rules: ``hotload_timeout`` falls back to ``timeout`` when that is set in the
config, and ``state_dir`` must be an absolute path.

The keys, their variables and defaults: ``docs/nemo-rl.md`` ("The YAML to set"; a test keeps it complete).
"""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cwtrain.config import environ_or
from cwtrain.errors import ConfigError
from cwtrain.hotload import HotLoadSettings
from cwtrain.integrations.rollout import FIELD_VARIABLES, RolloutConfig

__all__ = ["CFG_KEY", "CoreWeaveConfig", "default_run_id"]

#: Where the settings live in a NeMo-RL master config.
CFG_KEY = "policy.generation.coreweave_cfg"

# coreweave_cfg keys that name a RolloutConfig field read their CWTRAIN_ROLLOUT_* variable;
# routed experts stay off for NeMo-RL.
_ROLLOUT_VARS = {
    **{key: var for key, var in FIELD_VARIABLES.items() if key != "routed_experts"},
    "api_key_file": "CWTRAIN_ROLLOUT_API_KEY_FILE",
}
_HOTLOAD_VARS = {
    "deployment_id": "CWTRAIN_HOTLOAD_DEPLOYMENT_ID",
    "run_id": "CWTRAIN_HOTLOAD_RUN_ID",
    "full_every": "CWTRAIN_HOTLOAD_FULL_EVERY",
    "verify": "CWTRAIN_HOTLOAD_VERIFY",
    "wait": "CWTRAIN_HOTLOAD_WAIT",
    "hotload_timeout": "CWTRAIN_HOTLOAD_TIMEOUT",
    "state_dir": "CWTRAIN_HOTLOAD_STATE_DIR",
    "prompt_cache_policy": "CWTRAIN_HOTLOAD_PROMPT_CACHE_POLICY",
    "upload_workers": "CWTRAIN_HOTLOAD_UPLOAD_WORKERS",
    "on_failure": "CWTRAIN_HOTLOAD_ON_FAILURE",
}
_OWN_KEYS = {"require_logprobs", "importance_sampling", "max_model_len"}
KNOWN_KEYS = frozenset(_ROLLOUT_VARS) | frozenset(_HOTLOAD_VARS) | _OWN_KEYS


def default_run_id(now: _dt.datetime | None = None) -> str:
    """``nemo-rl-<UTC %Y%m%dT%H%M%SZ>`` (snapshot-format.md §2)."""
    moment = now or _dt.datetime.now(_dt.UTC)
    return "nemo-rl-" + moment.astimezone(_dt.UTC).strftime("%Y%m%dT%H%M%SZ")


def _fold(cfg: Mapping[str, Any], table: Mapping[str, str], env: Mapping[str, str]) -> dict[str, str]:
    """Variables with the config keys written over them (config beats variable)."""
    merged = dict(env)
    for key, var in table.items():
        value = cfg.get(key)
        if value is None:
            continue
        merged[var] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return merged


def _hotload_settings(cfg: Mapping[str, Any], env: Mapping[str, str]) -> HotLoadSettings:
    """Core's :class:`~cwtrain.hotload.HotLoadSettings` from ``coreweave_cfg`` over the variables.

    Raises:
        ConfigError: a bad value, naming the config key when it was the source.
    """
    labels = {var: f"{CFG_KEY}.{key}" for key, var in _HOTLOAD_VARS.items() if key in cfg}
    folded = _fold(cfg, _HOTLOAD_VARS, env)
    if "hotload_timeout" not in cfg and "timeout" in cfg:  # the per-request timeout is the budget too
        folded["CWTRAIN_HOTLOAD_TIMEOUT"] = str(cfg["timeout"])
        labels["CWTRAIN_HOTLOAD_TIMEOUT"] = f"{CFG_KEY}.timeout"
    settings = HotLoadSettings.from_env(
        folded, labels=labels, require_deployment=False, default_run_id=default_run_id()
    )
    if settings.state_dir and not os.path.isabs(settings.state_dir):
        key = labels.get("CWTRAIN_HOTLOAD_STATE_DIR", "CWTRAIN_HOTLOAD_STATE_DIR")
        raise ConfigError(f"{key}={settings.state_dir!r} must be an absolute path visible to the driver and rank 0")
    return settings


@dataclass(frozen=True)
class CoreWeaveConfig:
    """The whole backend config: rollout sampler settings plus hot-load settings."""

    rollout: RolloutConfig
    hotload: HotLoadSettings
    max_model_len: int | None = None
    importance_sampling: bool = False

    @classmethod
    def from_generation_config(
        cls, generation_config: Mapping[str, Any], environ: Mapping[str, str] | None = None
    ) -> CoreWeaveConfig:
        """Read ``coreweave_cfg`` from NeMo-RL's ``policy.generation`` dict, variables as fallback.

        Raises:
            ConfigError: an unknown key, a missing required value, or a bad value; the message
                names the config key (or the variable when that was the source).
        """
        cfg = dict(generation_config.get("coreweave_cfg") or {})
        unknown = sorted(set(cfg) - KNOWN_KEYS)
        if unknown:
            raise ConfigError(f"{CFG_KEY} has unknown key(s) {unknown}; known: {sorted(KNOWN_KEYS)}")
        env = environ_or(environ)
        labels = {var: f"{CFG_KEY}.{key}" for key, var in _ROLLOUT_VARS.items() if key in cfg}
        require = cfg.get("require_logprobs", True)
        importance = bool(cfg.get("importance_sampling", False))
        if importance:
            temperature = float(generation_config.get("temperature", 1.0))
            top_p = float(generation_config.get("top_p", 1.0))
            top_k = generation_config.get("top_k")
            if temperature != 1.0 or top_p != 1.0 or (top_k not in (None, 0, -1)):
                raise ConfigError(
                    f"{CFG_KEY}.importance_sampling needs temperature 1, top_p 1 and no top_k "
                    f"(got temperature={temperature}, top_p={top_p}, top_k={top_k})"
                )
        rollout = RolloutConfig.from_env(
            _fold(cfg, _ROLLOUT_VARS, env), labels=labels, routed_experts=False, require_logprobs=bool(require)
        )
        max_len = cfg.get("max_model_len")
        if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 2):
            raise ConfigError(f"{CFG_KEY}.max_model_len={max_len!r} must be an integer >= 2")
        return cls(
            rollout=rollout,
            hotload=_hotload_settings(cfg, env),
            max_model_len=max_len,
            importance_sampling=importance,
        )
