"""The sample canary on slime and its forks: each served version judged from the log-probs the trainer computes anyway.

slime (and miles) compute the actor's log-probs of every sampled token before the loss
(``rollout_data["log_probs"]``) whenever the configuration needs them apart from the loss's
own forward: importance ratios (``--use-tis``), train–rollout mismatch metrics
(``--get-mismatch-metrics``), a KL term, several optimizer steps per rollout, a critic, an
old actor. The deployment's log-probs of the same tokens are ``rollout_data["rollout_log_probs"]``
(cwtrain's rollout fills them). Right after the advantages, the framework logs the batch
with ``log_rollout_data(rollout_id, args, rollout_data)``, looked up by name at each call;
:func:`install` (run by ``init_hook`` on every train rank) wraps it so that, first,
:func:`judge_rollout_data`:

1. gives each local sample its served identity: the rollout's
   :class:`~cwtrain.integrations.rollout.ledger.ServedLedger`, which the rollout function
   writes to ``<state dir>/served_ledger.json`` after each rollout, asked with the sample's
   tokens (prompt, then response);
2. reduces each sample to its gap (mean ``|served - trainer|`` over its loss-masked tokens);
3. gathers the gaps on every rank (core's
   :func:`~cwtrain.integrations.rollout.sample_canary.judge_on_every_rank`): rank 0, which holds
   the publish session, judges the version the trainer published last, on the samples that
   version served; a gap beyond ``CWTRAIN_HOTLOAD_CANARY_BOUND`` refuses it as a failed
   hot-load (the fleet is brought back, the next version is FULL, the samplers re-request it);
4. zeroes ``loss_masks`` of every sample the refused version served, on every rank;
5. logs ``hotload/canary_*`` (and the refusal's ``hotload/*``) through the framework's tracking.

Not judged, said once: a batch for which no rank computed log-probs before the loss
(slime's single-step GRPO reuses the loss's forward; pass ``--get-mismatch-metrics`` to
judge, or use a probe canary), a rollout temperature other than 1, the publishing actor
(``actor_hook``: the session lives in the actor), ``CWTRAIN_HOTLOAD_CANARY_BOUND=off``.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cwtrain.hotload import SingleProcess, identity_version
from cwtrain.integrations.rollout import SampleCanary, SampleGap, ServedLedger, judge_on_every_rank, sample_gap

from .config import state_dir_of
from .dialect import Dialect, dialect_of, gloo_group

if TYPE_CHECKING:
    from cwtrain.hotload import Collective
    from cwtrain.integrations.rollout import CompletionSampler

__all__ = ["LEDGER_FILE", "install", "judge_rollout_data", "ledger_path", "local_gaps", "save_ledger"]

log = logging.getLogger(__name__)

#: The served-samples ledger in the state directory (written by the rollout, read by the train ranks).
LEDGER_FILE = "served_ledger.json"
#: What an installed wrapper is marked with.
_WRAPPED = "__cwtrain_canary__"
_said: set[str] = set()


def ledger_path(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Path | None:
    """``<state dir>/served_ledger.json`` (``CWTRAIN_HOTLOAD_STATE_DIR``, else ``<--update-weight-disk-dir>-hotload``)."""
    state = state_dir_of(args, environ)
    return Path(state) / LEDGER_FILE if state else None


def save_ledger(args: argparse.Namespace, sampler: CompletionSampler) -> None:
    """Write the sampler's ledger where the train ranks read it (nothing without a state directory)."""
    path = ledger_path(args)
    if path is None:
        return
    try:
        sampler.ledger.save(path)
    except OSError as exc:  # the rollout goes on; the canary judges what it can tell
        _once("ledger", "could not write the served-samples ledger %s (%s): the sample canary cannot judge", path, exc)


def install(args: argparse.Namespace | None = None, *, dialect: Dialect | None = None) -> list[str]:
    """Wrap the framework's ``log_rollout_data`` so the sample canary runs first (every train rank).

    Returns:
        the modules whose ``log_rollout_data`` is wrapped now (none outside the framework).
    """
    dialect = dialect or dialect_of(args)
    installed = []
    for name in dialect.rollout_log_modules:
        module = sys.modules.get(name)  # the actor imported it before it calls the init hook
        if module is None:
            continue
        original = getattr(module, "log_rollout_data", None)
        if not callable(original):
            continue
        if not getattr(original, _WRAPPED, False):
            module.log_rollout_data = _wrap(original, dialect)  # type: ignore[attr-defined]
        installed.append(name)
    return installed


def _wrap(original: Callable[..., Any], dialect: Dialect) -> Callable[..., Any]:
    @functools.wraps(original)
    def log_rollout_data(rollout_id: Any, args: argparse.Namespace, rollout_data: Any, *rest: Any, **kw: Any) -> Any:
        judge_rollout_data(args, rollout_data, dialect=dialect)
        return original(rollout_id, args, rollout_data, *rest, **kw)

    setattr(log_rollout_data, _WRAPPED, True)
    return log_rollout_data


