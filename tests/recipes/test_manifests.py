"""Every Kubernetes manifest of the recipes, validated offline.

Core kinds (ServiceAccount, ConfigMap, Job, PersistentVolumeClaim) are validated strictly
(unknown fields refused) against the bundled OpenAPI schema of the newest Kubernetes
version ``kubernetes-validate`` ships, with the network switched off. Custom resources have
no schema there: the KubeRay ``RayJob`` is checked structurally, and each of its pod
templates is validated strictly as a core ``PodTemplateSpec`` (wrapped in a Job). The
``Kustomization`` files are checked structurally too (resources and generated files exist).
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from packaging.version import Version
from recipe_files import RECIPES, RECIPES_DIR, SERVICE_ACCOUNTS

CORE_KINDS = {"ServiceAccount", "ConfigMap", "Job", "PersistentVolumeClaim"}
#: Files a user creates before `kubectl apply -k` (from an example in the same folder).
USER_FILES = {"deployment.json": "deployment.example.json"}
#: The ConfigMap values a user must fill in before a training job starts.
FILL_IN = ("CWTRAIN_HOTLOAD_DEPLOYMENT_ID", "CWTRAIN_ROLLOUT_BASE_URL", "CWTRAIN_ROLLOUT_MODEL", "AWS_REGION")


def k8s_version() -> str:
    return kubernetes_validate.latest_version()


def documents(recipe: str) -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in sorted((RECIPES_DIR / recipe).rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if isinstance(doc, dict) and "kind" in doc and "apiVersion" in doc:
                yield path, doc


def manifests(recipe: str) -> list[tuple[Path, dict[str, Any]]]:
    return [(p, d) for p, d in documents(recipe) if d["kind"] != "Kustomization"]


def kustomization(recipe: str) -> dict[str, Any]:
    return yaml.safe_load((RECIPES_DIR / recipe / "kustomization.yaml").read_text(encoding="utf-8"))


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No network: any socket connection fails the test."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("kubernetes-validate tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def validate_strict(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, k8s_version(), strict=True)


def pod_templates(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if doc["kind"] == "Job":
        yield doc["spec"]["template"]
    elif doc["kind"] == "RayJob":
        cluster = doc["spec"]["rayClusterSpec"]
        yield cluster["headGroupSpec"]["template"]
        for group in cluster["workerGroupSpecs"]:
            yield group["template"]


def test_validator_is_current_and_offline(offline: None) -> None:
    assert Version(k8s_version()) >= Version("1.33"), "kubernetes-validate ships an old schema"
    # the validator refuses what it should (so passing below means something)
    bad = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "x"}, "automountToken": False}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_strict(bad)
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x"}, "spec": {"template": {"spec": {}}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_strict(job)  # containers are required


def test_core_manifests_validate_strictly(recipe: str, offline: None) -> None:
    found = manifests(recipe)
    kinds = {d["kind"] for _, d in found}
    assert {"ServiceAccount", "ConfigMap"} <= kinds, f"{recipe} lacks its service account or config map"
    assert kinds & {"Job", "RayJob"}, f"{recipe} has no training or evaluation job"
    for path, doc in found:
        if doc["kind"] in CORE_KINDS:
            validate_strict(doc)
        else:
            assert doc["kind"] == "RayJob", f"{path}: unexpected kind {doc['kind']}"


def test_rayjob_is_well_formed(offline: None) -> None:
    docs = [d for _, d in manifests("nemo-rl") if d["kind"] == "RayJob"]
    assert len(docs) == 1
    job = docs[0]
    assert job["apiVersion"] == "ray.io/v1"
    spec = job["spec"]
    assert spec["entrypoint"].split()[:2] == ["bash", "/opt/cwtrain/launch.sh"]
    assert spec["shutdownAfterJobFinishes"] is True
    cluster = spec["rayClusterSpec"]
    assert isinstance(cluster["rayVersion"], str) and Version(cluster["rayVersion"]) >= Version("2.55.1")
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for group in groups:
        assert all(isinstance(v, str) for v in group["rayStartParams"].values()), "rayStartParams must be strings"
    for group in cluster["workerGroupSpecs"]:
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
        assert group["groupName"]
    # each pod template is a valid core PodTemplateSpec
    for template in pod_templates(job):
        wrapper = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "t"}, "spec": {"template": template}}
        validate_strict(wrapper)


def test_jobs_run_as_the_recipe_service_account_with_wif(recipe: str) -> None:
    found = manifests(recipe)
    accounts = {d["metadata"]["name"]: d for _, d in found if d["kind"] == "ServiceAccount"}
    name = SERVICE_ACCOUNTS[recipe]
    assert set(accounts) == {name}, f"{recipe} must have exactly its own service account"
    annotations = accounts[name]["metadata"]["annotations"]
    assert annotations["eks.amazonaws.com/audience"] == "https://coreweave.com/iam"
    principal = annotations["eks.amazonaws.com/role-arn"]
    assert (
        principal == f"role/https://oidc.cks.coreweave.com/id/<cluster-uuid>:system:serviceaccount:<namespace>:{name}"
    )
    templates = [t for _, d in found for t in pod_templates(d)]
    assert templates
    for template in templates:
        assert template["spec"]["serviceAccountName"] == name


def test_pods_reference_only_what_the_recipe_creates(recipe: str) -> None:
    found = manifests(recipe)
    maps = {d["metadata"]["name"] for _, d in found if d["kind"] == "ConfigMap"}
    maps |= {g["name"] for g in kustomization(recipe).get("configMapGenerator", [])}
    claims = {d["metadata"]["name"] for _, d in found if d["kind"] == "PersistentVolumeClaim"}
    for template in (t for _, d in found for t in pod_templates(d)):
        spec = template["spec"]
        for volume in spec.get("volumes", []):
            if "configMap" in volume:
                assert volume["configMap"]["name"] in maps, volume
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims, volume
        for container in spec.get("containers", []) + spec.get("initContainers", []):
            for source in container.get("envFrom", []):
                assert source["configMapRef"]["name"] in maps, source
            for var in container.get("env", []):
                secret = var.get("valueFrom", {}).get("secretKeyRef")
                if secret:  # the one secret the README tells the user to create
                    assert (secret["name"], secret["key"]) == ("cwtrain-api-token", "token")
                assert "value" not in var or "<" not in var["value"], var


def test_kustomization_lists_existing_files(recipe: str) -> None:
    folder = RECIPES_DIR / recipe
    kust = kustomization(recipe)
    assert kust["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert kust["kind"] == "Kustomization"
    listed = set(kust["resources"])
    on_disk = {p.name for p, d in documents(recipe) if d["kind"] != "Kustomization"}
    assert listed == on_disk, "every manifest is applied by `kubectl apply -k`, and only those"
    assert kust["generatorOptions"]["disableNameSuffixHash"] is True  # names referenced by the pods
    for generator in kust["configMapGenerator"]:
        for name in generator["files"]:
            if name in USER_FILES:
                assert (folder / USER_FILES[name]).is_file()
            else:
                assert (folder / name).is_file(), f"{recipe}: {name} is missing"


def test_training_config_maps_leave_the_deployment_to_fill_in(recipe: str) -> None:
    maps = [d for _, d in manifests(recipe) if d["kind"] == "ConfigMap"]
    assert len(maps) == 1
    data = maps[0]["data"]
    assert all(isinstance(v, str) for v in data.values()), "ConfigMap values must be strings"
    # cwtrain is installed from its own repository (a placeholder until filled in), never
    # by name from an index, where another project publishes a package called cwtrain.
    assert data["CWTRAIN_GIT"].startswith("git+<") and "CWTRAIN_INSTALL" not in data
    assert set(data["CWTRAIN_PACKAGES"].split()) >= {"cwtrain-core"}
    assert all(name.startswith("cwtrain-") for name in data["CWTRAIN_PACKAGES"].split())
    if recipe == "nemo-gym":  # the request file carries everything else it needs
        assert [k for k, v in data.items() if "<" in v] == ["CWTRAIN_GIT"]
        return
    for key in FILL_IN:
        assert data[key].startswith("<") and data[key].endswith(">"), key
    assert data["CWTRAIN_HOTLOAD_PROMPT_CACHE_POLICY"] == "reset_all"
    assert data["CW_S3_ENDPOINT"] == "http://cwlota.com"
    assert "/" not in data["CWTRAIN_HOTLOAD_RUN_ID"] and len(data["CWTRAIN_HOTLOAD_RUN_ID"]) <= 120
    assert data["CWTRAIN_HOTLOAD_FULL_EVERY"] == "auto"  # the integrations' default (issue 25)


@pytest.mark.parametrize("recipe", RECIPES)
def test_launchers_are_valid_bash_that_refuse_placeholders(recipe: str, tmp_path: Path) -> None:
    launcher = RECIPES_DIR / recipe / "launch.sh"
    subprocess.run(["bash", "-n", str(launcher)], check=True)
    if recipe == "nemo-gym":
        return
    # run only the settings check: it must stop at the first unfilled value, before installing anything
    env = {"PATH": "/usr/bin:/bin", "COREWEAVE_API_TOKEN": "t", "WORK_DIR": str(tmp_path)}
    env.update({k: "x" for k in FILL_IN})
    env["CWTRAIN_ROLLOUT_MODEL"] = "<model-name>"
    done = subprocess.run(["bash", str(launcher)], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    assert "CWTRAIN_ROLLOUT_MODEL is still '<model-name>'" in done.stderr
    assert not list(tmp_path.iterdir()), "the launcher did work before refusing"


@pytest.mark.parametrize("recipe", ["miles", "slime"])
def test_slime_style_launchers_publish_with_the_hook(recipe: str) -> None:
    text = (RECIPES_DIR / recipe / "launch.sh").read_text(encoding="utf-8")
    for flag in (
        "--custom-update-weight-post-write-path cwtrain.integrations.slime.hook",
        "--update-weight-delta-encoding xor --update-weight-delta-checksum adler32",
        "--update-weight-local-checkpoint-dir",
        "--rollout-num-gpus 0",
        "--rollout-top-p 1.0",
        "--distributed-timeout-minutes",
        "--prompt-data",
    ):
        assert flag in text, flag
    if recipe == "slime":
        assert "--update-weight-standalone-publish" in text
        assert "--update-weight-mode delta --update-weight-transport disk" in text
        assert "--rollout-function-path cwtrain.integrations.slime.rollout.generate_rollout" in text
    else:
        assert "--update-weight-transfer-mode disk-delta" in text
        assert "--rollout-function-path cwtrain.integrations.miles.CoreWeaveRolloutFn" in text
        assert "train_async.py" in text and "CWTRAIN_HOTLOAD_WAIT=0" in text
