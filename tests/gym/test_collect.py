"""The collection step: Gym's endpoint overlay, its command lines, locating Gym, and the
default collector driving a stand-in ``gym`` CLI against a stub OpenAI endpoint over HTTP."""

from __future__ import annotations

import os
import pickle
import stat
from pathlib import Path

import pytest
import yaml
from gym_support import FakeGym, StubEndpoint, write_rows

from cwtrain.errors import CWTrainError
from cwtrain.integrations.gym import GymNotInstalledError
from cwtrain.integrations.gym.collect import (
    CollectionJob,
    GymCLICollector,
    GymEndpoint,
    GymTools,
    collect_command,
    gym_search_roots,
    policy_overlay,
    require_gym,
    resolve_gym_path,
    serve_command,
    write_policy_overlay,
)

ENDPOINT = GymEndpoint(base_url="https://gw.example/v1", model="qwen3-4b", api_key="secret-token", token_ids=True)


def yaml_file(path: Path, data: object) -> Path:
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def job(
    tmp_path: Path, endpoint: GymEndpoint = ENDPOINT, configs: tuple[Path, ...] = (), **kw: object
) -> CollectionJob:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return CollectionJob(
        endpoint=endpoint,
        config_paths=configs,
        input_path=tmp_path / "in.jsonl",
        output_path=tmp_path / "out" / "rollouts.jsonl",
        workdir=work,
        **kw,  # type: ignore[arg-type]
    )


# --------------------------------------------------------------------------- overlay


def test_overlay_adds_a_vllm_model_server_when_the_config_has_none(tmp_path: Path) -> None:
    config = yaml_file(tmp_path / "env.yaml", {"math_resources_server": {"resources_servers": {"math": {}}}})
    overlay = policy_overlay(ENDPOINT, [config])
    assert overlay["policy_base_url"] == "https://gw.example/v1"
    assert overlay["policy_api_key"] == "secret-token"
    assert overlay["policy_model_name"] == "qwen3-4b"
    server = overlay["policy_model"]["responses_api_models"]["vllm_model"]
    assert server["base_url"] == "${policy_base_url}"
    assert server["api_key"] == "${policy_api_key}"
    assert server["model"] == "${policy_model_name}"
    assert server["return_token_id_information"] is True
    assert server["uses_reasoning_parser"] is False
    plain = policy_overlay(GymEndpoint("https://x/v1", "m", None), [config])
    assert plain["policy_model"]["responses_api_models"]["vllm_model"]["return_token_id_information"] is False
    assert plain["policy_api_key"] == ""


def test_overlay_only_sets_token_ids_on_a_declared_vllm_model(tmp_path: Path) -> None:
    declared = {"policy_model": {"responses_api_models": {"vllm_model": {"entrypoint": "app.py", "num_workers": 8}}}}
    config = yaml_file(tmp_path / "env.yaml", declared)
    overlay = policy_overlay(ENDPOINT, [config])
    assert overlay["policy_model"] == {"responses_api_models": {"vllm_model": {"return_token_id_information": True}}}


def test_overlay_leaves_another_model_type_alone(tmp_path: Path) -> None:
    config = yaml_file(tmp_path / "env.yaml", {"policy_model": {"responses_api_models": {"openai_model": {}}}})
    overlay = policy_overlay(ENDPOINT, [config])
    assert "policy_model" not in overlay
    assert overlay["policy_base_url"] == ENDPOINT.base_url


def test_bad_configs_are_named(tmp_path: Path) -> None:
    with pytest.raises(CWTrainError, match=r"missing\.yaml does not exist"):
        policy_overlay(ENDPOINT, [tmp_path / "missing.yaml"])
    broken = tmp_path / "broken.yaml"
    broken.write_text("a: [1, 2\n", encoding="utf-8")
    with pytest.raises(CWTrainError, match=r"broken\.yaml is not valid YAML"):
        policy_overlay(ENDPOINT, [broken])


def test_overlay_file_is_private_and_holds_the_key(tmp_path: Path) -> None:
    path = write_policy_overlay(job(tmp_path))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert data["policy_api_key"] == "secret-token"
    assert "secret-token" not in repr(ENDPOINT)


