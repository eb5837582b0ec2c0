"""The ``hotload`` command group: publish weights to a deployment and follow hot-loads.

::

    cwtrain hotload inspect DIR [--previous-identity ID]            # local, no network
    cwtrain hotload check [--deployment ID]                         # or --bucket B --prefix P
    cwtrain hotload publish [--deployment ID] --checkpoint DIR --identity ID [--previous-identity ID]
    cwtrain hotload publish [--deployment ID] --checkpoint NEW --base PREV --identity ID \
        --previous-identity PREV_ID [--keep DIR]                    # diff + publish in one pass
    cwtrain hotload trigger [--deployment ID] --identity ID [--previous-identity ID] [--no-verify]
    cwtrain hotload wait HOTLOAD / status HOTLOAD [--deployment ID]   # a hot-load id, or an identity
    cwtrain hotload cancel HOTLOAD_ID
    cwtrain hotload list [--deployment ID] [--limit 20]
    cwtrain hotload rollback [--deployment ID] --identity ID

``--deployment`` defaults to ``CWTRAIN_HOTLOAD_DEPLOYMENT_ID`` (``cwtrain local up``
exports it); with neither the command exits 2 with one ``error:`` line naming both. An
unknown deployment is ``error: not_found: deployment <id> not found`` (exit 1), ``list``
included (it reads the deployment first: a listing by an unknown parent answers nothing).
``wait`` and ``status`` take a hot-load id or an identity (then the newest hot-load of that
identity on the deployment; with neither, the line says how to find the id).
``--timeout`` and ``--workers`` default to ``CWTRAIN_HOTLOAD_TIMEOUT`` (else 1800 s) and
``CWTRAIN_HOTLOAD_UPLOAD_WORKERS`` (else 8), as for the library.
stdout: one JSON document (hot-load view, ``{"hot_load", "replicas"}``, snapshot info,
...); stderr: logs, upload progress (:class:`cwtrain.progress.ByteProgress`: drawn on a
terminal or with ``--progress``, else one final line) and hot-load state changes.
``trigger`` first reads the snapshot's stored objects back and checks each against the
SHA-256 it was uploaded with (and a FULL snapshot's tensors against their Adler-32s),
refusing a snapshot that changed since (exit 1); ``--no-verify`` skips that read.
``publish`` (and ``trigger`` of a delta) refuse before the first byte is stored what the
service would refuse after the upload: a ``--previous-identity`` (or a delta index's
``base_version``) that is ``initial``, that never completed on the deployment, or whose
snapshot is not in the bucket; the ``error:`` line names ``--previous-identity`` and the
newest identity that completed, and the identity stays free for the corrected command. A
FULL directory whose tensors are in another dtype than its ``config.json`` declares gets
one ``warning:`` line (the library's ``DtypeWarning``) and is published.
Exit 0 on success (also ``--no-wait``), 1 on any cwtrain error or when the printed
hot-load ended FAILED/CANCELED, 2 on a usage error. ``cancel`` works on the local stack;
the service answers ``unimplemented`` (exit 1) until it implements cancel. See
``docs/cli.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import warnings
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from cwtrain.cli.options import (
    DEPLOYMENT_ENV,
    add_deployment_option,
    client_from_args,
    needs_deployment,
    no_deployment,
    positive_float,
    positive_int,
    resolve_deployment,
    usage_error,
)
from cwtrain.cli.output import emit
from cwtrain.config import env_float, env_int
from cwtrain.errors import ConfigError, HotLoadFailedError, InvalidArgumentError, NotFoundError
from cwtrain.hotload.lifecycle.settings import DEFAULT_TIMEOUT, FAILURE_POLICIES, FIELD_VARIABLES
from cwtrain.infra.client import InferenceClient
from cwtrain.infra.enums import HotLoadState, PromptCachePolicy
from cwtrain.infra.models import HotLoad
from cwtrain.polling import Budget

if TYPE_CHECKING:
    from cwtrain.hotload.loader import HotLoader

__all__ = ["register"]

log = logging.getLogger("cwtrain.cli")
#: The library's variables the options fall back to when not given.
TIMEOUT_ENV = FIELD_VARIABLES["timeout"]
WORKERS_ENV = FIELD_VARIABLES["upload_workers"]
#: Every --poll-interval: HotLoader's poll_interval, the cap of its adaptive polling (cwtrain.polling).
_POLL_HELP = "the longest pause between polls (5); shorter while the service answers fast"


def register(subparsers: Any) -> None:
    """Add the ``hotload`` group to the ``cwtrain`` parser."""
    group = subparsers.add_parser(
        "hotload",
        help="publish snapshots and follow hot-loads",
        description="publish snapshots to a deployment by checkpoint hot-load and follow them",
    )
    commands = group.add_subparsers(dest="command", metavar="<command>", parser_class=type(group))
    commands.required = True

    p = commands.add_parser("inspect", help="validate a snapshot directory locally (no network)")
    p.add_argument("dir", metavar="DIR")
    p.add_argument("--previous-identity", help="predecessor of a delta (default from its index)")
    p.set_defaults(func=_inspect)

    p = commands.add_parser(
        "publish",
        help="inspect, upload, create the hot-load and wait",
        description=(
            "Publish a snapshot directory (FULL checkpoint or delta), or with --base the XOR delta between two "
            "checkpoints in one pass (no delta directory on disk unless --keep), then create the hot-load and wait."
        ),
    )
    _deployment(p)
    p.add_argument(
        "--checkpoint", required=True, metavar="DIR", help="snapshot directory (FULL or delta); with --base: NEW"
    )
    p.add_argument(
        "--base",
        metavar="DIR",
        help="the checkpoint --previous-identity serves (byte-exact): publish the delta from it to --checkpoint",
    )
    p.add_argument("--keep", metavar="DIR", help="with --base: also write the delta directory here")
    _identity_options(p)
    p.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        help=f"files uploaded in parallel (default: ${WORKERS_ENV}, else 8)",
    )
    _progress_option(p)
    p.set_defaults(func=needs_deployment(_publish))

    p = commands.add_parser("trigger", help="create the hot-load of an uploaded snapshot and wait")
    _deployment(p)
    _identity_options(p)
    p.add_argument(
        "--no-verify",
        action="store_true",
        help="skip reading the stored objects back to check their SHA-256 (and a FULL's Adler-32s) first",
    )
    p.set_defaults(func=needs_deployment(_trigger))

    p = commands.add_parser(
        "wait",
        help="wait until a hot-load ends (by hot-load id, or by identity)",
        description="Wait until a hot-load ends. " + _HOT_LOAD_REF_HELP,
    )
    _hot_load_ref(p)
    _timeout_option(p)
    p.add_argument("--poll-interval", type=positive_float, default=5.0, help=_POLL_HELP)
    p.set_defaults(func=_wait)

    p = commands.add_parser(
        "status",
        help="a hot-load and all its replicas (by hot-load id, or by identity)",
        description="A hot-load and all its replicas. " + _HOT_LOAD_REF_HELP,
    )
    _hot_load_ref(p)
    p.set_defaults(func=_status)

    p = commands.add_parser("list", help="a deployment's hot-loads, newest first")
    _deployment(p)
    p.add_argument("--limit", type=positive_int, default=20, help="at most N (20)")
    p.set_defaults(func=needs_deployment(_list))

    p = commands.add_parser("check", help="check object-store permissions on the hot-load prefix")
    where = p.add_mutually_exclusive_group()
    add_deployment_option(where, "deployment whose hotLoad bucket/prefix to check")
    where.add_argument("--bucket", help="bucket to check (instead of a deployment's)")
    p.add_argument("--prefix", default="", help="path prefix to check with --bucket")
    p.set_defaults(func=_check)

    p = commands.add_parser("rollback", help="re-activate an identity that was served before")
    _deployment(p)
    p.add_argument("--identity", required=True, help="identity to go back to")
    p.add_argument("--reset-prompt-cache", action="store_true", help="send PROMPT_CACHE_POLICY_RESET_ALL")
    p.add_argument("--no-wait", action="store_true", help="print the new hot-load without waiting")
    _timeout_option(p)
    p.add_argument("--poll-interval", type=positive_float, default=5.0, help=_POLL_HELP)
    p.set_defaults(func=needs_deployment(_rollback))

    p = commands.add_parser(
        "cancel", help="ask to cancel a hot-load (the service does not implement it yet; the local stack does)"
    )
    p.add_argument("hot_load_id", metavar="HOTLOAD_ID")
    p.set_defaults(func=_cancel)


def _deployment(parser: argparse.ArgumentParser) -> None:
    add_deployment_option(parser)


_HOT_LOAD_REF_HELP = (
    "HOTLOAD is a hot-load id, or a snapshot identity (e.g. run1-v000003): then the newest hot-load of that "
    "identity on --deployment (default: $" + DEPLOYMENT_ENV + "). 'cwtrain hotload list' shows both."
)


def _hot_load_ref(parser: argparse.ArgumentParser) -> None:
    """The ``HOTLOAD`` positional (an id or an identity) and the ``--deployment`` an identity is looked up on."""
    parser.add_argument("hot_load", metavar="HOTLOAD", help="hot-load id, or snapshot identity")
    add_deployment_option(parser, "deployment whose hot-loads an identity is looked up in")


def _identity_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--identity", required=True, help="snapshot identity (one path segment)")
    parser.add_argument("--previous-identity", help="predecessor of a delta")
    parser.add_argument("--reset-prompt-cache", action="store_true", help="send PROMPT_CACHE_POLICY_RESET_ALL")
    parser.add_argument("--no-wait", action="store_true", help="print the new hot-load without waiting")
    _timeout_option(parser)
    parser.add_argument("--poll-interval", type=positive_float, default=5.0, help=_POLL_HELP)
    parser.add_argument(
        "--on-failure",
        choices=FAILURE_POLICIES,
        default="stop",
        help="when the hot-load ends FAILED or CANCELED: stop (exit 1) or reactivate (first bring every replica "
        "back to the newest intact identity that completed, then exit 1) (stop)",
    )


def _timeout_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=None,
        help=f"seconds, one budget (default: ${TIMEOUT_ENV}, else {DEFAULT_TIMEOUT:g})",
    )


def _progress_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--progress",
        action="store_true",
        help="draw byte progress on stderr even when it is not a terminal (default: only on a terminal; "
        "otherwise one final line)",
    )


def _policy(args: argparse.Namespace) -> PromptCachePolicy | None:
    return PromptCachePolicy.RESET_ALL if args.reset_prompt_cache else None


def _loader(args: argparse.Namespace, api: InferenceClient, deployment_id: str) -> HotLoader:
    from cwtrain.hotload.loader import HotLoader

    if getattr(args, "timeout", DEFAULT_TIMEOUT) is None:  # no --timeout: the library's variable, else its default
        args.timeout = env_float(TIMEOUT_ENV, DEFAULT_TIMEOUT)
    return HotLoader(
        api,
        deployment_id,
        timeout=getattr(args, "timeout", DEFAULT_TIMEOUT),
        poll_interval=getattr(args, "poll_interval", 5.0),
    )


def _finish(hot_load: HotLoad, error: HotLoadFailedError | None = None) -> int:
    """Print the hot-load view; exit 1 when it ended but not COMPLETED."""
    emit(hot_load)
    if hot_load.terminal and hot_load.state is not HotLoadState.COMPLETED:
        text = str(error) if error is not None else f"hot-load {hot_load.id} of {hot_load.identity!r} ended "
        if error is None:
            text += hot_load.state.name
        print(f"error: {' '.join(text.split())}", file=sys.stderr)
        return 1
    return 0


def _print_outcome(run: Callable[[], HotLoad]) -> int:
    """Run a library call that returns a hot-load (waited for or not) and print how it ended."""
    try:
        hot_load = run()
    except HotLoadFailedError as error:
        return _finish(error.hot_load, error)
    return _finish(hot_load)


# --------------------------------------------------------------------- commands


@contextlib.contextmanager
def _warning_lines() -> Iterator[None]:
    """The library's snapshot warnings (``DtypeWarning``) as one ``warning:`` line each on stderr, every time."""
    from cwtrain.cli.errors import one_line
    from cwtrain.hotload import DtypeWarning

    def show(message: Warning | str, category: type[Warning], *rest: Any, **options: Any) -> None:
        print(f"warning: {one_line(message) if isinstance(message, Warning) else message}", file=sys.stderr)

    with warnings.catch_warnings():
        warnings.simplefilter("always", DtypeWarning)
        warnings.showwarning = show
        yield


