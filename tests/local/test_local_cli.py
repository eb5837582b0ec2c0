"""``cwtrain local up`` / ``local down`` as real processes, and the ``demo`` command's parser."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from cwtrain.cli import build_parser

CWTRAIN = [sys.executable, "-c", "import sys; from cwtrain.cli import main; sys.exit(main())"]


def _start_up(state_file: Path, *, sigint_ignored: bool = False) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """``local up --no-deploy`` until it prints its JSON; ``sigint_ignored`` starts it as a script's
    background job is started (SIGINT ignored, which Python then leaves ignored)."""
    argv = [*CWTRAIN, "local", "up", "--no-deploy", "--state-file", str(state_file)]
    if sigint_ignored:
        argv = ["bash", "-c", 'trap "" INT; exec "$@"', "bash", *argv]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:  # one JSON document, 2-space indent, ends with a "}" line
        lines.append(line)
        if line.rstrip() == "}":
            break
    assert lines, proc.stderr.read() if proc.stderr else ""
    return proc, json.loads("".join(lines))


def _ready_line(proc: subprocess.Popen[str]) -> str:
    """The ``local stack running; ...`` line ``local up`` printed on stderr before its JSON."""
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("local stack running"):
            return line.strip()
    raise AssertionError("no 'local stack running' line")


def _answers(url: str) -> bool:
    try:
        httpx.get(url, timeout=2)
    except httpx.TransportError:
        return False
    return True


@pytest.mark.slow
def test_local_up_then_down(tmp_path: Path) -> None:
    state_file = tmp_path / "stack.json"
    proc, doc = _start_up(state_file)
    try:
        env = doc["env"]
        assert set(env) >= {"COREWEAVE_API_URL", "COREWEAVE_API_TOKEN", "AWS_REGION", "CW_S3_ENDPOINT"}
        assert doc["pid"] == proc.pid and state_file.exists()
        assert oct(state_file.stat().st_mode & 0o777) == "0o600"
        api = env["COREWEAVE_API_URL"] + "/v1alpha1/inference/gateways"
        response = httpx.get(api, headers={"Authorization": f"Bearer {env['COREWEAVE_API_TOKEN']}"})
        assert response.status_code == 200 and response.json() == {"items": []}
        second = subprocess.run(
            [*CWTRAIN, "local", "up", "--no-deploy", "--state-file", str(state_file)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 1 and "already running" in second.stderr

        # a second shell joins with `eval "$(cwtrain local env)"`: the same variables, exported
        shell = subprocess.run(
            ["bash", "-c", 'eval "$("$@" local env --state-file "$STATE")" && env -0', "bash", *CWTRAIN],
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin", "STATE": str(state_file)},
        )
        assert shell.returncode == 0, shell.stderr
        exported = dict(item.split("=", 1) for item in shell.stdout.split("\0") if "=" in item)
        assert {k: exported.get(k) for k in env} == env
        as_json = subprocess.run(
            [*CWTRAIN, "local", "env", "--json", "--state-file", str(state_file)], capture_output=True, text=True
        )
        assert json.loads(as_json.stdout) == env
        # the hints of the ready line work exactly as printed (they carry the same --state-file)
        ready = _ready_line(proc)
        eval_hint = f'eval "$(cwtrain local env --state-file {state_file})"'
        down_hint = f"cwtrain local down --state-file {state_file}"
        assert (
            ready == f"local stack running; another shell joins it with: {eval_hint}; Ctrl-C or '{down_hint}' stops it"
        )
        bin_dir = str(Path(sys.executable).parent)  # where the cwtrain script is
        joined = subprocess.run(
            ["bash", "-c", f'{eval_hint} && printf %s "$COREWEAVE_API_URL"'],
            capture_output=True, text=True, timeout=60, env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
        )  # fmt: skip
        assert (joined.returncode, joined.stdout) == (0, env["COREWEAVE_API_URL"]), joined.stderr
        # --no-deploy: no deployment, so no base checkpoint to fetch
        base = subprocess.run(
            [
                *CWTRAIN,
                "local",
                "base-checkpoint",
                "--out",
                str(state_file.parent / "base"),
                "--state-file",
                str(state_file),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert base.returncode == 1 and "has no deployment (started with --no-deploy)" in base.stderr
        assert not (state_file.parent / "base").exists()

        down = subprocess.run(
            ["bash", "-c", down_hint],
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
        )
        assert down.returncode == 0, down.stderr
        assert json.loads(down.stdout)["result"] == "stopped"
        assert proc.wait(timeout=30) == 0
        assert not state_file.exists()
        assert not _answers(env["COREWEAVE_API_URL"]) and not _answers(env["CW_S3_ENDPOINT"])
        again = subprocess.run(
            [*CWTRAIN, "local", "down", "--state-file", str(state_file)], capture_output=True, text=True, timeout=60
        )
        assert json.loads(again.stdout)["result"] == "not_running"
        gone = subprocess.run(
            [*CWTRAIN, "local", "env", "--state-file", str(state_file)], capture_output=True, text=True
        )
        assert gone.returncode == 1 and gone.stdout == ""
        assert gone.stderr.strip().startswith("error: no local stack is running (no state file")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize("sigint_ignored", [False, True], ids=["terminal", "sigint-ignored-by-parent"])
def test_local_up_stops_everything_on_ctrl_c(tmp_path: Path, sigint_ignored: bool) -> None:
    proc, doc = _start_up(tmp_path / "stack.json", sigint_ignored=sigint_ignored)
    try:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        assert not _answers(doc["env"]["CW_S3_ENDPOINT"])  # moto went with it
        assert not (tmp_path / "stack.json").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _children(pid: int) -> set[int]:
    """The processes ``pid`` started (every thread's children, from /proc)."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found |= {int(child) for child in (task / "children").read_text().split()}
    return found


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie waiting for its new parent's wait() does not)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return fields[0] not in ("Z", "X")


def _reap(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.faults
@pytest.mark.fault_row("local-up")
def test_a_second_local_up_with_the_same_state_file_refuses(tmp_path: Path) -> None:
    """Both started at once, before either wrote the state file: exactly one runs."""
    state_file = tmp_path / "stack.json"
    argv = [*CWTRAIN, "local", "up", "--no-deploy", "--state-file", str(state_file)]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        deadline = time.monotonic() + 60
        while all(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.1)
        ended = [p for p in procs if p.poll() is not None]
        assert len(ended) == 1, "both 'local up' ran with one state file"
        (loser,) = ended
        (winner,) = [p for p in procs if p is not loser]
        err = loser.stderr.read() if loser.stderr else ""
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        assert loser.returncode == 1 and len(lines) == 1 and "Traceback" not in err, err
        assert "already running" in lines[0] and str(state_file) in lines[0] and str(winner.pid) in lines[0]
        down = subprocess.run(
            [*CWTRAIN, "local", "down", "--state-file", str(state_file)], capture_output=True, text=True, timeout=120
        )
        assert json.loads(down.stdout)["pid"] == winner.pid, down.stderr
        assert winner.wait(timeout=60) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.slow
@pytest.mark.faults
@pytest.mark.fault_row("local-up")
def test_sigkill_of_local_up_takes_its_children_with_it(tmp_path: Path) -> None:
    """moto's server and the replicas end within seconds of the SIGKILL (as 'local down' sends it
    after --timeout), and the state file it left is known stale."""
    state_file = tmp_path / "stack.json"
    proc = subprocess.Popen(
        [*CWTRAIN, "local", "up", "--replicas", "1", "--state-file", str(state_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    children: set[int] = set()
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.rstrip() == "}":
                break
        doc = json.loads("".join(lines))
        children = _children(proc.pid)
        assert len(children) >= 2, children  # moto's server and the replica
        assert _answers(doc["env"]["CW_S3_ENDPOINT"])
        proc.kill()
        killed = time.monotonic()
        proc.wait(timeout=30)
        while any(_alive(pid) for pid in children) and time.monotonic() - killed < 10:
            time.sleep(0.05)
        left = {pid for pid in children if _alive(pid)}
        seconds = time.monotonic() - killed
        print(f"children of the SIGKILLed 'local up' gone after {seconds:.2f} s")
        assert not left, f"still running {seconds:.0f} s after the SIGKILL: {left}"
        assert not _answers(doc["env"]["CW_S3_ENDPOINT"])
        down = subprocess.run(
            [*CWTRAIN, "local", "down", "--state-file", str(state_file)], capture_output=True, text=True, timeout=60
        )
        assert json.loads(down.stdout)["result"] == "not_running" and not state_file.exists(), down.stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _reap(children)


def test_demo_and_local_parsers() -> None:
    parser = build_parser()
    args = parser.parse_args(["demo", "--steps", "3", "--seed", "7", "--replicas", "1"])
    assert (args.steps, args.seed, args.replicas) == (3, 7, 1)
    assert callable(args.func)
    args = parser.parse_args(["local", "up", "--replicas", "3", "--port", "8123"])
    assert (args.replicas, args.port, args.no_deploy) == (3, 8123, False)
    with pytest.raises(SystemExit):
        parser.parse_args(["local", "up", "--replicas", "0"])
    with pytest.raises(SystemExit):
        parser.parse_args(["local", "up", "--port", "70000"])


def test_local_up_help_says_where_it_differs_from_the_service(capsys: pytest.CaptureFixture[str]) -> None:
    from cwtrain.cli import main

    assert main(["local", "up", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "'cwtrain hotload cancel' works here" in text
    assert "the service does not implement cancel yet (it answers unimplemented" in text
    assert "CWTRAIN_HOTLOAD_DEPLOYMENT_ID, the default of every --deployment option" in text


def _cli(*argv: str) -> tuple[int, str, str]:
    out = subprocess.run([*CWTRAIN, *argv], capture_output=True, text=True, timeout=60)
    return out.returncode, out.stdout, out.stderr


def test_local_env_refuses_without_a_running_stack(tmp_path: Path) -> None:
    state_file = tmp_path / "stack.json"
    code, out, err = _cli("local", "env", "--state-file", str(state_file))
    assert (code, out) == (1, "")
    assert err.strip().splitlines() == [
        f"error: no local stack is running (no state file {state_file}); start one with 'cwtrain local up "
        f"--state-file {state_file}' in another shell and wait for its line 'local stack running'"
    ]
    # a state file left by a stack that died (a pid no process has)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    state_file.write_text(json.dumps({"pid": dead.pid, "env": {"COREWEAVE_API_URL": "http://127.0.0.1:9"}}))
    code, out, err = _cli("local", "env", "--state-file", str(state_file))
    assert (code, out) == (1, "")
    assert f"was written by pid {dead.pid}, which has exited" in err
    code, _, err = _cli("local", "base-checkpoint", "--out", str(tmp_path / "base"), "--state-file", str(state_file))
    assert code == 1 and "no local stack is running" in err and not (tmp_path / "base").exists()


def test_local_env_quotes_values_for_eval(tmp_path: Path) -> None:
    """Values with spaces and quotes survive eval (the state file of a live 'local' process)."""
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "cwtrain", "local"])
    try:
        state_file = tmp_path / "stack.json"
        env = {"CWTRAIN_X": "a b 'c' $HOME `x`", "CWTRAIN_Y": ""}
        state_file.write_text(json.dumps({"pid": holder.pid, "env": env}))
        shell = subprocess.run(
            ["bash", "-c", 'eval "$("$@" local env --state-file "$STATE")"; printf "%s|%s" "$CWTRAIN_X" "$CWTRAIN_Y"',
             "bash", *CWTRAIN],
            capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "STATE": str(state_file)},
        )  # fmt: skip
        assert shell.returncode == 0, shell.stderr
        assert shell.stdout == "a b 'c' $HOME `x`|"
    finally:
        holder.kill()
        holder.wait()


def test_base_checkpoint_refuses_a_directory_with_files(tmp_path: Path) -> None:
    out = tmp_path / "base"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, stdout, err = _cli("local", "base-checkpoint", "--out", str(out), "--state-file", str(tmp_path / "none.json"))
    assert (code, stdout) == (1, "")
    assert err.strip() == f"error: --out {out} is not empty; name a new or empty directory"
    assert (out / "keep.txt").read_text() == "mine"
    afile = tmp_path / "a-file"
    afile.write_text("x")
    code, _, err = _cli("local", "base-checkpoint", "--out", str(afile), "--state-file", str(tmp_path / "none.json"))
    assert code == 1 and "is not a directory" in err
    code, _, err = _cli("local", "base-checkpoint")
    assert code == 2 and "--out" in err