def local_gaps(rollout_data: Mapping[str, Any], ledger: ServedLedger) -> tuple[list[SampleGap], list[str | None]]:
    """This rank's samples: their gaps (where both log-probs are here) and their served identities."""
    tokens = rollout_data.get("tokens") or []
    lengths = rollout_data.get("response_lengths") or []
    identities = [ledger.identity_of(_ints(t)) if int(n) else None for t, n in zip(tokens, lengths)]
    trainer, served = rollout_data.get("log_probs"), rollout_data.get("rollout_log_probs")
    if not trainer or not served:
        return [], identities
    masks = rollout_data.get("loss_masks") or [None] * len(trainer)
    indices = rollout_data.get("sample_indices") or list(range(len(trainer)))
    gaps = []
    for index, identity, mine, theirs, mask in zip(indices, identities, trainer, served, masks):
        mine, theirs = _floats(mine), _floats(theirs)
        if len(mine) != len(theirs):
            continue  # not the same tokens: nothing to compare
        keep = _ints(mask) if mask is not None else []
        if len(keep) == len(mine):  # a slice of the response (context parallel) is compared whole
            mine = [x for x, k in zip(mine, keep) if k]
            theirs = [x for x, k in zip(theirs, keep) if k]
        gap = sample_gap(int(index), identity, theirs, mine)
        if gap is not None:
            gaps.append(gap)
    return gaps, identities


def judge_rollout_data(
    args: argparse.Namespace,
    rollout_data: Any,
    *,
    dialect: Dialect | None = None,
    collective: Collective | None = None,
    environ: Mapping[str, str] | None = None,
) -> str | None:
    """Judge this batch on every train rank (see the module docs); returns the identity refused, or ``None``."""
    from cwtrain.hotload import HotLoadSettings

    from .runtime import SlimeRuntime
    from .tracking import log_metrics

    env = os.environ if environ is None else environ
    bound = HotLoadSettings.from_env(env, default_run_id="unused", require_deployment=False).canary_bound
    temperature = float(getattr(args, "rollout_temperature", 1.0) or 0.0)
    if bound is None or temperature != 1.0:
        _once("off", "the sample canary does not judge this run: %s", "CWTRAIN_HOTLOAD_CANARY_BOUND is off"
              if bound is None else f"--rollout-temperature is {temperature:g}, not 1")  # fmt: skip
        return None
    path = ledger_path(args, env)
    ledger = ServedLedger.load(path) if path is not None and path.exists() else ServedLedger()
    gaps, identities = local_gaps(rollout_data, ledger)
    collective = collective or _collective(args, dialect)
    session = SlimeRuntime.current().publishing_session()
    canary = SampleCanary(session, bound=bound) if session is not None and collective.rank == 0 else None
    if collective.rank == 0 and session is None:
        _once("actor", "the sample canary does not judge this run: this process holds no publish session "
              "(the publishing actor, actor_hook, holds it)")  # fmt: skip
    refused, verdict = judge_on_every_rank(collective, gaps, canary)
    if verdict is not None:
        if verdict.result is None and verdict.skipped and "no sample" in verdict.skipped:
            _once("no-logprobs", "the sample canary judged nothing in this batch (%s): the framework computed no "
                  "actor log-probs before the loss (pass --get-mismatch-metrics to have them, or use a probe canary)",
                  verdict.skipped)  # fmt: skip
        metrics = verdict.metrics()
        if metrics and session is not None:
            version = identity_version(verdict.identity or "", session.run_id)
            record = {**metrics, "hotload/version": float(version if version is not None else -1)}
            if verdict.refused is not None:
                record.update(verdict.refused.metrics())
            log_metrics(args, record, run_id=session.run_id, dialect=dialect)
    if refused is not None:
        _drop(rollout_data, identities, refused)
    return refused


def _drop(rollout_data: Any, identities: Sequence[str | None], refused: str) -> None:
    masks = rollout_data.get("loss_masks")
    if masks is None:
        return
    dropped = 0
    for i, identity in enumerate(identities):
        if identity == refused and i < len(masks):
            mask = masks[i]
            if hasattr(mask, "zero_"):  # a tensor (slime and miles move the masks to the device)
                mask.zero_()
            elif hasattr(mask, "fill"):  # an array
                mask.fill(0)
            else:
                masks[i] = [0] * len(mask)
            dropped += 1
    if dropped:
        log.warning("left %d samples served by the refused %s out of the batch", dropped, refused)


def _collective(args: argparse.Namespace, dialect: Dialect | None) -> Collective:
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return SingleProcess()
    from cwtrain.hotload import TorchCollective

    return TorchCollective(gloo_group(args, dialect=dialect))


def _ints(values: Any) -> list[int]:
    return [int(x) for x in (values.tolist() if hasattr(values, "tolist") else values)]


def _floats(values: Any) -> list[float]:
    if hasattr(values, "detach"):
        values = values.detach().float().cpu()
    return [float(x) for x in (values.tolist() if hasattr(values, "tolist") else values)]


def _once(key: str, message: str, *args: Any) -> None:
    if key not in _said:
        _said.add(key)
        log.warning(message, *args)