def _inspect(args: argparse.Namespace) -> int:
    from cwtrain.hotload.files.validate import inspect_snapshot

    with _warning_lines():
        info = inspect_snapshot(args.dir, previous_identity=args.previous_identity)
    emit(info.to_json())
    return 0


def _publish(args: argparse.Namespace) -> int:
    from cwtrain.progress import ByteProgress

    if args.base is None and args.keep is not None:
        return usage_error("--keep DIR needs --base DIR (it keeps the delta publish computes)")
    if args.base is not None and not args.previous_identity:
        return usage_error("--base needs --previous-identity ID (the identity whose weights --base holds)")
    with client_from_args(args) as api, _warning_lines():
        loader = _loader(args, api, args.deployment)
        progress = ByteProgress(f"uploading {args.identity}", live=True if args.progress else None)
        options: dict[str, Any] = {
            "prompt_cache_policy": _policy(args),
            "wait": not args.no_wait,
            "timeout": args.timeout,
            "workers": args.workers or env_int(WORKERS_ENV, 8, minimum=1),
            "on_progress": progress,
            "on_failure": args.on_failure,
        }
        if args.base is not None:
            return _print_outcome(
                lambda: loader.publish_diff(
                    args.checkpoint,
                    args.base,
                    args.identity,
                    previous_identity=args.previous_identity,
                    keep=args.keep,
                    **options,
                )
            )
        return _print_outcome(
            lambda: loader.publish(args.checkpoint, args.identity, previous_identity=args.previous_identity, **options)
        )


