"""The collection step: NeMo Gym's rollout collection pointed at a deployment's endpoint.

:func:`cwtrain.integrations.gym.evaluate` creates the deployment and hands the step a
:class:`CollectionJob`; the step runs NeMo Gym and returns a :class:`CollectionResult`.
Any callable ``collector(job) -> CollectionResult | None`` can stand in for the default
:class:`GymCLICollector` (tests use one; so can a caller that drives Gym's Python API).

The default collector drives Gym's own command line, as its documentation does:

1. writes ``<workdir>/cwtrain-policy.yaml`` (mode 0600) with ``policy_base_url`` (the
   rollout base URL), ``policy_api_key`` (the CoreWeave token) and ``policy_model_name``
   (``spec.model.name``), plus the ``vllm_model`` server block when the Gym config has no
   ``policy_model`` of its own (``return_token_id_information`` set from
   :attr:`GymEndpoint.token_ids`, ``uses_reasoning_parser: false``). The key goes into a
   file, never onto a command line, where any process listing would show it;
2. starts the servers: ``gym env start --config GYM.yaml --config cwtrain-policy.yaml``
   and waits for its ``All N / N servers ready!`` line;
3. collects: ``gym eval run --no-serve --input IN --output OUT [--agent A] [--limit N]
   [--num-repeats K] [--concurrency C] [--prompt-config P]``. Gym prints progress and metric
   blocks on stdout; the collector copies all of its output to *stderr*, so a caller's
   stdout stays its own (``cwtrain gym eval`` prints one JSON document there);
4. stops the servers it started (their process group: SIGINT, then SIGTERM, then SIGKILL).
   A failure is reported with the last lines of Gym's output and of the servers' log in
   the message itself (the log lives in the job's scratch directory, which the evaluation
   removes).

Relative paths (configs, the input, a prompt config, and the ``config_paths`` a config
chains to) resolve as Gym resolves them, :func:`resolve_gym_path`: the first of the
``NEMO_GYM_EXTRA_ROOTS`` roots, the working directory and Gym's install root where the file
exists (a pip-installed Gym ships ``benchmarks/`` and the server configs in site-packages).

Gym installs without ``gym`` but with the legacy ``ng_run``/``ng_collect_rollouts``
scripts (v0.4.0) are driven the same way with Hydra overrides (``+config_paths=[...]``,
``+agent_name=``, ``+input_jsonl_fpath=``, ...). Without either, :func:`require_gym`
raises :class:`GymNotInstalledError` naming the install
(:data:`cwtrain.integrations.gym.framework.GYM`: ``pip install "nemo-gym>=0.6.0"``).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import yaml  # type: ignore[import-untyped]

from cwtrain.errors import CWTrainError
from cwtrain.integrations.gym.framework import GYM

__all__ = [
    "CheckedCollector",
    "CollectionJob",
    "CollectionResult",
    "Collector",
    "GymCLICollector",
    "GymEndpoint",
    "GymNotInstalledError",
    "GymTools",
    "aggregate_metrics_path",
    "gym_install_root",
    "gym_search_roots",
    "policy_overlay",
    "require_gym",
    "resolve_gym_path",
    "write_policy_overlay",
]

log = logging.getLogger(__name__)

_READY = re.compile(r"All (\d+) / (\d+) servers ready")


class GymNotInstalledError(CWTrainError, ImportError):
    """NeMo Gym's command line is not installed where the evaluation runs."""


@dataclass(frozen=True)
class GymEndpoint:
    """Where Gym's model server sends its requests: the deployment's OpenAI endpoint.

    Attributes:
        base_url: the rollout base URL, ending in ``/v1``.
        model: the OpenAI model name (the deployment's ``spec.model.name``).
        api_key: the bearer key (a CoreWeave API token for ``coreWeaveAuth`` gateways).
        token_ids: ask Gym's ``vllm_model`` server for token-id information
            (``return_token_id_information``), as Gym's training model server does. It relies on
            vLLM's ``/tokenize`` at the server root, which the gateway may not expose, and a scored
            evaluation does not need it, so it is off by default.
    """

    base_url: str
    model: str
    api_key: str | None = field(default=None, repr=False)
    token_ids: bool = False


