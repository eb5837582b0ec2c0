"""Configuration of the slime/miles hook: :class:`HookConfig`, run ids, ranks, slime's own flags.

Precedence: an explicit argument beats the ``CWTRAIN_HOTLOAD_*`` variable, which beats the
default. :meth:`HookConfig.from_env` reads:

======================================= ============================= ========================================
variable                                default                       meaning
======================================= ============================= ========================================
``CWTRAIN_HOTLOAD_DEPLOYMENT_ID``       required                      target deployment
``CWTRAIN_HOTLOAD_RUN_ID``              ``default_run_id(args)``      identity prefix (<= 120 chars, no ``/``)
``CWTRAIN_HOTLOAD_WAIT``                true                          wait for each hot-load to complete
``CWTRAIN_HOTLOAD_TIMEOUT``             1800                          seconds per publish
``CWTRAIN_HOTLOAD_PUBLISH_BASELINE``    true                          publish ``<run>-v000000``
``CWTRAIN_HOTLOAD_FULL_EVERY``          20                            FULL every N versions (0-64, 0 = never)
``CWTRAIN_HOTLOAD_MIRROR``              on iff FULL_EVERY > 0         keep the served copy
``CWTRAIN_HOTLOAD_VERIFY``              false                         every replica READY on the identity
``CWTRAIN_HOTLOAD_STATE_DIR``           ``<disk dir>-hotload``        local working directory
``CWTRAIN_HOTLOAD_PROMPT_CACHE_POLICY`` unset                         ``preserve`` or ``reset_all``
``CWTRAIN_HOTLOAD_UPLOAD_WORKERS``      8                             files uploaded in parallel
``COREWEAVE_API_URL``                   ``https://api.coreweave.com`` API origin
``CWTRAIN_API_HEADERS``                 none                          JSON object of extra headers (secret)
``CWTRAIN_API_INSECURE``                false                         skip TLS verification
======================================= ============================= ========================================

The API token (``COREWEAVE_API_TOKEN``, then ``CW_API_TOKEN``) is read by the client, never
stored here. ``RANK`` (see :func:`resolve_rank`) is read through :mod:`cwtrain.config` like
every other variable.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from cwtrain.config import env_bool, env_float, env_int, env_str
from cwtrain.errors import ConfigError
from cwtrain.hotload.publish.cadence import check_full_every, full_every_from_env
from cwtrain.infra.enums import PromptCachePolicy

__all__ = [
    "DEFAULT_API_BASE_URL",
    "HookConfig",
    "check_delta_args",
    "is_rank_zero",
    "parse_prompt_cache_policy",
    "resolve_rank",
    "run_id_from",
    "shared_run_id",
    "state_dir_for",
]

log = logging.getLogger(__name__)

DEFAULT_API_BASE_URL = "https://api.coreweave.com"
MAX_RUN_ID = 120
_DEFAULT_RUN_ID_LENGTH = 100
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def _run_base(args: argparse.Namespace | None) -> str:
    disk_dir = str(getattr(args, "update_weight_disk_dir", None) or "")
    return _UNSAFE.sub("-", os.path.basename(disk_dir.rstrip("/\\"))) or "slime"


def _wandb_run_id(args: argparse.Namespace | None) -> str | None:
    value = getattr(args, "wandb_run_id", None)
    return _UNSAFE.sub("-", value) if isinstance(value, str) and value else None


def run_id_from(args: argparse.Namespace | None, stamp: str) -> str:
    """The default run id of ``args``: its :func:`shared_run_id`, else one with the process's ``stamp``.

    The basename of ``--update-weight-disk-dir`` (characters outside ``[A-Za-z0-9._-]`` become
    ``-``; empty gives ``slime``), then ``-<wandb run id>`` when the run logs to wandb (slime
    and miles give every process the same ``args.wandb_run_id``), else ``-<stamp>``; cut to 100
    characters. :func:`cwtrain.integrations.slime.default_run_id` supplies the stamp, taken
    once per process.

    Args:
        args: slime's or miles' argument namespace (``update_weight_disk_dir``, ``wandb_run_id``).
        stamp: the UTC time (``%Y%m%dT%H%M%SZ``) this process started the run.
    """
    return f"{_run_base(args)}-{_wandb_run_id(args) or stamp}"[:_DEFAULT_RUN_ID_LENGTH]


def shared_run_id(args: argparse.Namespace | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The run id every process of one run derives alike, or ``None`` when only a stamp could tell.

    ``CWTRAIN_HOTLOAD_RUN_ID``, else ``<basename of --update-weight-disk-dir>-<wandb run id>``
    when ``args.wandb_run_id`` is set (slime's and miles' driver set it before creating the
    train actors and the rollout manager). The hook on rank 0 and the rollout function in the
    rollout manager run in different processes; this is what lets both name the same run.

    Raises:
        ConfigError: ``CWTRAIN_HOTLOAD_RUN_ID`` is not a usable run id.
    """
    explicit = env_str("CWTRAIN_HOTLOAD_RUN_ID", environ)
    if explicit:
        return _validate_run_id(explicit, "CWTRAIN_HOTLOAD_RUN_ID")
    wandb_id = _wandb_run_id(args)
    return f"{_run_base(args)}-{wandb_id}"[:_DEFAULT_RUN_ID_LENGTH] if wandb_id else None