def _trigger(args: argparse.Namespace) -> int:
    with client_from_args(args) as api:
        loader = _loader(args, api, args.deployment)
        budget = Budget(args.timeout)  # one budget: single-flight wait, then completion

        def trigger_and_wait() -> HotLoad:
            hot_load = loader.trigger(
                args.identity,
                previous_identity=args.previous_identity,
                prompt_cache_policy=_policy(args),
                timeout=budget.remaining,
                verify=not args.no_verify,
            )
            if args.no_wait:
                return hot_load
            return loader.wait(hot_load.id, timeout=max(budget.remaining, 1e-3), on_failure=args.on_failure)

        return _print_outcome(trigger_and_wait)


def _existing_deployment(api: InferenceClient, deployment_id: str) -> None:
    """GET the deployment, so an unknown one is ``not_found`` naming it (listing by an unknown parent answers [])."""
    api.get_deployment(deployment_id)


def _find_hot_load(api: InferenceClient, args: argparse.Namespace) -> HotLoad:
    """``HOTLOAD`` as a hot-load id, else as an identity: its newest hot-load on the deployment.

    Raises:
        NotFoundError: neither; the message says how to find the hot-load id.
    """
    ref: str = args.hot_load
    try:
        return api.get_hot_load(ref)
    except (NotFoundError, InvalidArgumentError):  # the service may refuse a non-id outright
        deployment = resolve_deployment(args)
        if not deployment:
            raise NotFoundError(
                "not_found",
                f"hot-load {ref} not found; if {ref} is an identity, pass --deployment ID (or set {DEPLOYMENT_ENV}) "
                "to look it up; 'cwtrain hotload list --deployment ID' shows the hot-load ids",
            ) from None
    _existing_deployment(api, deployment)
    matches = [hot_load for hot_load in api.list_hot_loads(deployment) if hot_load.identity == ref]
    if not matches:
        raise NotFoundError(
            "not_found",
            f"no hot-load {ref}: it is neither a hot-load id nor an identity hot-loaded on deployment {deployment}; "
            f"'cwtrain hotload list --deployment {deployment}' shows the hot-load ids and their identities",
        )
    newest = sorted(matches, key=lambda hot_load: hot_load.created_at or _NEVER, reverse=True)[0]  # stable
    more = f" (the newest of {len(matches)})" if len(matches) > 1 else ""
    log.info("identity %s: hot-load %s%s on deployment %s", ref, newest.id, more, deployment)
    return newest