@dataclass(frozen=True)
class CollectionJob:
    """One rollout collection against a ready deployment.

    Attributes:
        endpoint: the deployment's endpoint.
        config_paths: Gym YAML configs (resources server, agent, optionally model server).
        input_path: the input JSONL (rows with ``responses_create_params``, ``agent_ref``).
        output_path: where the rollouts JSONL goes; Gym writes
            ``<stem>_materialized_inputs.jsonl`` and ``<stem>_aggregate_metrics.json`` beside it.
        workdir: a private scratch directory (the endpoint overlay, server logs).
        agent: the agent for rows without ``agent_ref``.
        limit: at most this many input rows.
        num_repeats: rollouts per row.
        concurrency: rollouts in flight.
        prompt_config: a prompt template YAML Gym applies to rows that carry only fields (a
            benchmark's ``question``/``expected_answer`` rows, e.g. ``aime24``).
        extra_args: more arguments for Gym's collection command, passed unchanged.
    """

    endpoint: GymEndpoint
    config_paths: tuple[Path, ...]
    input_path: Path
    output_path: Path
    workdir: Path
    agent: str | None = None
    limit: int | None = None
    num_repeats: int = 1
    concurrency: int | None = None
    prompt_config: Path | None = None
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class CollectionResult:
    """What the collection step produced (paths as Gym wrote them)."""

    output_path: Path
    aggregate_metrics_path: Path | None = None


#: The collection step: run Gym for one job. ``None`` means "the files are where the job said".
#: A collector may also have a ``check()`` method (:class:`CheckedCollector`), called before
#: the deployment is created.
Collector = Callable[[CollectionJob], "CollectionResult | None"]


@runtime_checkable
class CheckedCollector(Protocol):
    """A collector that can say before any deployment exists that it cannot run."""

    def check(self) -> None:
        """Raise when the collection cannot run (e.g. :class:`GymNotInstalledError`)."""
        ...

    def __call__(self, job: CollectionJob, /) -> CollectionResult | None:
        """Run the collection of ``job``."""
        ...


def aggregate_metrics_path(output_path: Path) -> Path:
    """Where Gym writes the aggregate metrics of a rollouts file (``<stem>_aggregate_metrics.json``)."""
    return output_path.with_name(output_path.stem + "_aggregate_metrics.json")


# --------------------------------------------------------------------------- Gym's paths


def _install_root_from(python: str) -> Path | None:
    code = "import os, nemo_gym; print(os.path.dirname(os.path.dirname(os.path.abspath(nemo_gym.__file__))))"
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    line = done.stdout.strip().splitlines()[-1:] if done.returncode == 0 else []
    return Path(line[0]) if line else None


def _interpreter_of(script: str) -> str | None:
    try:
        with open(script, "rb") as handle:
            first = handle.readline(4096).decode("utf-8", "replace").strip()
    except OSError:
        return None
    if not first.startswith("#!"):
        return None
    words = first[2:].split()
    if not words:
        return None
    python = words[1] if Path(words[0]).name == "env" and len(words) > 1 else words[0]
    return python if "python" in Path(python).name else None


@cache
def _find_install_root(gym: str | None) -> Path | None:
    spec = importlib.util.find_spec("nemo_gym")
    if spec is not None and spec.origin:
        return Path(spec.origin).resolve().parent.parent
    python = _interpreter_of(gym) if gym else None
    return _install_root_from(python) if python else None