# ----------------------------------------------------------------------- commands


def test_gym_commands(tmp_path: Path) -> None:
    tools = GymTools(gym="/opt/gym/bin/gym")
    assert serve_command(tools, [Path("/a.yaml"), Path("/b.yaml")]) == [
        "/opt/gym/bin/gym", "env", "start", "--config", "/a.yaml", "--config", "/b.yaml",
    ]  # fmt: skip
    j = job(
        tmp_path, agent="math_agent", limit=5, num_repeats=4, concurrency=16, extra_args=("--resume",),
        prompt_config=Path("/gym/benchmarks/prompts/generic/math.yaml"),
    )  # fmt: skip
    command = collect_command(tools, j)
    assert command[:4] == ["/opt/gym/bin/gym", "eval", "run", "--no-serve"]
    pairs = dict(zip(command[4::2], command[5::2]))
    assert pairs["--input"] == str(j.input_path)
    assert pairs["--output"] == str(j.output_path)
    assert pairs["--agent"] == "math_agent"
    assert pairs["--limit"] == "5"
    assert pairs["--num-repeats"] == "4"
    assert pairs["--concurrency"] == "16"
    assert pairs["--prompt-config"] == "/gym/benchmarks/prompts/generic/math.yaml"
    assert command[-1] == "--resume"
    assert "secret-token" not in " ".join(command)


def test_legacy_commands(tmp_path: Path) -> None:
    tools = GymTools(ng_run="/bin/ng_run", ng_collect_rollouts="/bin/ng_collect_rollouts")
    assert tools.legacy
    assert serve_command(tools, [Path("/a.yaml"), Path("/b.yaml")]) == [
        "/bin/ng_run",
        "+config_paths=[/a.yaml,/b.yaml]",
    ]
    j = job(tmp_path, agent="a", limit=2, num_repeats=3, concurrency=8, prompt_config=Path("/p.yaml"))
    command = collect_command(tools, j)
    assert command[0] == "/bin/ng_collect_rollouts"
    assert set(command[1:]) == {
        f"+input_jsonl_fpath={j.input_path}",
        f"+output_jsonl_fpath={j.output_path}",
        "+num_repeats=3",
        "+agent_name=a",
        "+limit=2",
        "+num_samples_in_parallel=8",
        "+prompt_config=/p.yaml",
    }


def test_missing_gym_names_the_install() -> None:
    with pytest.raises(GymNotInstalledError) as info:
        require_gym(which=lambda name: None)
    error = info.value
    assert isinstance(error, ImportError) and isinstance(error, CWTrainError)
    assert 'pip install "nemo-gym' in str(error)
    assert str(pickle.loads(pickle.dumps(error))) == str(error)
    found = {"ng_run": "/x/ng_run", "ng_collect_rollouts": "/x/ng_collect_rollouts"}
    assert require_gym(which=found.get).legacy
    assert require_gym(which={"gym": "/x/gym", **found}.get) == GymTools(gym="/x/gym")


def test_default_collector_without_gym_fails_clearly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(GymNotInstalledError, match="NeMo Gym is not installed"):
        GymCLICollector()(job(tmp_path))


# ------------------------------------------------------------- the default collector


def gym_config(tmp_path: Path) -> Path:
    return yaml_file(tmp_path / "env.yaml", {"math_simple_agent": {"responses_api_agents": {"simple_agent": {}}}})


def stub_job(tmp_path: Path, stub: StubEndpoint, **kw: object) -> CollectionJob:
    endpoint = GymEndpoint(stub.base_url, stub.model, stub.api_key, token_ids=True)
    j = job(tmp_path, endpoint, (gym_config(tmp_path),), **kw)
    j.output_path.parent.mkdir(parents=True, exist_ok=True)
    return j


def assert_servers_stopped(fake_gym: FakeGym) -> None:
    state = fake_gym.state()
    assert state["stopped"] is True
    with pytest.raises(ProcessLookupError):
        os.kill(state["pid"], 0)


