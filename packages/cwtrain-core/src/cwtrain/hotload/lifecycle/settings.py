"""The hot-load settings of a run, declared once: :class:`HotLoadSettings`.

Every publisher (slime's and miles' hooks, slime's live-tensor actor, the NeMo-RL
synchronizer, the demo) and ``cwtrain hotload`` read the ``CWTRAIN_HOTLOAD_*`` variables
through this one class; a plug-in only maps its framework's config keys onto it (``labels``
makes an error name the key the user wrote)::

    settings = HotLoadSettings.from_env(default_run_id="grpo-20261203T101500Z")
    settings = HotLoadSettings.from_env(env, labels={"CWTRAIN_HOTLOAD_TIMEOUT": "coreweave_cfg.hotload_timeout"})
    settings = HotLoadSettings("3b1d2c54-...", "run1", timeout=600.0)     # explicit values

Precedence: an explicit value (a keyword of :meth:`HotLoadSettings.from_env`, or a
framework config key mapped onto its variable) beats the variable, which beats the default.
The defaults are the dataclass fields' (declared once; :func:`default_of` reads them) and
``docs/configuration.md`` is rendered from them (a test keeps the two equal).

Run ids are checked by one rule for every framework (:func:`validate_run_id`): 1-120
characters that make a valid identity ``<run>-vNNNNNN`` (one path segment, not ``.`` or
``..``, no control or format characters).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Self

from cwtrain.config import env_bool, env_float, env_int, env_str, environ_or
from cwtrain.errors import ConfigError, SnapshotError
from cwtrain.hotload.format.identity import validate_identity, version_identity
from cwtrain.hotload.lifecycle.cadence import (
    DEFAULT_FULL_EVERY,
    DEFAULT_FULL_SHARE,
    DEFAULT_REPLAY_BUDGET,
    FullEvery,
    check_full_every,
    check_full_share,
    check_replay_budget,
    parse_full_every,
)
from cwtrain.infra.enums import PromptCachePolicy

if TYPE_CHECKING:
    from cwtrain.infra.client import InferenceClient

__all__ = [
    "DEFAULT_API_BASE_URL",
    "DEFAULT_TIMEOUT",
    "FAILURE_POLICIES",
    "FIELD_VARIABLES",
    "MAX_RUN_ID",
    "HotLoadSettings",
    "default_of",
    "parse_prompt_cache_policy",
    "validate_run_id",
]

#: The API origin when ``COREWEAVE_API_URL`` is unset.
DEFAULT_API_BASE_URL = "https://api.coreweave.com"
#: Seconds one publish may take, everything included (``CWTRAIN_HOTLOAD_TIMEOUT``).
DEFAULT_TIMEOUT = 1800.0
#: The longest run id: identities ``<run>-vNNNNNN`` stay within 128 characters.
MAX_RUN_ID = 120
#: What a failed hot-load leads to (``HotLoadSettings.on_failure``).
FAILURE_POLICIES = ("reactivate", "stop")

#: The variable each setting is read from (its default is the field's, declared once below;
#: ``docs/configuration.md`` is rendered from both).
FIELD_VARIABLES: Mapping[str, str] = {
    "deployment_id": "CWTRAIN_HOTLOAD_DEPLOYMENT_ID",
    "run_id": "CWTRAIN_HOTLOAD_RUN_ID",
    "wait": "CWTRAIN_HOTLOAD_WAIT",
    "timeout": "CWTRAIN_HOTLOAD_TIMEOUT",
    "publish_baseline": "CWTRAIN_HOTLOAD_PUBLISH_BASELINE",
    "full_every": "CWTRAIN_HOTLOAD_FULL_EVERY",
    "mirror": "CWTRAIN_HOTLOAD_MIRROR",
    "verify": "CWTRAIN_HOTLOAD_VERIFY",
    "state_dir": "CWTRAIN_HOTLOAD_STATE_DIR",
    "prompt_cache_policy": "CWTRAIN_HOTLOAD_PROMPT_CACHE_POLICY",
    "upload_workers": "CWTRAIN_HOTLOAD_UPLOAD_WORKERS",
    "on_failure": "CWTRAIN_HOTLOAD_ON_FAILURE",
    "api_base_url": "COREWEAVE_API_URL",
    "api_headers": "CWTRAIN_API_HEADERS",
    "api_insecure": "CWTRAIN_API_INSECURE",
    "full_share": "CWTRAIN_HOTLOAD_FULL_SHARE",
    "replay_budget": "CWTRAIN_HOTLOAD_REPLAY_BUDGET",
    "rollback_on_resume": "CWTRAIN_HOTLOAD_ROLLBACK_ON_RESUME",
    "canary_bound": "CWTRAIN_HOTLOAD_CANARY_BOUND",
}


def validate_run_id(run_id: str, what: str = "run id") -> str:
    """Check a run id by the one rule every framework uses; returns it.

    1-120 characters, and ``<run_id>-v000000`` must be a valid identity: one path segment
    (no ``/``, not ``.`` or ``..``), no control, format or separator characters.

    Raises:
        ConfigError: naming ``what`` (the variable or config key it came from) and the rule.
    """
    problem = ""
    if not isinstance(run_id, str) or not run_id:
        problem = "it is empty"
    elif len(run_id) > MAX_RUN_ID:
        problem = f"it has {len(run_id)} characters, at most {MAX_RUN_ID} are allowed"
    elif run_id in (".", ".."):
        problem = "'.' and '..' are not path segments"
    else:
        try:
            validate_identity(version_identity(run_id, 0))
        except SnapshotError as exc:
            problem = str(exc).split(": ", 1)[-1]
    if problem:
        raise ConfigError(
            f"{what}={run_id!r} is not a usable run id: {problem} (identities are <run>-vNNNNNN: "
            f"1-{MAX_RUN_ID} printable characters, one path segment, no '/')"
        )
    return run_id


def parse_prompt_cache_policy(value: str | PromptCachePolicy | None, what: str) -> PromptCachePolicy:
    """Parse a prompt cache policy strictly: ``preserve``, ``reset_all``, prefixed names or integers.

    Raises:
        ConfigError: naming ``what``.
    """
    if value is None:
        return PromptCachePolicy.UNSPECIFIED
    if isinstance(value, PromptCachePolicy):
        return value
    text = value.strip().upper()
    if not text:
        return PromptCachePolicy.UNSPECIFIED
    if text.isdigit():
        try:
            return PromptCachePolicy(int(text))
        except ValueError:
            pass
    text = text.removeprefix("PROMPT_CACHE_POLICY_")
    if text in PromptCachePolicy.__members__:
        return PromptCachePolicy[text]
    raise ConfigError(f"{what}={value!r} is not a prompt cache policy (use preserve or reset_all)")


@dataclass(frozen=True)
class HotLoadSettings:
    """How a run publishes its versions to one deployment.

    Fields may be passed positionally in this order (slime's ``HookConfig`` keeps the order
    interface.md §3 gives). Build one from the environment with :meth:`from_env`.

    Attributes:
        deployment_id: the deployment that receives every version (empty: not set; a
            publish then refuses to start).
        run_id: identity prefix; identities are ``<run_id>-v{N:06d}``.
        wait: wait for each hot-load to complete; ``False`` = one step ahead (the next publish
            waits for the previous one through single-flight).
        timeout: seconds one publish may take, everything included: encode, upload,
            readiness, single-flight, completion and verification.
        publish_baseline: publish the base checkpoint as ``<run>-v000000`` (skipped when an
            identical one completed); ``False`` asserts that it exists.
        full_every: ``"auto"`` (FULL when a delta costs nearly as much as a FULL, or the chain
            would make a cold start replay too much: :mod:`~cwtrain.hotload.lifecycle.cadence`),
            or a FULL snapshot every N versions (0-64; 0 never cuts the chain by count).
        mirror: keep a byte-exact copy of the served weights; ``None`` = on unless ``full_every`` is 0.
        verify: require every replica READY on the identity after completion.
        state_dir: the local working directory (the served-identity file, staging); empty =
            the framework's default.
        prompt_cache_policy: sent with each hot-load (UNSPECIFIED omits the field).
        upload_workers: files uploaded in parallel.
        api_base_url: the API origin.
        api_headers: extra API headers (may hold secrets; never shown in ``repr``).
        api_insecure: skip TLS verification of the API.
        on_failure: what a hot-load that ends FAILED or CANCELED, or completes with replicas
            not caught up (``verify``) or serving weights the canary refuses, leads to:
            ``reactivate`` brings every replica back to the newest intact identity that
            completed and the publish returns a failed outcome (the next version is FULL);
            ``stop`` raises.
        full_share: ``auto``: a delta of at least this share of the last FULL's bytes is
            published FULL (0-1].
        replay_budget: ``auto``: the deltas since the last FULL hold at most this many FULLs'
            bytes (a cold start reads at most ``1 + replay_budget`` FULLs).
        rollback_on_resume: a restarted trainer's baseline points the fleet back at
            ``<run>-v000000`` even when it serves a later version of the run (the chain then
            goes on from the baseline); by default the fleet keeps what it serves and the
            restart's first version is FULL.
        canary_bound: the frameworks' sample canary (slime, miles, NeMo-RL): a served
            version whose samples' log-probs differ from the trainer's by more than this
            many nats (mean over a sample's tokens, largest sample) is refused as a failed
            hot-load; ``None`` turns it off
            (:mod:`~cwtrain.integrations.rollout.sample_canary`).
    """

    deployment_id: str
    run_id: str
    wait: bool = True
    timeout: float = DEFAULT_TIMEOUT
    publish_baseline: bool = True
    full_every: FullEvery = DEFAULT_FULL_EVERY
    mirror: bool | None = None
    verify: bool = False
    state_dir: str = ""
    prompt_cache_policy: PromptCachePolicy = PromptCachePolicy.UNSPECIFIED
    upload_workers: int = 8
    api_base_url: str = DEFAULT_API_BASE_URL
    api_headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    api_insecure: bool = False
    on_failure: str = "reactivate"
    full_share: float = DEFAULT_FULL_SHARE
    replay_budget: float = DEFAULT_REPLAY_BUDGET
    rollback_on_resume: bool = False
    canary_bound: float | None = 0.05

    def __post_init__(self) -> None:
        validate_run_id(self.run_id, "run_id")
        if isinstance(self.timeout, bool) or not (isinstance(self.timeout, int | float) and self.timeout > 0):
            raise ConfigError(f"timeout={self.timeout!r} must be a finite number of seconds > 0")
        if not math.isfinite(self.timeout):
            raise ConfigError(f"timeout={self.timeout!r} must be a finite number of seconds > 0")
        object.__setattr__(self, "full_every", check_full_every(self.full_every))
        object.__setattr__(self, "full_share", check_full_share(self.full_share))
        object.__setattr__(self, "replay_budget", check_replay_budget(self.replay_budget))
        if self.mirror is False and self.full_every != 0:
            raise ConfigError(
                f"CWTRAIN_HOTLOAD_MIRROR is off but CWTRAIN_HOTLOAD_FULL_EVERY={self.full_every}: "
                "FULL cuts are written from the mirror; turn the mirror on or set FULL_EVERY=0"
            )
        if self.on_failure not in FAILURE_POLICIES:
            raise ConfigError(f"on_failure={self.on_failure!r} must be one of {', '.join(FAILURE_POLICIES)}")
        if isinstance(self.upload_workers, bool) or self.upload_workers < 1:
            raise ConfigError(f"upload_workers={self.upload_workers!r} must be >= 1")
        object.__setattr__(self, "prompt_cache_policy", PromptCachePolicy.parse(self.prompt_cache_policy))
        bound = self.canary_bound
        if bound is not None and (
            isinstance(bound, bool) or not isinstance(bound, int | float) or not math.isfinite(bound) or bound <= 0
        ):
            raise ConfigError(f"canary_bound={bound!r} must be a finite number of nats > 0, or None (off)")

    def client(self) -> InferenceClient:
        """An API client for these settings' API (the token from the environment)."""
        from cwtrain.infra.client import InferenceClient

        return InferenceClient(
            base_url=self.api_base_url, headers=dict(self.api_headers) or None, verify=not self.api_insecure
        )

    @property
    def use_mirror(self) -> bool:
        """Whether the served copy is kept (the explicit setting, else unless ``full_every`` is 0)."""
        return self.full_every != 0 if self.mirror is None else self.mirror

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        default_run_id: str | None = None,
        labels: Mapping[str, str] | None = None,
        require_deployment: bool = True,
        **overrides: Any,
    ) -> Self:
        """Read the ``CWTRAIN_HOTLOAD_*`` variables (and the API's) into settings.

        Args:
            environ: the mapping to read; ``os.environ`` when ``None``.
            default_run_id: the run id when ``CWTRAIN_HOTLOAD_RUN_ID`` is unset; required then.
            labels: variable → what the user calls it (a framework config key), used in errors.
            require_deployment: refuse a missing ``CWTRAIN_HOTLOAD_DEPLOYMENT_ID``.
            **overrides: explicit field values, which beat the variables.

        Raises:
            ConfigError: a variable is malformed or a required one is missing (naming it, or
                its label).
        """
        env = environ_or(environ)
        names = dict(labels or {})
        try:
            values = _read(env, overrides, default_run_id=default_run_id, require_deployment=require_deployment)
            values.update(overrides)
            return cls(**values)
        except ConfigError as exc:
            message = str(exc)
            for variable, label in names.items():
                message = message.replace(variable, label)
            raise ConfigError(message) from None


