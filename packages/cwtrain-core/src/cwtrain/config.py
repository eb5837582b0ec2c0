"""Every environment variable cwtrain reads, declared once, and strict parsers for them.

Precedence everywhere: explicit argument, then framework config key, then the
variable, then the default. Booleans accept ``1/true/yes/on`` and ``0/false/no/off``
(any case); a blank value counts as unset; anything else is a :class:`ConfigError`
naming the variable. Numbers are parsed strictly and range-checked.

``docs/configuration.md`` is generated from :data:`VARIABLES` (a test keeps them equal).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from cwtrain.errors import ConfigError

__all__ = [
    "VARIABLES",
    "EnvVar",
    "env_bool",
    "env_float",
    "env_int",
    "env_str",
    "environ_or",
    "parse_bool",
]


@dataclass(frozen=True)
class EnvVar:
    """One environment variable: its name, default (as documented) and meaning."""

    name: str
    default: str
    description: str
    secret: bool = False


_DECLARED: tuple[EnvVar, ...] = (
    # control plane
    EnvVar("COREWEAVE_API_TOKEN", "-", "API token, first choice", secret=True),
    EnvVar("CW_API_TOKEN", "-", "fallback API token", secret=True),
    EnvVar("COREWEAVE_API_URL", "https://api.coreweave.com", "API origin"),
    EnvVar("CWTRAIN_API_HEADERS", "-", "JSON object of extra API headers, applied last", secret=True),
    EnvVar("CWTRAIN_API_INSECURE", "false", "skip TLS verification of the API (development only)"),
    # hot-load
    EnvVar("CWTRAIN_HOTLOAD_DEPLOYMENT_ID", "required (integrations, preflight)", "target deployment"),
    EnvVar("CWTRAIN_HOTLOAD_RUN_ID", "see snapshot format section 2", "identity prefix; at most 120 chars, no /"),
    EnvVar("CWTRAIN_HOTLOAD_WAIT", "true", "wait for each hot-load to complete; false = one step ahead"),
    EnvVar(
        "CWTRAIN_HOTLOAD_TIMEOUT",
        "1800",
        "seconds > 0; one budget per publish, re-activation and canary included: once the hot-load is created, a quarter of what is left is held back from the wait for bringing the fleet back after a failure (`on_failure=reactivate`), and a tenth for the canary when one is given (a share left unused passes on); a publish ends within it plus one poll",
    ),
    EnvVar("CWTRAIN_HOTLOAD_PUBLISH_BASELINE", "true", "publish <run>-v000000 unless an identical one completed"),
    EnvVar(
        "CWTRAIN_HOTLOAD_ROLLBACK_ON_RESUME",
        "false",
        "a restarted trainer's baseline points the fleet back at <run>-v000000 even when it serves a later "
        "version of the run; false = the fleet keeps it and the restart's first version is FULL",
    ),
    EnvVar(
        "CWTRAIN_HOTLOAD_CANARY_BOUND",
        "0.05",
        "nats > 0, or off: slime, miles and NeMo-RL refuse a served version whose samples' log-probs differ from "
        "the trainer's by more than this (mean over a sample's tokens, largest sample) as a failed hot-load",
    ),
    EnvVar(
        "CWTRAIN_HOTLOAD_FULL_EVERY",
        "auto",
        "auto (FULL when a delta costs nearly a FULL, when a cold start would replay too much, or after 19 "
        "deltas) or an integer 0-64 (a FULL snapshot every N versions; 0 = never)",
    ),
    EnvVar(
        "CWTRAIN_HOTLOAD_FULL_SHARE",
        "0.9",
        "auto: a delta of at least this share of the last FULL's bytes is published FULL, in (0, 1]",
    ),
    EnvVar(
        "CWTRAIN_HOTLOAD_REPLAY_BUDGET",
        "2",
        "auto: the deltas since the last FULL hold at most this many FULLs' bytes, > 0",
    ),
    EnvVar("CWTRAIN_HOTLOAD_MIRROR", "on unless FULL_EVERY=0", "keep a byte-exact copy of the served weights"),
    EnvVar(
        "CWTRAIN_HOTLOAD_VERIFY",
        "false",
        "read the replicas once more after completion and require every one READY on the identity (`hotload/replicas_verified`). Whatever it says, a version succeeds only when every replica the service lists serves it once its hot-load completed (`hotload/converged`); a split fleet fails the version like a FAILED hot-load",
    ),
    EnvVar("CWTRAIN_HOTLOAD_STATE_DIR", "framework dependent", "local working directory of the integrations"),
    EnvVar("CWTRAIN_HOTLOAD_PROMPT_CACHE_POLICY", "unset", "preserve or reset_all"),
    EnvVar("CWTRAIN_HOTLOAD_UPLOAD_WORKERS", "8", "files uploaded in parallel, >= 1"),
    EnvVar(
        "CWTRAIN_HOTLOAD_ON_FAILURE",
        "reactivate",
        "reactivate or stop: after a FAILED or CANCELED hot-load, a split fleet, or a refused verification or "
        "canary, bring every replica back to the newest identity that completed whose whole chain is stored and "
        "matches its recorded SHA-256s (older ones are tried in turn; none: the run stops naming what is missing; "
        "the integrations' default), or raise as before",
    ),
    EnvVar("CWTRAIN_HOTLOAD_PART_SIZE", "67108864", "multipart part size in bytes, >= 50 MB"),
    EnvVar(
        "CWTRAIN_HOTLOAD_MEMORY_BUDGET",
        "1073741824",
        "bytes of encoded data in flight while publishing, and of decoders while applying or verifying",
    ),
    # rollout
    EnvVar("CWTRAIN_ROLLOUT_BASE_URL", "required", "OpenAI base URL ending in /v1"),
    EnvVar("CWTRAIN_ROLLOUT_MODEL", "required", "the deployment's spec.model.name"),
    EnvVar("CWTRAIN_ROLLOUT_API_KEY", "-", "endpoint bearer key", secret=True),
    EnvVar("CWTRAIN_ROLLOUT_API_KEY_FILE", "-", "file holding the key, used when API_KEY is empty"),
    EnvVar("CWTRAIN_ROLLOUT_CONCURRENCY", "16", "group requests in flight, >= 1"),
    EnvVar("CWTRAIN_ROLLOUT_TIMEOUT", "600", "seconds per request, finite > 0"),
    EnvVar("CWTRAIN_ROLLOUT_MAX_ATTEMPTS", "6", "tries per request, >= 1"),
    EnvVar("CWTRAIN_ROLLOUT_LOGPROBS", "true", "request sampled-token log-probs"),
    EnvVar("CWTRAIN_ROLLOUT_TOKEN_IDS", "true", "request exact token ids"),
    EnvVar("CWTRAIN_ROLLOUT_TOKEN_ID_PROMPTS", "true", "send prompts as token ids"),
    EnvVar("CWTRAIN_ROLLOUT_ROUTED_EXPERTS", "false", "request MoE routes"),
    EnvVar("CWTRAIN_ROLLOUT_SEEDS", "true", "random seed on each request of a split group"),
    EnvVar(
        "CWTRAIN_GYM_MODEL_TOKEN",
        "random, printed",
        "bearer token of the standalone Gym model server, python -m cwtrain.integrations.gym.model_server (Gym's "
        "policy_api_key)",
        secret=True,
    ),
    EnvVar(
        "CWTRAIN_ROLLOUT_MAX_STALENESS",
        "unset (no limit)",
        "integer >= 0; a completion served more than K versions behind the newest published, by another "
        "run's identity, by a version newer than the newest published or by a burned one, is re-requested",
    ),
    # object storage
    EnvVar("AWS_REGION", "required", "the bucket's availability zone, e.g. US-EAST-04A"),
    EnvVar("CW_S3_ENDPOINT", "AWS config, else https://cwobject.com", "S3 endpoint"),
    EnvVar("CW_S3_MAX_POOL", "128", "S3 connection pool, min 10"),
    EnvVar("RANK", "0", "rank of the slime/miles hook when neither args nor torch.distributed give one"),
    # local stack and debugging
    EnvVar("CWTRAIN_DEBUG", "false", "show tracebacks in the CLI, like -v"),
)

VARIABLES: Mapping[str, EnvVar] = {var.name: var for var in _DECLARED}

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def _declared(name: str) -> None:
    if name not in VARIABLES:
        raise KeyError(f"{name} is not declared in cwtrain.config.VARIABLES")


def environ_or(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    """The mapping to read: the given one, else ``os.environ``."""
    return os.environ if environ is None else environ


def env_str(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The stripped value of a declared variable, or ``None`` when unset or blank."""
    _declared(name)
    value = environ_or(environ).get(name)
    if value is None or not value.strip():
        return None
    return value.strip()