def test_collector_runs_gym_against_the_endpoint(tmp_path: Path, fake_gym: FakeGym, openai_stub: StubEndpoint) -> None:
    j = stub_job(tmp_path, openai_stub, agent="math_agent", num_repeats=2, limit=2, concurrency=4)
    write_rows(j.input_path, [1.0, 0.0, 1.0])
    result = GymCLICollector(server_timeout=60)(j)
    assert result.output_path == j.output_path
    assert result.aggregate_metrics_path == j.output_path.with_name("rollouts_aggregate_metrics.json")
    lines = j.output_path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 4  # limit 2 rows x 2 repeats
    # Gym's model server was pointed at the endpoint: every request authorised, right model
    assert len(openai_stub.requests) == 4 and all(r["authorized"] for r in openai_stub.requests)
    state = fake_gym.state()
    assert (state["base_url"], state["model"], state["api_key"]) == (openai_stub.base_url, "stub-model", "stub-key-123")
    assert state["vllm_model"]["return_token_id_information"] is True
    assert state["vllm_model"]["base_url"] == openai_stub.base_url
    assert state["configs"][0] == str(j.config_paths[0])
    # the key travelled in a file, never on a command line
    calls = fake_gym.calls()
    assert [c[:2] for c in calls] == [["env", "start"], ["eval", "run"]]
    assert all(openai_stub.api_key not in " ".join(c) for c in calls)
    assert_servers_stopped(fake_gym)