def gym_install_root(tools: GymTools | None = None) -> Path | None:
    """The directory that holds Gym's ``nemo_gym`` package (its built-in configs and benchmarks are beside it).

    From this interpreter when it imports ``nemo_gym``, else from the interpreter of the ``gym``
    command (``tools``, else the one on ``PATH``); ``None`` when neither says.
    """
    gym = tools.gym if tools is not None else shutil.which("gym")
    return _find_install_root(gym)


def gym_search_roots(
    install_root: Path | None, environ: Mapping[str, str] | None = None, cwd: Path | None = None
) -> list[Path]:
    """Where Gym looks for a relative path, in order: ``NEMO_GYM_EXTRA_ROOTS``, the working directory, the install root."""
    env = os.environ if environ is None else environ
    roots = [Path(p) for p in env.get("NEMO_GYM_EXTRA_ROOTS", "").split(os.pathsep) if p]
    roots.append(cwd or Path.cwd())
    if install_root is not None:
        roots.append(install_root)
    return roots


def resolve_gym_path(
    path: str | Path,
    *,
    install_root: Path | None = None,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Path:
    """``path`` as Gym reads it: absolute as is; relative under the first search root where it exists.

    Returns the path under the working directory when no root has it (so errors name the
    user's own location).
    """
    candidate = Path(path)
    if candidate.is_absolute():
        return candidate
    for root in gym_search_roots(install_root, environ, cwd):
        if (root / candidate).exists():
            return (root / candidate).absolute()
    return ((cwd or Path.cwd()) / candidate).absolute()


# --------------------------------------------------------------------------- the endpoint overlay


def _load_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CWTrainError(f"Gym config {path} does not exist; pass the YAML of the Gym environment") from None
    except yaml.YAMLError as exc:
        raise CWTrainError(f"Gym config {path} is not valid YAML: {exc}") from None
    return data if isinstance(data, dict) else {}


def _policy_model_types(
    config_paths: Sequence[Path], install_root: Path | None = None, _seen: set[Path] | None = None
) -> set[str]:
    """The model-server types the configs declare under ``policy_model.responses_api_models``.

    Follows the ``config_paths`` a Gym config chains to, resolved as Gym resolves them
    (:func:`resolve_gym_path`: not relative to the including file); chained files found
    under no root are skipped.
    """
    seen = set() if _seen is None else _seen
    types: set[str] = set()
    for path in config_paths:
        path = resolve_gym_path(path, install_root=install_root)
        if path.resolve() in seen:
            continue
        seen.add(path.resolve())
        config = _load_yaml(path)
        policy = config.get("policy_model")
        if isinstance(policy, dict):
            servers = policy.get("responses_api_models")
            types.update(servers if isinstance(servers, dict) else {"<unknown>"})
        chained = config.get("config_paths")
        if isinstance(chained, list):
            found = [resolve_gym_path(str(p), install_root=install_root) for p in chained]
            types |= _policy_model_types([p for p in found if p.is_file()], install_root, seen)
    return types


def policy_overlay(
    endpoint: GymEndpoint, config_paths: Sequence[Path] = (), install_root: Path | None = None
) -> dict[str, Any]:
    """The Gym config that points its policy model server at ``endpoint``.

    The three global keys every Gym model config interpolates (``policy_base_url``,
    ``policy_api_key``, ``policy_model_name``) always; the ``vllm_model`` server block when
    no config declares a ``policy_model`` (with the token-id options), or the token-id
    options alone when they declare a ``vllm_model`` one. Another model type keeps its own
    settings (logged). ``install_root``: Gym's (for relative paths, see :func:`resolve_gym_path`).
    """
    overlay: dict[str, Any] = {
        "policy_base_url": endpoint.base_url,
        "policy_api_key": endpoint.api_key or "",
        "policy_model_name": endpoint.model,
    }
    declared = _policy_model_types(config_paths, install_root)
    server: dict[str, Any] = {"return_token_id_information": endpoint.token_ids}
    if not declared:
        server = {
            "entrypoint": "app.py",
            "base_url": "${policy_base_url}",
            "api_key": "${policy_api_key}",
            "model": "${policy_model_name}",
            "return_token_id_information": endpoint.token_ids,
            "uses_reasoning_parser": False,
        }
    elif "vllm_model" not in declared:
        log.info(
            "the Gym config's policy model is %s, not vllm_model: only policy_base_url, policy_api_key and "
            "policy_model_name are set",
            ", ".join(sorted(declared)),
        )
        return overlay
    overlay["policy_model"] = {"responses_api_models": {"vllm_model": server}}
    return overlay


def write_policy_overlay(job: CollectionJob, install_root: Path | None = None) -> Path:
    """Write :func:`policy_overlay` to ``<workdir>/cwtrain-policy.yaml``, readable by the owner only."""
    path = job.workdir / "cwtrain-policy.yaml"
    text = yaml.safe_dump(policy_overlay(job.endpoint, job.config_paths, install_root), sort_keys=False)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    return path


# --------------------------------------------------------------------------- locating Gym


@dataclass(frozen=True)
class GymTools:
    """The Gym executables found: the ``gym`` CLI, or the legacy ``ng_run``/``ng_collect_rollouts`` pair."""

    gym: str | None = None
    ng_run: str | None = None
    ng_collect_rollouts: str | None = None

    @property
    def legacy(self) -> bool:
        """Whether only the legacy scripts are available."""
        return self.gym is None


def require_gym(which: Callable[[str], str | None] = shutil.which) -> GymTools:
    """Find NeMo Gym's command line on ``PATH``.

    Raises:
        GymNotInstalledError: neither ``gym`` nor ``ng_run`` + ``ng_collect_rollouts`` exists;
            the message names the install.
    """
    gym = which("gym")
    if gym:
        return GymTools(gym=gym)
    ng_run, ng_collect = which("ng_run"), which("ng_collect_rollouts")
    if ng_run and ng_collect:
        return GymTools(ng_run=ng_run, ng_collect_rollouts=ng_collect)
    raise GymNotInstalledError(
        f"{GYM.name} is not installed: no `gym` (or `ng_run`/`ng_collect_rollouts`) on PATH. Install "
        f"{GYM.name} {GYM.supported} ({GYM.where}, or run inside the {GYM.name} image), or pass a collector "
        "of your own to cwtrain.integrations.gym.evaluate"
    )


def serve_command(tools: GymTools, config_paths: Sequence[Path]) -> list[str]:
    """The command that starts Gym's servers for ``config_paths`` (the overlay last)."""
    if tools.gym:
        command = [tools.gym, "env", "start"]
        for path in config_paths:
            command += ["--config", str(path)]
        return command
    assert tools.ng_run is not None
    return [tools.ng_run, f"+config_paths=[{','.join(str(p) for p in config_paths)}]"]


def collect_command(tools: GymTools, job: CollectionJob) -> list[str]:
    """The command that collects the rollouts of ``job`` from the running servers."""
    if tools.gym:
        command = [tools.gym, "eval", "run", "--no-serve", "--input", str(job.input_path)]
        command += ["--output", str(job.output_path), "--num-repeats", str(job.num_repeats)]
        if job.agent:
            command += ["--agent", job.agent]
        if job.limit is not None:
            command += ["--limit", str(job.limit)]
        if job.concurrency is not None:
            command += ["--concurrency", str(job.concurrency)]
        if job.prompt_config is not None:
            command += ["--prompt-config", str(job.prompt_config)]
        return [*command, *job.extra_args]
    assert tools.ng_collect_rollouts is not None
    command = [
        tools.ng_collect_rollouts,
        f"+input_jsonl_fpath={job.input_path}",
        f"+output_jsonl_fpath={job.output_path}",
        f"+num_repeats={job.num_repeats}",
    ]
    if job.agent:
        command.append(f"+agent_name={job.agent}")
    if job.limit is not None:
        command.append(f"+limit={job.limit}")
    if job.concurrency is not None:
        command.append(f"+num_samples_in_parallel={job.concurrency}")
    if job.prompt_config is not None:
        command.append(f"+prompt_config={job.prompt_config}")
    return [*command, *job.extra_args]


# --------------------------------------------------------------------------- the default collector


class GymCLICollector:
    """The default collection step: Gym's own CLI, servers started and stopped around it.

    Args:
        server_timeout: seconds to wait for Gym's servers to report ready.
        tools: the Gym executables (default: found on ``PATH`` at call time).
        env: extra environment variables for Gym's processes.
    """

    def __init__(
        self,
        *,
        server_timeout: float = 900.0,
        tools: GymTools | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.server_timeout = server_timeout
        self.tools = tools
        self.env = dict(env or {})

    def check(self) -> None:
        """Find Gym's CLI now (before a deployment is created for nothing).

        Raises:
            GymNotInstalledError: Gym is not installed; the message names the install.
        """
        if self.tools is None:
            self.tools = require_gym()

    def __call__(self, job: CollectionJob) -> CollectionResult:
        """Start Gym's servers, collect the rollouts of ``job``, stop the servers."""
        tools = self.tools or require_gym()
        overlay = write_policy_overlay(job, gym_install_root(tools))
        env = {**os.environ, **self.env}
        server_log = job.workdir / "gym-servers.log"
        with server_log.open("wb") as log_file:
            server = subprocess.Popen(
                serve_command(tools, [*job.config_paths, overlay]),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # its own process group: stopped as a whole below
            )
            try:
                self._wait_ready(server, server_log)
                command = collect_command(tools, job)
                log.info("collecting rollouts: %s", " ".join(command))
                returncode, output = _run_to_stderr(command, env)
                if returncode != 0:
                    raise CWTrainError(
                        f"NeMo Gym's rollout collection exited with {returncode}. Its last output:\n"
                        f"{_tail(output)}\nThe servers' last output:\n"
                        f"{_tail(server_log.read_text(encoding='utf-8', errors='replace'))}"
                    )
            finally:
                _stop(server)
        metrics = aggregate_metrics_path(job.output_path)
        return CollectionResult(job.output_path, metrics if metrics.exists() else None)

    def _wait_ready(self, server: subprocess.Popen[bytes], server_log: Path) -> None:
        deadline = time.monotonic() + self.server_timeout
        while True:
            text = server_log.read_text(encoding="utf-8", errors="replace")
            if _READY.search(text):
                log.info("NeMo Gym servers ready")
                return
            if server.poll() is not None:
                raise CWTrainError(
                    f"NeMo Gym's servers exited with {server.returncode} before they were ready. Their last "
                    f"output:\n{_tail(text)}"
                )
            if time.monotonic() > deadline:
                raise CWTrainError(
                    f"NeMo Gym's servers were not ready after {self.server_timeout:.0f}s. Their last output:\n"
                    f"{_tail(text)}"
                )
            time.sleep(0.5)


def _run_to_stderr(command: Sequence[str], env: Mapping[str, str], keep: int = 200) -> tuple[int, str]:
    """Run ``command``, copying its stdout and stderr to this process's stderr; returns the exit code
    and the last ``keep`` lines of its output."""
    tail: deque[str] = deque(maxlen=keep)
    process = subprocess.Popen(
        list(command), env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    assert process.stdout is not None
    try:
        for raw in process.stdout:
            line = raw.decode("utf-8", errors="replace")
            tail.append(line.rstrip("\n"))
            sys.stderr.write(line)
            sys.stderr.flush()
    except BaseException:
        process.kill()
        raise
    finally:
        process.stdout.close()
        process.wait()
    return process.returncode, "\n".join(tail)


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _stop(process: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """Stop the process group the server runs in: SIGINT, SIGTERM, then SIGKILL."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        if process.poll() is not None:
            return
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue
