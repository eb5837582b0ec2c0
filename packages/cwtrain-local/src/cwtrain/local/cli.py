"""``cwtrain local up|down|env|base-checkpoint`` and ``cwtrain demo``: the local stack from the command line.

``cwtrain local up [--replicas N] [--port P] [--no-deploy] [--slow-hot-load S]`` starts the whole stack
(object store, control plane, gateway and, unless ``--no-deploy``, a hot-load deployment
of the tiny model with N replicas), prints one JSON document with the environment to
export on stdout and the same as ``export`` lines on stderr, then runs until Ctrl-C or
``cwtrain local down``::

    cwtrain local up --replicas 2          # terminal 1
    eval "$(cwtrain local env)"            # terminal 2: the same exports, from the state file
    cwtrain hotload list                   # terminal 2 (--deployment from the env)
    cwtrain local base-checkpoint --out base   # the weights the deployment started with
    cwtrain local down                     # or Ctrl-C in terminal 1

The same variables are in the state file's ``env`` object (JSON), for scripts; ``cwtrain
local env`` prints them as ``export`` lines (``--json``: one JSON object) and refuses, exit
1, when no ``local up`` runs. With them exported, ``--deployment`` may be left out of every
command (it defaults to ``CWTRAIN_HOTLOAD_DEPLOYMENT_ID``). ``cwtrain local base-checkpoint
--out DIR`` copies the base checkpoint the running stack's deployment serves (its
``spec.model`` prefix in the local object store: ``config.json``,
``tokenizer_config.json``, ``model.safetensors`` and its index) into ``DIR``, which must not
exist or be empty.

Where the local stack differs from the service on purpose: ``cwtrain hotload cancel`` works
locally (the hot-load ends CANCELED and the replicas keep what they served) although the
service does not implement cancel yet (it answers ``unimplemented``); see
:mod:`cwtrain.local.controlplane.server`. A local hot-load ends in well under a second, too
fast to cancel or to watch: ``--slow-hot-load S`` makes every hot-load last S seconds more
(replicas stay UPDATING), so ``cwtrain hotload cancel`` and the progress of ``cwtrain
hotload wait`` can be tried by hand::

    cwtrain local up --slow-hot-load 30                         # terminal 1
    cwtrain hotload publish --checkpoint ./ckpt --identity t-v000001 --no-wait    # terminal 2
    cwtrain hotload wait <hot-load id>                          # in_progress ... (ready=0, updating=2)
    cwtrain hotload cancel <hot-load id>                        # or this: CANCELED, v000000 still served

The environment holds ``COREWEAVE_API_URL``, ``COREWEAVE_API_TOKEN``, ``AWS_REGION``,
``CW_S3_ENDPOINT``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, the bucket, and with a
deployment ``CWTRAIN_HOTLOAD_DEPLOYMENT_ID``, ``CWTRAIN_ROLLOUT_BASE_URL``,
``CWTRAIN_ROLLOUT_MODEL`` and ``CWTRAIN_ROLLOUT_API_KEY``. ``local up`` records its pid in a
state file (``~/.cache/cwtrain-local/stack.json``, or under ``XDG_CACHE_HOME``; mode 0600
since it holds the local token) that ``local down`` uses to stop it (SIGTERM, then SIGKILL).

One stack per state file: ``local up`` holds an exclusive lock (``flock``) on
``<state file>.lock`` (which names its pid) from before it starts anything until it exits;
the kernel drops the lock when the process dies, however it died. A second ``local up``
with the same state file refuses at once (exit 1, naming the holder's pid), and ``local
down`` asks the lock, not only the pid, whether a stack runs. The lock file stays (removing
it while another process may have it open would let two stacks hold two different files).
Every child of the stack (moto's server, the replicas) is killed by the kernel when ``local
up`` dies, SIGKILL included (:mod:`cwtrain.local.children`).

``cwtrain demo`` runs :func:`cwtrain.local.demo.run.main` (GRPO on the tiny model against a
fresh local stack; its options are listed by ``cwtrain demo --help``).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import Any

from cwtrain.cli import command_group, interrupt_on_signal, positive_float, positive_int
from cwtrain.jsondoc import load_json

__all__ = ["default_state_file", "register", "running_state"]

log = logging.getLogger("cwtrain.local.cli")


def default_state_file() -> Path:
    """``$XDG_CACHE_HOME/cwtrain-local/stack.json`` (``~/.cache`` without the variable)."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "cwtrain-local" / "stack.json"