def test_collector_failure_stops_the_servers(
    tmp_path: Path, fake_gym: FakeGym, openai_stub: StubEndpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    j = stub_job(tmp_path, openai_stub)
    write_rows(j.input_path, [1.0])
    monkeypatch.setenv("FAKE_GYM_EVAL_FAIL", "1")
    with pytest.raises(CWTrainError, match="rollout collection exited with 2") as info:
        GymCLICollector(server_timeout=60)(j)
    message = str(info.value)
    # the scratch directory (and the servers' log in it) is gone once evaluate returns: the
    # message carries the last output itself instead of naming the log
    assert "gym-servers.log" not in message and str(j.workdir) not in message
    assert "rollout collection failed" in message  # Gym's last output
    assert "All 3 / 3 servers ready!" in message  # the servers' last output
    assert not j.output_path.exists()
    assert_servers_stopped(fake_gym)


def test_gyms_output_goes_to_stderr_not_stdout(
    tmp_path: Path, fake_gym: FakeGym, openai_stub: StubEndpoint, capfd: pytest.CaptureFixture[str]
) -> None:
    j = stub_job(tmp_path, openai_stub, agent="math_agent")
    write_rows(j.input_path, [1.0])
    GymCLICollector(server_timeout=60)(j)
    out, err = capfd.readouterr()
    assert out == ""  # a caller's stdout stays its own (cwtrain gym eval prints one JSON document there)
    assert "Querying with 1 concurrent requests" in err and "Finished rollout collection!" in err


def test_prompt_config_builds_the_input_of_field_only_rows(
    tmp_path: Path, fake_gym: FakeGym, openai_stub: StubEndpoint
) -> None:
    prompt = yaml_file(tmp_path / "math.yaml", {"user": "Solve: {question}"})
    j = stub_job(tmp_path, openai_stub, agent="aime_agent", prompt_config=prompt)
    j.input_path.write_text('{"question": "1+1", "expected_answer": "2"}\n', encoding="utf-8")
    GymCLICollector(server_timeout=60)(j)
    assert [r["body"]["prompt"] for r in openai_stub.requests] == ["Solve: 1+1"]
    assert fake_gym.calls()[-1][-2:] == ["--prompt-config", str(prompt)]
    bare = stub_job(tmp_path, openai_stub, agent="aime_agent")
    with pytest.raises(CWTrainError, match="KeyError: 'responses_create_params'"):
        GymCLICollector(server_timeout=60)(bare)  # what Gym 0.6 does without one


def test_servers_that_die_are_reported(tmp_path: Path, fake_gym: FakeGym, monkeypatch: pytest.MonkeyPatch) -> None:
    j = job(tmp_path, configs=(gym_config(tmp_path),))
    monkeypatch.setenv("FAKE_GYM_SERVE_FAIL", "1")
    with pytest.raises(CWTrainError, match="servers exited with 3") as info:
        GymCLICollector(server_timeout=60)(j)
    assert "resources server crashed" in str(info.value)
    assert "gym-servers.log" not in str(info.value)
    assert [c[:2] for c in fake_gym.calls()] == [["env", "start"]]


def test_servers_that_never_get_ready_time_out(
    tmp_path: Path, fake_gym: FakeGym, monkeypatch: pytest.MonkeyPatch
) -> None:
    j = job(tmp_path, configs=(gym_config(tmp_path),))
    monkeypatch.setenv("FAKE_GYM_NEVER_READY", "1")
    with pytest.raises(CWTrainError, match="not ready after 2s"):
        GymCLICollector(server_timeout=2)(j)
    assert_servers_stopped(fake_gym)


def test_overlay_follows_chained_config_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    yaml_file(tmp_path / "models" / "vllm.yaml", {"policy_model": {"responses_api_models": {"vllm_model": {}}}})
    top = yaml_file(tmp_path / "bench.yaml", {"config_paths": ["models/vllm.yaml", "not/here.yaml", "bench.yaml"]})
    overlay = policy_overlay(ENDPOINT, [top])
    assert overlay["policy_model"] == {"responses_api_models": {"vllm_model": {"return_token_id_information": True}}}


def test_relative_paths_resolve_as_gym_resolves_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    extra, cwd, install = tmp_path / "extra", tmp_path / "cwd", tmp_path / "site-packages"
    for root in (extra, cwd, install):
        (root / "benchmarks" / "aime24").mkdir(parents=True)
    (install / "benchmarks" / "aime24" / "config.yaml").write_text("a: 1\n", encoding="utf-8")
    env = {"NEMO_GYM_EXTRA_ROOTS": os.pathsep.join([str(extra), str(tmp_path / "missing")])}
    assert gym_search_roots(install, env, cwd) == [extra, tmp_path / "missing", cwd, install]
    rel = "benchmarks/aime24/config.yaml"
    assert resolve_gym_path(rel, install_root=install, environ=env, cwd=cwd) == install / rel  # the install root
    (cwd / rel).write_text("a: 2\n", encoding="utf-8")
    assert resolve_gym_path(rel, install_root=install, environ=env, cwd=cwd) == cwd / rel  # cwd beats it
    (extra / rel).write_text("a: 3\n", encoding="utf-8")
    assert resolve_gym_path(rel, install_root=install, environ=env, cwd=cwd) == extra / rel  # extra roots first
    assert resolve_gym_path("nowhere.yaml", install_root=install, environ=env, cwd=cwd) == cwd / "nowhere.yaml"
    assert resolve_gym_path(install / rel, install_root=None, environ={}, cwd=cwd) == install / rel


def test_chained_config_paths_resolve_against_gyms_install_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install = tmp_path / "site-packages"
    model = install / "responses_api_models" / "vllm_model" / "configs" / "vllm_model.yaml"
    model.parent.mkdir(parents=True)
    yaml_file(model, {"policy_model": {"responses_api_models": {"vllm_model": {"entrypoint": "app.py"}}}})
    bench = install / "benchmarks" / "aime24" / "config.yaml"
    bench.parent.mkdir(parents=True)
    # chained paths are relative to Gym's roots, not to the including file
    yaml_file(bench, {"config_paths": ["responses_api_models/vllm_model/configs/vllm_model.yaml"]})
    monkeypatch.chdir(tmp_path)  # a wheel install: the working directory is elsewhere
    monkeypatch.delenv("NEMO_GYM_EXTRA_ROOTS", raising=False)
    overlay = policy_overlay(ENDPOINT, [Path("benchmarks/aime24/config.yaml")], install_root=install)
    assert overlay["policy_model"] == {"responses_api_models": {"vllm_model": {"return_token_id_information": True}}}
    with pytest.raises(CWTrainError, match="does not exist"):
        policy_overlay(ENDPOINT, [Path("benchmarks/aime24/config.yaml")])  # without the install root
