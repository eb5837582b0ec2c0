"""The example deployment requests: they parse, keep their placeholders (so creating
one unfilled is refused), and become valid once filled: a test fills them and creates
each on ``cwtrain-local``, waits for READY, checks the hot-load section and endpoint, and
deletes it again.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from contextlib import redirect_stderr
from pathlib import Path
from typing import Any

import pytest
from recipe_files import RECIPES, RECIPES_DIR, TRAINING_RECIPES, fill, load_json, placeholders_in

from cwtrain.cli import main as cwtrain_main
from cwtrain.errors import NotFoundError, UsageError
from cwtrain.infra import InferenceClient, lifecycle

EXPECTED_PLACEHOLDERS = {"gateway-id", "dynamo-vllm-version", "bucket", "base-model-path"}


def example(recipe: str) -> dict[str, Any]:
    body = load_json(RECIPES_DIR / recipe / "deployment.example.json")
    assert isinstance(body, dict)
    return body


def test_example_parses_and_is_a_hot_load_request(recipe: str) -> None:
    body = example(recipe)
    for key in ("name", "gatewayIds", "runtime", "resources", "model", "autoscaling", "traffic"):
        assert key in body, key
    assert "id" not in body, "the CLI chooses the id; a fixed one would collide across users"
    assert body["runtime"]["engine"] == "dynamo-vllm"
    assert len(body["gatewayIds"]) == 1, "hot-load needs every gateway in one zone: the example uses one"
    assert body["hotLoad"] == {
        "bucket": "<bucket>",
        "pathPrefix": "hotload",
        "transitionMode": "TRANSITION_MODE_ASYNC",
    }
    assert body["resources"]["gpuCount"] in (1, 2, 4, 8, 16)
    assert 4 <= len(body["model"]["name"]) <= 63
    assert body["model"]["bucket"] == body["hotLoad"]["bucket"]


def test_example_still_has_placeholders(recipe: str) -> None:
    body = example(recipe)
    assert placeholders_in(body) == EXPECTED_PLACEHOLDERS
    found = {value for _, value in lifecycle.find_placeholders(body)}
    assert {f"<{name}>" for name in EXPECTED_PLACEHOLDERS} <= found
    with pytest.raises(UsageError, match="still has placeholders"):
        lifecycle.refuse_placeholders(body, "deployment.example.json")


def test_cli_refuses_the_unfilled_example(recipe: str) -> None:
    path = RECIPES_DIR / recipe / "deployment.example.json"
    stderr = io.StringIO()
    with redirect_stderr(stderr):
        # nothing listens on port 9: a request that got past the check would fail differently
        code = cwtrain_main(
            ["--token", "t", "--base-url", "http://127.0.0.1:9", "deployment", "create", "-f", str(path)]
        )
    assert code == 1
    assert "still has placeholders" in stderr.getvalue()
    assert "gatewayIds[0] = '<gateway-id>'" in stderr.getvalue()


@pytest.mark.parametrize("recipe", TRAINING_RECIPES)
def test_training_recipes_all_write_under_hotload(recipe: str) -> None:
    body = example(recipe)
    assert body["hotLoad"]["pathPrefix"] == "hotload"
    org = load_json(RECIPES_DIR / recipe / "org-access-policy.example.json")
    assert "<bucket>/hotload/*" in org["statements"][0]["resources"]


# ---------------------------------------------------------------- against cwtrain-local


@pytest.fixture(scope="module")
def stack(shared_stack: Any) -> Iterator[Any]:
    with shared_stack.view("recipes", replicas=1) as local:
        local.seed_base_model("base/tiny")
        yield local


@pytest.fixture(scope="module")
def gateway_id(stack: Any) -> str:
    body = {
        "name": "recipes-gateway",
        "zones": [stack.region],
        "coreWeaveAuth": {},
        "bodyBasedRouting": {"apiType": "API_TYPE_OPENAI"},
    }
    with InferenceClient(stack.token, base_url=stack.api_url) as api:
        gateway = lifecycle.create_gateway(api, body)
        lifecycle.wait_for_gateway(api, gateway.id, timeout=60, poll_interval=0.1)
    return gateway.id


@pytest.mark.e2e
@pytest.mark.slow
def test_filled_examples_deploy_on_cwtrain_local(stack: Any, gateway_id: str, tmp_path: Path) -> None:
    with InferenceClient(stack.token, base_url=stack.api_url) as api:
        parameters = api.get_deployment_parameters([gateway_id])
        versions = parameters["runtimeParameters"]["runtimeVersions"]["dynamo-vllm"]["versions"]
        values = {
            "gateway-id": gateway_id,
            "dynamo-vllm-version": versions[0],
            "bucket": stack.bucket,
            "base-model-path": "base/tiny",
        }
        created = []
        try:
            for recipe in RECIPES:
                body = fill(example(recipe), values)
                body["autoscaling"] = {**body["autoscaling"], "min": 1, "max": 1}  # one local replica each
                file = tmp_path / f"{recipe}.json"
                file.write_text(json.dumps(body), encoding="utf-8")
                request = lifecycle.load_request(file)  # no placeholder left
                deployment = lifecycle.create_deployment(api, request, source=str(file))
                created.append(deployment.id)
            for deployment_id in created:
                ready = lifecycle.wait_for_deployment(api, deployment_id, timeout=120, poll_interval=0.1)
                assert ready.hot_load is not None
                assert (ready.hot_load.bucket, ready.hot_load.path_prefix) == (stack.bucket, "hotload")
                assert ready.engine == "dynamo-vllm"
                url = lifecycle.deployment_base_url(api, ready)
                assert url is not None and url.endswith("/v1")
        finally:
            for deployment_id in created:
                lifecycle.delete_deployment(api, deployment_id, timeout=60, poll_interval=0.1)
        for deployment_id in created:
            with pytest.raises(NotFoundError):
                api.get_deployment(deployment_id)
        assert len(created) == len(RECIPES)