_STATE_FILE_HELP = "pid/state file (~/.cache/cwtrain-local/stack.json)"


def _with_state_file(command: str, state_file: Path | None) -> str:
    """``command`` as a user can run it: with ``--state-file`` when one was given (every hint works as printed)."""
    return f"{command} --state-file {shlex.quote(str(state_file))}" if state_file is not None else command


def _port(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port")
    return value


def register(subparsers: Any) -> None:
    """Add the ``local`` group (``up``, ``down``) and the ``demo`` command."""
    commands = command_group(
        subparsers,
        "local",
        "run the remote side (API, gateway, replicas, S3) on this machine",
        "Run the remote side of cwtrain on loopback: object store, control plane, gateway, replicas.",
    )

    up = commands.add_parser(
        "up",
        help="start the local stack and print the environment; runs until Ctrl-C",
        description=(
            "Start the object store, the control plane, a gateway and (unless --no-deploy) a hot-load "
            "deployment of the tiny model; print the environment to export (stdout: JSON, stderr: export "
            "lines, including CWTRAIN_HOTLOAD_DEPLOYMENT_ID, the default of every --deployment option; "
            'another shell gets them with: eval "$(cwtrain local env)"); '
            "run until Ctrl-C or 'cwtrain local down'. Differences from the service: 'cwtrain hotload "
            "cancel' works here (the hot-load ends CANCELED) while the service does not implement cancel "
            "yet (it answers unimplemented, exit 1); a hot-load created without a prompt cache policy "
            "echoes PROMPT_CACHE_POLICY_PRESERVE."
        ),
    )
    up.add_argument("--replicas", type=positive_int, default=2, help="replicas of the deployment (2)")
    up.add_argument("--port", type=_port, default=None, help="control plane port (a free one)")
    up.add_argument("--no-deploy", action="store_true", help="start without a gateway and deployment")
    up.add_argument(
        "--slow-hot-load",
        metavar="SECONDS",
        type=positive_float,
        default=0.0,
        help="make every hot-load last SECONDS more (replicas stay UPDATING), to try 'hotload cancel' and "
        "'hotload wait' by hand (0: as fast as it goes)",
    )
    up.add_argument("--state-file", type=Path, default=None, help=_STATE_FILE_HELP)
    up.set_defaults(func=_up)

    down = commands.add_parser("down", help="stop the stack started by 'cwtrain local up'")
    down.add_argument("--state-file", type=Path, default=None, help=_STATE_FILE_HELP)
    down.add_argument("--timeout", type=float, default=30.0, help="seconds to wait before SIGKILL (30)")
    down.set_defaults(func=_down)

    env = commands.add_parser(
        "env",
        help="print the export lines of the running 'cwtrain local up' (for eval in another shell)",
        description=(
            "Print the environment of the stack 'cwtrain local up' runs, read from its state file, as "
            'export lines on stdout, so that another shell joins it with: eval "$(cwtrain local env)". '
            "Exit 1 with one error line when no 'local up' is running."
        ),
    )
    env.add_argument("--state-file", type=Path, default=None, help=_STATE_FILE_HELP)
    env.add_argument("--json", action="store_true", help="print one JSON object instead of export lines")
    env.set_defaults(func=_env)

    base = commands.add_parser(
        "base-checkpoint",
        help="copy the base checkpoint the local deployment serves into a directory",
        description=(
            "Copy the base checkpoint of the deployment 'cwtrain local up' created (the tiny model: "
            "config.json, tokenizer_config.json, model.safetensors with BF16 weights, and its index) "
            "from the local object store into DIR, a normal HuggingFace safetensors directory to change "
            "and publish. DIR must not exist or be empty. Needs a running 'cwtrain local up' with a "
            "deployment."
        ),
    )
    base.add_argument("--out", type=Path, required=True, metavar="DIR", help="where to write it (new or empty)")
    base.add_argument("--state-file", type=Path, default=None, help=_STATE_FILE_HELP)
    base.set_defaults(func=_base_checkpoint)

    demo = subparsers.add_parser(
        "demo",
        help="train the tiny model with GRPO against a local stack, hot-loading every step",
        description="GRPO on the tiny model against a local stack: sample, score, update, publish, hot-load.",
    )
    try:
        from cwtrain.local.demo.run import add_arguments
    except ImportError:  # the demo module is missing or broken: keep the basic options
        demo.add_argument("--steps", type=positive_int, default=40, help="training steps (40)")
        demo.add_argument("--seed", type=int, default=0, help="seed (0)")
        demo.add_argument("--replicas", type=positive_int, default=2, help="engine replicas (2)")
    else:
        add_arguments(demo)
    demo.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    from cwtrain.local.demo.run import main

    return int(main(args))


def _lock_file(state_file: Path) -> Path:
    return state_file.with_name(state_file.name + ".lock")


def _holder(state_file: Path) -> int | None:
    """The pid of the ``local up`` holding ``state_file``'s lock; ``None`` when none holds it
    (0 when one does but has not written its pid yet)."""
    try:
        fd = os.open(_lock_file(state_file), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        return int(text) if text.isdigit() else 0
    finally:
        os.close(fd)  # closing drops the shared lock, if taken
    return None


def _hold_lock(state_file: Path) -> int:
    """Take ``state_file``'s lock for this process's life (the returned descriptor holds it).

    Raises:
        CWTrainError: another ``local up`` holds it.
    """
    from cwtrain.errors import CWTrainError

    state_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(_lock_file(state_file), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        pid = f"pid {text}" if text.isdigit() else "a process still starting"
        raise CWTrainError(
            f"a local stack is already running: {pid} holds the state file {state_file}; stop it with "
            f"'{_with_state_file('cwtrain local down', state_file)}', or give this one another --state-file"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _read_state(path: Path) -> dict[str, Any] | None:
    try:
        data = load_json(path.read_bytes())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _is_our_process(pid: int) -> bool:
    """Whether ``pid`` runs and looks like a ``cwtrain local up`` (not a recycled pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return True  # no /proc: trust the state file
    return b"cwtrain" in cmdline and b"local" in cmdline


def running_state(state_file: Path | None = None) -> dict[str, Any]:
    """The state of the running ``cwtrain local up`` (its ``pid``, ``env``, ``deployment_id``, ...).

    Raises:
        CWTrainError: no state file, or the process that wrote it is gone.
    """
    from cwtrain.errors import CWTrainError

    path = state_file or default_state_file()
    up = _with_state_file("cwtrain local up", state_file)
    state = _read_state(path)
    if state is None:
        raise CWTrainError(
            f"no local stack is running (no state file {path}); start one with '{up}' in another "
            "shell and wait for its line 'local stack running'"
        )
    pid = int(state.get("pid", 0) or 0)
    if pid <= 0 or not _is_our_process(pid):
        raise CWTrainError(
            f"no local stack is running: {path} was written by pid {pid}, which has exited; start one with '{up}'"
        )
    if not isinstance(state.get("env"), dict):
        raise CWTrainError(f"{path} holds no environment; restart the stack with '{up}'")
    return state


def _env(args: argparse.Namespace) -> int:
    from cwtrain.cli import emit

    env = {str(k): str(v) for k, v in running_state(args.state_file)["env"].items()}
    if args.json:
        emit(env)
    else:
        sys.stdout.write("".join(f"export {key}={shlex.quote(value)}\n" for key, value in env.items()))
    return 0


def _base_checkpoint(args: argparse.Namespace) -> int:
    from cwtrain.cli import emit
    from cwtrain.errors import CWTrainError
    from cwtrain.infra import InferenceClient, s3_client
    from cwtrain.integrations.staging import fetch_base_checkpoint, refuse_unless_new

    out: Path = args.out
    refuse_unless_new(out, f"--out {out}")  # named as the option, before the stack's state is read
    state = running_state(args.state_file)
    env = {str(k): str(v) for k, v in state["env"].items()}
    deployment_id = env.get("CWTRAIN_HOTLOAD_DEPLOYMENT_ID") or str(state.get("deployment_id") or "")
    if not deployment_id:
        raise CWTrainError("the running local stack has no deployment (started with --no-deploy); restart it without")
    s3 = s3_client(
        env["CW_S3_ENDPOINT"],
        region_name=env["AWS_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )
    with InferenceClient(env["COREWEAVE_API_TOKEN"], base_url=env["COREWEAVE_API_URL"]) as api:
        emit(fetch_base_checkpoint(deployment_id, out, api=api, s3=s3).to_json())
    return 0


def _up(args: argparse.Namespace) -> int:
    from cwtrain.cli import emit
    from cwtrain.local.stack import LocalStack

    state_file: Path = args.state_file or default_state_file()
    lock = _hold_lock(state_file)  # held until this process ends; the kernel drops it if it dies
    # SIGINT too: a stack started from a script's background job inherits SIGINT ignored, and
    # Python then installs no KeyboardInterrupt handler; Ctrl-C and kill -INT must still stop it.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt_on_signal)  # SIGINT: KeyboardInterrupt; SIGTERM/SIGHUP: Terminated
    try:
        with LocalStack(replicas=args.replicas, port=args.port, hot_load_delay=args.slow_hot_load) as stack:
            env = stack.env()
            result: dict[str, Any] = {"pid": os.getpid(), "state_file": str(state_file)}
            if not args.no_deploy:
                log.info("starting %d replica(s) of the tiny model; this takes a few seconds", args.replicas)
                target = stack.deploy(replicas=args.replicas)
                env.update(
                    CWTRAIN_HOTLOAD_DEPLOYMENT_ID=target.deployment_id,
                    CWTRAIN_ROLLOUT_BASE_URL=target.base_url,
                    CWTRAIN_ROLLOUT_MODEL=target.model,
                    CWTRAIN_ROLLOUT_API_KEY=stack.token,
                )
                result.update(gateway_id=target.gateway_id, deployment_id=target.deployment_id)
            result["env"] = env
            state_file.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(state_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                json.dump(result, out, indent=2)
            try:
                for key, value in env.items():
                    print(f"export {key}={shlex.quote(value)}", file=sys.stderr)
                env_command = _with_state_file("cwtrain local env", args.state_file)
                down_command = _with_state_file("cwtrain local down", args.state_file)
                print(
                    f'local stack running; another shell joins it with: eval "$({env_command})"; '
                    f"Ctrl-C or '{down_command}' stops it",
                    file=sys.stderr,
                    flush=True,
                )
                emit(result)
                while True:
                    time.sleep(3600)
            finally:
                current = _read_state(state_file)
                if current and current.get("pid") == os.getpid():
                    state_file.unlink(missing_ok=True)
    except KeyboardInterrupt:
        print("local stack stopped", file=sys.stderr)
    finally:
        os.close(lock)
    return 0


def _down(args: argparse.Namespace) -> int:
    from cwtrain.cli import emit

    state_file: Path = args.state_file or default_state_file()
    locked = _lock_file(state_file).exists()
    holder = _holder(state_file)
    for _ in range(20):  # locked a moment ago, its pid not written yet
        if holder != 0:
            break
        time.sleep(0.05)
        holder = _holder(state_file)
    state = _read_state(state_file) or {}
    # the lock says whether a stack runs; without a lock file, an older cwtrain's state file: its pid
    pid = holder or int(state.get("pid", 0) or 0)
    running = bool(holder) if locked else pid > 0 and _is_our_process(pid)
    if not running:
        state_file.unlink(missing_ok=True)  # none, or stale: its stack ended without removing it
        emit({"result": "not_running", "pid": pid, "state_file": str(state_file)})
        return 0
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + args.timeout
    result = "stopped"
    while _holder(state_file) == pid if locked else _is_our_process(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            result = "killed"
            break
        time.sleep(0.1)
    state_file.unlink(missing_ok=True)
    emit({"result": result, "pid": pid, "state_file": str(state_file)})
    return 0