def parse_bool(value: str, what: str) -> bool:
    """Parse a boolean the way every cwtrain variable does; ``what`` names the input."""
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(f"{what}={value!r} is not a boolean (use 1/true/yes/on or 0/false/no/off)")


def env_bool(name: str, default: bool, environ: Mapping[str, str] | None = None) -> bool:
    """A boolean variable; blank or unset gives ``default``."""
    value = env_str(name, environ)
    return default if value is None else parse_bool(value, name)


def env_int(
    name: str,
    default: int,
    environ: Mapping[str, str] | None = None,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
) -> int:
    """An integer variable, range-checked; blank or unset gives ``default``."""
    value = env_str(name, environ)
    if value is None:
        return default
    try:
        number = int(value, 10)
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not an integer") from None
    if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
        bounds = f"{'-inf' if minimum is None else minimum}..{'inf' if maximum is None else maximum}"
        raise ConfigError(f"{name}={value!r} is out of range ({bounds})")
    return number


def env_float(
    name: str,
    default: float,
    environ: Mapping[str, str] | None = None,
    *,
    positive: bool = True,
) -> float:
    """A finite float variable (``> 0`` unless ``positive=False``); blank or unset gives ``default``."""
    value = env_str(name, environ)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not a number") from None
    if not math.isfinite(number) or (positive and number <= 0):
        raise ConfigError(f"{name}={value!r} must be a finite number{' > 0' if positive else ''}")
    return number