def state_dir_for(disk_dir: str | os.PathLike[str]) -> str:
    """The default state directory of a run writing to ``disk_dir``: ``<disk_dir>-hotload``."""
    return os.fspath(disk_dir).rstrip("/\\") + "-hotload"


def resolve_rank(args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None) -> int:
    """This process's rank: ``args.rank`` if an int, else ``torch.distributed``, else ``RANK``, else 0.

    torch is consulted only when something already imported it (the hook never imports it).

    Raises:
        ConfigError: ``RANK`` is not an integer.
    """
    rank = getattr(args, "rank", None)
    if isinstance(rank, int) and not isinstance(rank, bool):
        return rank
    dist = sys.modules.get("torch.distributed")
    if dist is not None:
        try:
            if dist.is_available() and dist.is_initialized():
                return int(dist.get_rank())
        except Exception:  # a half-initialised process group: fall through to RANK
            log.debug("torch.distributed rank unavailable", exc_info=True)
    return env_int("RANK", 0, environ)


def is_rank_zero(args: argparse.Namespace | None = None) -> bool:
    """Whether this process publishes: the rank of :func:`resolve_rank` is 0."""
    return resolve_rank(args) == 0


def parse_prompt_cache_policy(value: str | PromptCachePolicy | None, what: str) -> PromptCachePolicy:
    """Parse a prompt cache policy strictly: ``preserve``, ``reset_all``, prefixed names or integers."""
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


def _validate_run_id(run_id: str, what: str) -> str:
    if not run_id or "/" in run_id or len(run_id) > MAX_RUN_ID or run_id in (".", ".."):
        raise ConfigError(
            f"{what}={run_id!r} is not a usable run id: it needs 1-{MAX_RUN_ID} characters and no '/' "
            "(identities are <run>-vNNNNNN, one path segment)"
        )
    return run_id