_NEVER = datetime.min.replace(tzinfo=UTC)


def _wait(args: argparse.Namespace) -> int:
    with client_from_args(args) as api:
        hot_load = _find_hot_load(api, args)
        loader = _loader(args, api, hot_load.deployment_id or "unknown")
        return _print_outcome(lambda: loader.wait(hot_load.id, timeout=args.timeout))


def _status(args: argparse.Namespace) -> int:
    with client_from_args(args) as api:
        hot_load = _find_hot_load(api, args)
        replicas = api.list_hot_load_replicas(hot_load.id)
        emit({"hot_load": hot_load.to_json(), "replicas": [r.to_json() for r in replicas]})
    return 0


def _list(args: argparse.Namespace) -> int:
    with client_from_args(args) as api:
        _existing_deployment(api, args.deployment)
        emit(_loader(args, api, args.deployment).list(limit=args.limit))
    return 0


def _check(args: argparse.Namespace) -> int:
    from cwtrain.hotload.store.prefix_access import check_snapshot_access
    from cwtrain.infra.s3 import s3_client

    if not args.bucket and resolve_deployment(args):
        with client_from_args(args) as api:
            deployment = api.get_deployment(args.deployment)
        if deployment.hot_load is None or not deployment.hot_load.bucket:
            raise ConfigError(f"deployment {deployment.id} has no hotLoad block: nothing to check")
        bucket, prefix = deployment.hot_load.bucket, deployment.hot_load.path_prefix.strip("/")
    elif args.bucket:
        bucket, prefix = args.bucket, (args.prefix or "").strip("/")
    else:
        return no_deployment(", or give --bucket B [--prefix P]")
    uri = check_snapshot_access(s3_client(), bucket, prefix)
    emit({"deployment": args.deployment, "bucket": bucket, "path_prefix": prefix, "uri": str(uri), "result": "ok"})
    return 0


def _rollback(args: argparse.Namespace) -> int:
    with client_from_args(args) as api:
        loader = _loader(args, api, args.deployment)
        return _print_outcome(
            lambda: loader.rollback(
                args.identity, prompt_cache_policy=_policy(args), wait=not args.no_wait, timeout=args.timeout
            )
        )


def _cancel(args: argparse.Namespace) -> int:
    with client_from_args(args) as api:
        emit(api.cancel_hot_load(args.hot_load_id))
    return 0