def default_of(name: str) -> Any:
    """The default of the setting ``name`` (the dataclass field's, the one declaration)."""
    for item in fields(HotLoadSettings):
        if item.name == name:
            if item.default is not MISSING:
                return item.default
            if item.default_factory is not MISSING:
                return item.default_factory()
            return None
    raise KeyError(name)


def _read(
    env: Mapping[str, str], overrides: Mapping[str, Any], *, default_run_id: str | None, require_deployment: bool
) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if "deployment_id" not in overrides:
        deployment = env_str("CWTRAIN_HOTLOAD_DEPLOYMENT_ID", env)
        if deployment is None and require_deployment:
            raise ConfigError("CWTRAIN_HOTLOAD_DEPLOYMENT_ID is required: set it to the deployment's id")
        values["deployment_id"] = deployment or ""
    if "run_id" not in overrides:
        run_id = env_str("CWTRAIN_HOTLOAD_RUN_ID", env)
        if run_id is not None:
            values["run_id"] = validate_run_id(run_id, "CWTRAIN_HOTLOAD_RUN_ID")
        elif default_run_id is not None:
            values["run_id"] = default_run_id
        else:
            raise ConfigError("CWTRAIN_HOTLOAD_RUN_ID is required here: set it (at most 120 characters, no '/')")
    values["wait"] = env_bool("CWTRAIN_HOTLOAD_WAIT", default_of("wait"), env)
    values["timeout"] = env_float("CWTRAIN_HOTLOAD_TIMEOUT", default_of("timeout"), env)
    values["publish_baseline"] = env_bool("CWTRAIN_HOTLOAD_PUBLISH_BASELINE", default_of("publish_baseline"), env)
    full_every = env_str("CWTRAIN_HOTLOAD_FULL_EVERY", env)
    values["full_every"] = default_of("full_every") if full_every is None else parse_full_every(full_every)
    values["full_share"] = check_full_share(
        env_float("CWTRAIN_HOTLOAD_FULL_SHARE", default_of("full_share"), env), "CWTRAIN_HOTLOAD_FULL_SHARE"
    )
    values["replay_budget"] = env_float("CWTRAIN_HOTLOAD_REPLAY_BUDGET", default_of("replay_budget"), env)
    values["rollback_on_resume"] = env_bool("CWTRAIN_HOTLOAD_ROLLBACK_ON_RESUME", default_of("rollback_on_resume"), env)
    bound = env_str("CWTRAIN_HOTLOAD_CANARY_BOUND", env)
    if bound is not None and bound.strip().lower() == "off":
        values["canary_bound"] = None
    elif bound is not None:
        values["canary_bound"] = env_float("CWTRAIN_HOTLOAD_CANARY_BOUND", default_of("canary_bound"), env)
    mirror = env_str("CWTRAIN_HOTLOAD_MIRROR", env)
    values["mirror"] = None if mirror is None else env_bool("CWTRAIN_HOTLOAD_MIRROR", False, env)
    values["verify"] = env_bool("CWTRAIN_HOTLOAD_VERIFY", default_of("verify"), env)
    values["state_dir"] = env_str("CWTRAIN_HOTLOAD_STATE_DIR", env) or default_of("state_dir")
    values["prompt_cache_policy"] = parse_prompt_cache_policy(
        env_str("CWTRAIN_HOTLOAD_PROMPT_CACHE_POLICY", env), "CWTRAIN_HOTLOAD_PROMPT_CACHE_POLICY"
    )
    values["upload_workers"] = env_int("CWTRAIN_HOTLOAD_UPLOAD_WORKERS", default_of("upload_workers"), env, minimum=1)
    values["api_base_url"] = (env_str("COREWEAVE_API_URL", env) or default_of("api_base_url")).rstrip("/")
    from cwtrain.infra.client import headers_from_env

    headers = headers_from_env(env)  # never echoes the value: it usually carries credentials
    if headers:
        values["api_headers"] = headers
    values["api_insecure"] = env_bool("CWTRAIN_API_INSECURE", default_of("api_insecure"), env)
    policy = env_str("CWTRAIN_HOTLOAD_ON_FAILURE", env)
    if policy is not None:
        if policy.lower() not in FAILURE_POLICIES:
            raise ConfigError(
                f"CWTRAIN_HOTLOAD_ON_FAILURE={policy!r} is not a failure policy (use {' or '.join(FAILURE_POLICIES)})"
            )
        values["on_failure"] = policy.lower()
    return values
