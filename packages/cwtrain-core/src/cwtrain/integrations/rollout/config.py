"""``RolloutConfig``: where and how the rollout sampler asks for completions.

Precedence: explicit argument, then framework config key (callers fold those into the
``environ`` they pass and name them through ``labels``), then ``CWTRAIN_ROLLOUT_*``,
then the default.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from cwtrain.config import env_bool, env_float, env_int, env_str, environ_or
from cwtrain.errors import ConfigError

__all__ = ["FIELD_VARIABLES", "RolloutConfig"]

log = logging.getLogger("cwtrain.integrations.rollout")

FIELD_VARIABLES = {
    "base_url": "CWTRAIN_ROLLOUT_BASE_URL",
    "model": "CWTRAIN_ROLLOUT_MODEL",
    "api_key": "CWTRAIN_ROLLOUT_API_KEY",
    "concurrency": "CWTRAIN_ROLLOUT_CONCURRENCY",
    "timeout": "CWTRAIN_ROLLOUT_TIMEOUT",
    "max_attempts": "CWTRAIN_ROLLOUT_MAX_ATTEMPTS",
    "logprobs": "CWTRAIN_ROLLOUT_LOGPROBS",
    "token_ids": "CWTRAIN_ROLLOUT_TOKEN_IDS",
    "token_id_prompts": "CWTRAIN_ROLLOUT_TOKEN_ID_PROMPTS",
    "routed_experts": "CWTRAIN_ROLLOUT_ROUTED_EXPERTS",
    "seeds": "CWTRAIN_ROLLOUT_SEEDS",
    "max_staleness": "CWTRAIN_ROLLOUT_MAX_STALENESS",
}

# slime/miles flags that replace the part of the rollout cwtrain owns (interface.md §4.4).
_REFUSED_FLAGS = (
    "custom_generate_function_path",
    "dynamic_sampling_filter_path",
    "rollout_sample_filter_path",
    "rollout_all_samples_process_path",
    "use_session_server",
)


def _flag(attribute: str) -> str:
    return "--" + attribute.replace("_", "-")


@dataclass(frozen=True)
class RolloutConfig:
    """Settings of the rollout sampler (interface.md §4); fields may be given positionally.

    Attributes:
        base_url: OpenAI base URL ending in ``/v1`` (the deployment's ``rollout_base_url``);
            a trailing ``/`` is stripped.
        model: the deployment's ``spec.model.name``, sent as ``model``.
        api_key: endpoint bearer key; never shown in ``repr`` or logs.
        concurrency: group requests in flight (counted in sequences: see ``CompletionSampler``).
        timeout: wall-clock deadline of one HTTP request, in seconds.
        max_attempts: tries per request (retries per §4.2).
        logprobs: request the sampled tokens' log-probs (``logprobs: 1``).
        token_ids: request exact token ids (``return_token_ids``, ``return_tokens_as_token_ids``).
        token_id_prompts: send prompts as token ids (fallback to text decided by the endpoint).
        routed_experts: split each group into ``n = 1`` requests asking for MoE routes.
        require_logprobs: a group without log-probs is re-sampled (twice), then fails.
        seeds: a random seed on every ``n = 1`` request a group is split into.
        max_staleness: ``K``: a completion served by an identity more than ``K`` versions
            behind the newest version the trainer published, or by another run's identity,
            is re-requested instead of returned (``None``: no limit); so is one served by a
            version newer than the newest published, or by a burned one
            (:meth:`~cwtrain.integrations.rollout.CompletionSampler.note_burned`). It takes
            effect once the sampler knows its run and the newest version
            (:meth:`~cwtrain.integrations.rollout.CompletionSampler.note_published`).

    Raises:
        ConfigError: a value out of range or an impossible combination.
    """

    base_url: str
    model: str
    api_key: str | None = field(default=None, repr=False)
    concurrency: int = 16
    timeout: float = 600.0
    max_attempts: int = 6
    logprobs: bool = True
    token_ids: bool = True
    token_id_prompts: bool = True
    routed_experts: bool = False
    require_logprobs: bool = False
    seeds: bool = True
    max_staleness: int | None = None

    def __post_init__(self) -> None:
        base = (self.base_url or "").strip().rstrip("/")
        if not base:
            raise ConfigError("RolloutConfig.base_url is empty: set CWTRAIN_ROLLOUT_BASE_URL to the endpoint's /v1 URL")
        if not base.startswith(("http://", "https://")):
            raise ConfigError(f"RolloutConfig.base_url={base!r} is not an http(s) URL (expected https://…/v1)")
        object.__setattr__(self, "base_url", base)
        if not (self.model or "").strip():
            raise ConfigError("RolloutConfig.model is empty: set CWTRAIN_ROLLOUT_MODEL to the deployment's model name")
        if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int) or self.concurrency < 1:
            raise ConfigError(f"RolloutConfig.concurrency={self.concurrency!r} must be an integer >= 1")
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ConfigError(f"RolloutConfig.max_attempts={self.max_attempts!r} must be an integer >= 1")
        try:
            timeout = float(self.timeout)
        except (TypeError, ValueError):
            raise ConfigError(f"RolloutConfig.timeout={self.timeout!r} is not a number") from None
        if not math.isfinite(timeout) or timeout <= 0:
            raise ConfigError(f"RolloutConfig.timeout={self.timeout!r} must be a finite number of seconds > 0")
        object.__setattr__(self, "timeout", timeout)
        if self.routed_experts and not (self.logprobs and self.token_ids and self.token_id_prompts):
            raise ConfigError(
                "routed experts need log-probs, token ids and token-id prompts: set CWTRAIN_ROLLOUT_LOGPROBS, "
                "CWTRAIN_ROLLOUT_TOKEN_IDS and CWTRAIN_ROLLOUT_TOKEN_ID_PROMPTS to true, or turn routed experts off"
            )
        if self.max_staleness is not None and (
            isinstance(self.max_staleness, bool) or not isinstance(self.max_staleness, int) or self.max_staleness < 0
        ):
            raise ConfigError(f"RolloutConfig.max_staleness={self.max_staleness!r} must be an integer >= 0 or None")
        if self.require_logprobs and not self.logprobs:
            raise ConfigError("require_logprobs needs log-probs: set CWTRAIN_ROLLOUT_LOGPROBS=true")

    @property
    def completions_url(self) -> str:
        """``{base_url}/completions``."""
        return f"{self.base_url}/completions"

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        labels: Mapping[str, str] | None = None,
        **overrides: Any,
    ) -> RolloutConfig:
        """Build the config from ``CWTRAIN_ROLLOUT_*`` (interface.md §2).

        Args:
            environ: the variables to read (default ``os.environ``). Framework integrations
                fold their config keys (e.g. ``coreweave_cfg.*``) into it first.
            labels: how to name an input in error messages, keyed by field name or variable
                name, e.g. ``{"base_url": "policy.generation.coreweave_cfg.base_url"}``.
            **overrides: explicit field values; they win over every variable.

        Raises:
            ConfigError: a required value is missing or a value is invalid; the message names
                the variable (or its label) and the fix.
        """
        env = environ_or(environ)
        names = dict(labels or {})
        unknown = set(overrides) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"RolloutConfig has no field(s) {sorted(unknown)}")

        def label(name: str) -> str:
            var = FIELD_VARIABLES.get(name, name)
            return names.get(name) or names.get(var) or var

        def relabel(exc: ConfigError, name: str) -> ConfigError:
            var = FIELD_VARIABLES[name]
            shown = label(name)
            return ConfigError(str(exc).replace(var, shown)) if shown != var else exc

        values: dict[str, Any] = {}
        for name in ("base_url", "model"):
            if name not in overrides:
                value = env_str(FIELD_VARIABLES[name], env)
                if value is None:
                    what = "the endpoint's OpenAI base URL ending in /v1" if name == "base_url" else "the model name"
                    raise ConfigError(f"{label(name)} is not set: give {what} (the deployment's spec)")
                values[name] = value
        if "api_key" not in overrides:
            values["api_key"] = _api_key(env, label)
        for name, default, minimum in (("concurrency", 16, 1), ("max_attempts", 6, 1)):
            if name not in overrides:
                try:
                    values[name] = env_int(FIELD_VARIABLES[name], default, env, minimum=minimum)
                except ConfigError as exc:
                    raise relabel(exc, name) from None
        if "max_staleness" not in overrides and env_str(FIELD_VARIABLES["max_staleness"], env) is not None:
            try:
                values["max_staleness"] = env_int(FIELD_VARIABLES["max_staleness"], 0, env, minimum=0)
            except ConfigError as exc:
                raise relabel(exc, "max_staleness") from None
        if "timeout" not in overrides:
            try:
                values["timeout"] = env_float(FIELD_VARIABLES["timeout"], 600.0, env)
            except ConfigError as exc:
                raise relabel(exc, "timeout") from None
        for name, flag_default in (
            ("logprobs", True),
            ("token_ids", True),
            ("token_id_prompts", True),
            ("routed_experts", False),
            ("seeds", True),
        ):
            if name not in overrides:
                try:
                    values[name] = env_bool(FIELD_VARIABLES[name], flag_default, env)
                except ConfigError as exc:
                    raise relabel(exc, name) from None
        values.update(overrides)
        return cls(**values)

    @classmethod
    def for_trainer(cls, args: Any, environ: Mapping[str, str] | None = None, **overrides: Any) -> RolloutConfig:
        """The config for a slime/miles run, checked against its flags (interface.md §4.4).

        Routes follow ``args.use_rollout_routing_replay``. Any of ``use_tis``,
        ``use_rollout_logprobs``, ``get_mismatch_metrics`` makes log-probs required and needs
        ``rollout_temperature == 1.0`` (only a warning when ``get_mismatch_metrics`` is the
        sole one).

        Args:
            args: the trainer's ``argparse.Namespace``.
            environ: the variables to read (default ``os.environ``).
            **overrides: explicit field values.

        Raises:
            ConfigError: a refused flag is set (named in the message), or the flags need
                something the configuration turns off.
        """
        for attribute in _REFUSED_FLAGS:
            if getattr(args, attribute, None):
                raise ConfigError(
                    f"{_flag(attribute)} is not supported with cwtrain rollouts (the completions endpoint "
                    f"samples each group in one request); remove {_flag(attribute)}"
                )
        over = getattr(args, "over_sampling_batch_size", None)
        batch = getattr(args, "rollout_batch_size", None)
        if over is not None and batch is not None and over > batch:
            raise ConfigError(
                f"--over-sampling-batch-size {over} is above --rollout-batch-size {batch}; cwtrain samples exactly "
                "the groups it trains on: set --over-sampling-batch-size to at most --rollout-batch-size"
            )
        config = cls.from_env(environ, **overrides)
        changes: dict[str, Any] = {}
        if "routed_experts" not in overrides:
            changes["routed_experts"] = bool(getattr(args, "use_rollout_routing_replay", False))
        users = [
            name for name in ("use_tis", "use_rollout_logprobs", "get_mismatch_metrics") if getattr(args, name, False)
        ]
        if users:
            if not config.logprobs:
                raise ConfigError(
                    f"{', '.join(_flag(u) for u in users)} need rollout log-probs: set CWTRAIN_ROLLOUT_LOGPROBS=true"
                )
            if "require_logprobs" not in overrides:
                changes["require_logprobs"] = True
            temperature = getattr(args, "rollout_temperature", 1.0)
            if temperature != 1.0:
                if users == ["get_mismatch_metrics"]:
                    log.warning(
                        "--get-mismatch-metrics with --rollout-temperature %s: the endpoint's log-probs are "
                        "not tempered like the trainer's; the mismatch metrics will be biased",
                        temperature,
                    )
                else:
                    raise ConfigError(
                        f"{', '.join(_flag(u) for u in users)} need --rollout-temperature 1.0 (got {temperature}): "
                        "the endpoint returns log-probs of the untempered distribution"
                    )
        return replace(config, **changes) if changes else config


def _api_key(env: Mapping[str, str], label: Any) -> str | None:
    key = env_str("CWTRAIN_ROLLOUT_API_KEY", env)
    if key is not None:
        return key
    path = env_str("CWTRAIN_ROLLOUT_API_KEY_FILE", env)
    if path is None:
        return None
    file = Path(path).expanduser()
    if not file.is_file():
        log.debug("%s=%s does not exist; no endpoint key", label("CWTRAIN_ROLLOUT_API_KEY_FILE"), path)
        return None
    try:
        text = file.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"cannot read {label('CWTRAIN_ROLLOUT_API_KEY_FILE')}={path}: {exc.strerror}") from None
    return text or None
