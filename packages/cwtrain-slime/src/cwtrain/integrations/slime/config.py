"""Configuration of the slime hook: :class:`HookConfig`, run ids, ranks, slime's own flags.

:class:`HookConfig` is core's :class:`~cwtrain.hotload.HotLoadSettings` (the one reader of
the ``CWTRAIN_HOTLOAD_*``, ``COREWEAVE_API_URL`` and ``CWTRAIN_API_*`` variables, their
defaults and the run-id rule: ``docs/configuration.md``) with slime's words: the deployment
is required, ``CWTRAIN_HOTLOAD_RUN_ID`` defaults to :func:`run_id_from` of slime's arguments,
and ``CWTRAIN_HOTLOAD_STATE_DIR`` to ``<--update-weight-disk-dir>-hotload``. An explicit
argument beats the variable, which beats the default. The API token (``COREWEAVE_API_TOKEN``,
then ``CW_API_TOKEN``) is read by the client, never stored here; ``RANK`` (see
:func:`resolve_rank`) is read through :mod:`cwtrain.config` like every other variable.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import replace

from cwtrain.config import env_int, env_str
from cwtrain.errors import ConfigError
from cwtrain.hotload import HotLoadSettings, validate_run_id

__all__ = [
    "HookConfig",
    "check_delta_args",
    "is_rank_zero",
    "resolve_rank",
    "run_id_from",
    "shared_run_id",
    "state_dir_for",
    "state_dir_of",
]

log = logging.getLogger(__name__)

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
    and its forks give every process the same ``args.wandb_run_id``), else ``-<stamp>``; cut to 100
    characters. :func:`cwtrain.integrations.slime.default_run_id` supplies the stamp, taken
    once per process.

    Args:
        args: slime's argument namespace, or a fork's (``update_weight_disk_dir``, ``wandb_run_id``).
        stamp: the UTC time (``%Y%m%dT%H%M%SZ``) this process started the run.
    """
    return f"{_run_base(args)}-{_wandb_run_id(args) or stamp}"[:_DEFAULT_RUN_ID_LENGTH]


def shared_run_id(args: argparse.Namespace | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The run id every process of one run derives alike, or ``None`` when only a stamp could tell.

    ``CWTRAIN_HOTLOAD_RUN_ID``, else ``<basename of --update-weight-disk-dir>-<wandb run id>``
    when ``args.wandb_run_id`` is set (slime's driver, and its forks', set it before creating the
    train actors and the rollout manager). The hook on rank 0 and the rollout function in the
    rollout manager run in different processes; this is what lets both name the same run.

    Raises:
        ConfigError: ``CWTRAIN_HOTLOAD_RUN_ID`` is not a usable run id.
    """
    explicit = env_str("CWTRAIN_HOTLOAD_RUN_ID", environ)
    if explicit:
        return validate_run_id(explicit, "CWTRAIN_HOTLOAD_RUN_ID")
    wandb_id = _wandb_run_id(args)
    return f"{_run_base(args)}-{wandb_id}"[:_DEFAULT_RUN_ID_LENGTH] if wandb_id else None


def state_dir_for(disk_dir: str | os.PathLike[str]) -> str:
    """The default state directory of a run writing to ``disk_dir``: ``<disk_dir>-hotload``."""
    return os.fspath(disk_dir).rstrip("/\\") + "-hotload"


def state_dir_of(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> str | None:
    """The hook's state directory as another process of the run finds it: ``CWTRAIN_HOTLOAD_STATE_DIR``, else
    :func:`state_dir_for` ``--update-weight-disk-dir``; ``None`` when neither is set."""
    disk_dir = str(getattr(args, "update_weight_disk_dir", "") or "")
    return env_str("CWTRAIN_HOTLOAD_STATE_DIR", environ) or (state_dir_for(disk_dir) if disk_dir else None)


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


class HookConfig(HotLoadSettings):
    """Settings of the slime post-write hook: core's hot-load settings, fields in the same order.

    ``state_dir`` empty means ``<--update-weight-disk-dir>-hotload`` (:meth:`with_state_dir`).
    """

    def __post_init__(self) -> None:
        if not self.deployment_id:
            raise ConfigError("deployment_id is required: set CWTRAIN_HOTLOAD_DEPLOYMENT_ID")
        super().__post_init__()

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
    """Refuse slime's delta settings the engine cannot apply, naming the flag to pass.

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