@dataclass(frozen=True)
class HookConfig:
    """Settings of the slime/miles post-write hook.

    Fields may be passed positionally in this order. Build one from the environment with
    :meth:`from_env`; an explicit value always wins over the variable.

    Attributes:
        deployment_id: the deployment that receives every version.
        run_id: identity prefix; identities are ``<run_id>-v{N:06d}``.
        wait: wait for each hot-load to complete; ``False`` = one step ahead (the next publish
            waits for the previous one through single-flight).
        timeout: seconds per publish (readiness gate, single-flight wait and completion).
        publish_baseline: publish ``--hf-checkpoint`` as ``<run>-v000000`` (skipped when an
            identical one completed); ``False`` asserts that it exists.
        full_every: a FULL snapshot every N versions (0-64; 0 never cuts the chain).
        mirror: keep a byte-exact copy of the served weights; ``None`` = on iff ``full_every > 0``.
        verify: require every replica READY on the identity after completion.
        state_dir: local working directory; empty = ``<--update-weight-disk-dir>-hotload``.
        prompt_cache_policy: sent with each hot-load (UNSPECIFIED omits the field).
        upload_workers: files uploaded in parallel.
        api_base_url: API origin.
        api_headers: extra API headers (may hold secrets; never shown in ``repr``).
        api_insecure: skip TLS verification of the API.
    """

    deployment_id: str
    run_id: str
    wait: bool = True
    timeout: float = 1800.0
    publish_baseline: bool = True
    full_every: int = 20
    mirror: bool | None = None
    verify: bool = False
    state_dir: str = ""
    prompt_cache_policy: PromptCachePolicy = PromptCachePolicy.UNSPECIFIED
    upload_workers: int = 8
    api_base_url: str = DEFAULT_API_BASE_URL
    api_headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    api_insecure: bool = False

    def __post_init__(self) -> None:
        if not self.deployment_id:
            raise ConfigError("deployment_id is required: set CWTRAIN_HOTLOAD_DEPLOYMENT_ID")
        _validate_run_id(self.run_id, "run_id")
        if not (self.timeout > 0 and self.timeout != float("inf")):
            raise ConfigError(f"timeout={self.timeout!r} must be a finite number of seconds > 0")
        check_full_every(self.full_every)
        if self.mirror is False and self.full_every > 0:
            raise ConfigError(
                f"CWTRAIN_HOTLOAD_MIRROR is off but CWTRAIN_HOTLOAD_FULL_EVERY={self.full_every}: "
                "FULL cuts are written from the mirror; turn the mirror on or set FULL_EVERY=0"
            )
        if self.upload_workers < 1:
            raise ConfigError(f"upload_workers={self.upload_workers} must be >= 1")

    @property
    def use_mirror(self) -> bool:
        """Whether the served copy is kept (the explicit setting, else ``full_every > 0``)."""
        return self.full_every > 0 if self.mirror is None else self.mirror

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        default_run_id: str | None = None,
        **overrides: Any,
    ) -> HookConfig:
        """Read the ``CWTRAIN_HOTLOAD_*`` variables (see the module docstring).

        Args:
            environ: the mapping to read; ``os.environ`` when ``None``.
            default_run_id: the run id when ``CWTRAIN_HOTLOAD_RUN_ID`` is unset; required then.
            **overrides: explicit field values, which beat the variables.

        Raises:
            ConfigError: a variable is malformed or a required one is missing.
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        if "deployment_id" not in overrides:
            deployment = env_str("CWTRAIN_HOTLOAD_DEPLOYMENT_ID", env)
            if deployment is None:
                raise ConfigError("CWTRAIN_HOTLOAD_DEPLOYMENT_ID is required: set it to the deployment's id")
            values["deployment_id"] = deployment
        if "run_id" not in overrides:
            run_id = env_str("CWTRAIN_HOTLOAD_RUN_ID", env) or default_run_id
            if run_id is None:
                raise ConfigError("CWTRAIN_HOTLOAD_RUN_ID is required here: set it (<= 120 chars, no '/')")
            values["run_id"] = _validate_run_id(run_id, "CWTRAIN_HOTLOAD_RUN_ID")
        values["wait"] = env_bool("CWTRAIN_HOTLOAD_WAIT", True, env)
        values["timeout"] = env_float("CWTRAIN_HOTLOAD_TIMEOUT", 1800.0, env)
        values["publish_baseline"] = env_bool("CWTRAIN_HOTLOAD_PUBLISH_BASELINE", True, env)
        values["full_every"] = full_every_from_env(env)
        mirror = env_str("CWTRAIN_HOTLOAD_MIRROR", env)
        values["mirror"] = None if mirror is None else env_bool("CWTRAIN_HOTLOAD_MIRROR", False, env)
        values["verify"] = env_bool("CWTRAIN_HOTLOAD_VERIFY", False, env)
        values["state_dir"] = env_str("CWTRAIN_HOTLOAD_STATE_DIR", env) or ""
        values["prompt_cache_policy"] = parse_prompt_cache_policy(
            env_str("CWTRAIN_HOTLOAD_PROMPT_CACHE_POLICY", env), "CWTRAIN_HOTLOAD_PROMPT_CACHE_POLICY"
        )
        values["upload_workers"] = env_int("CWTRAIN_HOTLOAD_UPLOAD_WORKERS", 8, env, minimum=1)
        values["api_base_url"] = (env_str("COREWEAVE_API_URL", env) or DEFAULT_API_BASE_URL).rstrip("/")
        from cwtrain.infra.client import headers_from_env

        headers = headers_from_env(env)  # never echoes the value: it usually carries credentials
        if headers:
            values["api_headers"] = headers
        values["api_insecure"] = env_bool("CWTRAIN_API_INSECURE", False, env)
        values.update(overrides)
        return cls(**values)

    def with_state_dir(self, args: argparse.Namespace) -> HookConfig:
        """This config with ``state_dir`` filled in from ``--update-weight-disk-dir`` when empty.

        Raises:
            ConfigError: neither ``CWTRAIN_HOTLOAD_STATE_DIR`` nor ``--update-weight-disk-dir`` is set.
        """
        if self.state_dir:
            return self
        disk_dir = getattr(args, "update_weight_disk_dir", None)
        if not disk_dir:
            raise ConfigError("no state directory: set CWTRAIN_HOTLOAD_STATE_DIR or pass --update-weight-disk-dir DIR")
        return replace(self, state_dir=state_dir_for(str(disk_dir)))


def check_delta_args(args: argparse.Namespace) -> None:
    """Refuse slime/miles delta settings the engine cannot apply, naming the flag to pass.

    The deployment applies only XOR deltas with Adler-32 checksums, so
    ``--update-weight-delta-encoding xor`` and ``--update-weight-delta-checksum adler32`` are
    required, and slime's delta updater needs ``--update-weight-local-checkpoint-dir`` and
    ``--hf-checkpoint``.

    Raises:
        ConfigError: naming the first flag that is wrong.
    """
    encoding = str(getattr(args, "update_weight_delta_encoding", "xor") or "xor").lower()
    if encoding != "xor":
        raise ConfigError(
            f"--update-weight-delta-encoding {encoding} cannot be hot-loaded: pass --update-weight-delta-encoding xor"
        )
    checksum = str(getattr(args, "update_weight_delta_checksum", "") or "").lower().replace("-", "")
    if checksum != "adler32":
        shown = getattr(args, "update_weight_delta_checksum", None)
        raise ConfigError(
            f"--update-weight-delta-checksum {shown} cannot be hot-loaded: pass --update-weight-delta-checksum adler32"
        )
    if not getattr(args, "hf_checkpoint", None):
        raise ConfigError("the baseline is published from --hf-checkpoint: pass --hf-checkpoint HF_DIR")
