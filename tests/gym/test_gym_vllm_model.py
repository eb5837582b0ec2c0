"""NeMo Gym's stock ``vllm_model`` server, its configs unchanged, against the local stack's gateway.

Runs only where a NeMo Gym install is at hand (it needs Python >= 3.13.14, or 3.13.0 with
``pip install --ignore-requires-python``); the one command::

    CWTRAIN_TEST_GYM_VENV=/path/to/venv-with-nemo-gym .venv-3.12/bin/python -m pytest tests/gym/test_gym_vllm_model.py

For each stock config (``vllm_model_for_training``: chat with token ids from the log-probs and
``/tokenize``; ``vllm_model``: plain chat; ``vllm_model_completions``: ``/v1/completions``) it
runs ``gym env start --model-type vllm_model/<config> --model-url <gateway>/v1 …`` offline
(``uv_venv_dir`` points at the given venv, ``skip_venv_if_present``), sends Responses API
requests to the Gym model server, and checks what comes back: the prompt's token ids equal
the tiny model's chat template rendering, the generated ids' log-probs equal the model's own,
and a prompt that overflows the context comes back as Gym's empty ``max_output_tokens``
answer (Gym recognises vLLM's overflow wording). Passed with nemo-gym 0.6.0 and 0.7.0.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cwtrain.local import LocalStack
from cwtrain.local.engine.model import Tokenizer, init_weights, token_logprobs
from cwtrain.local.harness.objectstore import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
GYM_VENV = os.environ.get("CWTRAIN_TEST_GYM_VENV", "")
if not GYM_VENV or not (Path(GYM_VENV) / "bin" / "gym").exists():
    pytest.skip(
        "set CWTRAIN_TEST_GYM_VENV to a virtualenv with nemo-gym installed (its bin/gym) to run NeMo Gym's "
        "stock vllm_model server against the local stack",
        allow_module_level=True,
    )

TOK = Tokenizer()
WEIGHTS = init_weights(seed=0)  # LocalStack.deploy's base checkpoint
QUESTION = "what is one plus one?"


@pytest.fixture(scope="module")
def local() -> Iterator[tuple[LocalStack, Any]]:
    with LocalStack(replicas=1) as stack:
        yield stack, stack.deploy(name="gym", timeout=180)


class GymServers:
    """``gym env start`` for one stock model config, in its own process group."""

    def __init__(self, workdir: Path, config: str, base_url: str, model: str, api_key: str) -> None:
        venvs = workdir / "venvs" / "responses_api_models" / "vllm_model"
        venvs.mkdir(parents=True)
        (venvs / ".venv").symlink_to(GYM_VENV)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["PATH"] = f"{GYM_VENV}/bin:{env.get('PATH', '')}"
        self.out = workdir / "gym.out"
        self.err = workdir / "gym.err"
        argv = [
            f"{GYM_VENV}/bin/gym", "env", "start", "--model-type", f"vllm_model/{config}",
            "--model", model, "--model-url", base_url, "--model-api-key", api_key,
            f"+uv_venv_dir={workdir / 'venvs'}", "+skip_venv_if_present=true",
            "++head_server.host=127.0.0.1", f"++head_server.port={free_port()}",
        ]  # fmt: skip
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.proc = subprocess.Popen(argv, cwd=workdir, env=env, stdout=out, stderr=err, start_new_session=True)

    def logs(self) -> str:
        return f"stdout:\n{self.out.read_text()[-3000:]}\nstderr:\n{self.err.read_text()[-3000:]}"

    def wait_url(self, timeout: float = 300.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.out.read_text()
            if "All 1 / 1 servers ready" in text:
                found = re.search(r"'url': '(http://[^']+)'", text[text.index("All 1 / 1 servers ready") :])
                if found:
                    return found.group(1)
            if self.proc.poll() is not None:
                raise AssertionError(f"gym env start exited with {self.proc.returncode}\n{self.logs()}")
            time.sleep(1)
        raise AssertionError(f"gym env start was not ready after {timeout}s\n{self.logs()}")

    def stop(self) -> None:
        for sig, grace in ((signal.SIGINT, 60), (signal.SIGTERM, 30)):  # Gym stops its servers and Ray cluster
            if self.proc.poll() is not None:
                break
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # whatever of the group is left
        except ProcessLookupError:
            pass
        self.proc.wait()


@pytest.fixture
def gym(local: tuple[LocalStack, Any], tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    stack, target = local
    servers = GymServers(tmp_path, request.param, target.base_url, target.model, stack.token)
    try:
        yield servers.wait_url()
    finally:
        servers.stop()


def _respond(url: str, text: str, max_output_tokens: int = 12) -> dict[str, Any]:
    body = {"input": [{"role": "user", "content": text}], "max_output_tokens": max_output_tokens}
    response = httpx.post(url + "/v1/responses", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return dict(response.json())


def _overflow_is_an_empty_answer(url: str) -> None:
    out = _respond(url, "x" * 300)
    assert out["incomplete_details"] == {"reason": "max_output_tokens"}
    assert "".join(c.get("text", "") for item in out["output"] for c in item.get("content") or []) == ""


@pytest.mark.parametrize("gym", ["vllm_model_for_training"], indirect=True)
def test_training_config_gets_token_ids_and_the_models_logprobs(gym: str) -> None:
    out = _respond(gym, QUESTION)
    item = out["output"][0]
    prompt = TOK.encode(TOK.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True))
    assert item["prompt_token_ids"] == prompt  # from the gateway's /tokenize
    ids = item["generation_token_ids"]  # from the token_id:<N> log-prob entries
    assert 1 <= len(ids) <= 12
    assert item["generation_log_probs"] == pytest.approx(token_logprobs(WEIGHTS, prompt, ids), abs=2e-4)
    _overflow_is_an_empty_answer(gym)


@pytest.mark.parametrize("gym", ["vllm_model", "vllm_model_completions"], indirect=True)
def test_eval_and_completions_configs_answer(gym: str) -> None:
    out = _respond(gym, QUESTION)
    message = next(item for item in out["output"] if item.get("type") == "message")
    text = "".join(c["text"] for c in message["content"])
    assert TOK.decode(TOK.encode(text)) == text  # the tiny model's alphabet
    assert out["usage"]["output_tokens"] >= 1
    _overflow_is_an_empty_answer(gym)
