"""Each recipe's bucket and organisation policies, filled in and evaluated statement by statement.

Proves, for every training recipe, that the trainer's identity may put objects and abort
multipart uploads under ``<bucket>/hotload/`` only, may list and read what it needs, and
may neither delete objects nor change the bucket policy; that the Dedicated Inference
service and the organisation may read; and that outsiders may do nothing.
"""

from __future__ import annotations

import json

import pytest
from policy_eval import Policies, Principal, bucket_decision, org_decision
from recipe_files import (
    RECIPES,
    RECIPES_DIR,
    SERVICE_ACCOUNTS,
    TRAINING_RECIPES,
    fill,
    load_json,
    placeholders_in,
)

ORG = "ab12cd"
BUCKET = "rl-weights"
CLUSTER = "3f0c9a52-8d1e-4c27-9b3a-1f2e3d4c5b6a"
NAMESPACE = "rl"
ISSUER = f"https://oidc.cks.coreweave.com/id/{CLUSTER}"
INFERENCE = Principal(
    name="coreweave/uvAGGQSxxXeeQBJzcGsD9", org_id="cw4637", arn="arn:aws:iam::cw4637:coreweave/uvAGGQSxxXeeQBJzcGsD9"
)
COLLEAGUE = Principal(name="coreweave/colleague", org_id=ORG, arn=f"arn:aws:iam::{ORG}:coreweave/colleague")
STRANGER = Principal(name="coreweave/stranger", org_id="ff0000", arn="arn:aws:iam::ff0000:coreweave/stranger")

VALUES = {"bucket": BUCKET, "org-id": ORG, "cluster-uuid": CLUSTER, "namespace": NAMESPACE}

WRITE_ACTIONS = ("s3:PutObject", "s3:AbortMultipartUpload")
FORBIDDEN_ACTIONS = (
    "s3:DeleteObject",
    "s3:DeleteObjectVersion",
    "s3:PutBucketPolicy",
    "s3:DeleteBucketPolicy",
    "s3:PutLifecycleConfiguration",
)


def trainer(recipe: str) -> Principal:
    name = f"role/{ISSUER}:system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNTS[recipe]}"
    return Principal(name=name, org_id=ORG, arn=name)


#: The organisation's own policy for its people (not the recipe's): everything for users,
#: nothing for workload roles. The recipe's bucket policy then limits them to reading.
ORG_BASELINE = {
    "name": "people",
    "version": "v1alpha1",
    "statements": [
        {"name": "users", "effect": "Allow", "actions": ["s3:*"], "resources": ["*"], "principals": ["coreweave/*"]}
    ],
}


def policies(recipe: str) -> Policies:
    folder = RECIPES_DIR / recipe
    org = load_json(folder / "org-access-policy.example.json")
    bucket = load_json(folder / "bucket-policy.example.json")
    assert placeholders_in(org) | placeholders_in(bucket) <= set(VALUES), "unexpected placeholders"
    return Policies(org_id=ORG, organisation=(ORG_BASELINE, fill(org, VALUES)), bucket=fill(bucket, VALUES))


def test_policy_files_parse_and_keep_placeholders(recipe: str) -> None:
    folder = RECIPES_DIR / recipe
    for name in ("bucket-policy.example.json", "org-access-policy.example.json"):
        body = load_json(folder / name)
        assert {"bucket", "namespace", "cluster-uuid"} <= placeholders_in(body) | {"namespace", "cluster-uuid"}
        assert "bucket" in placeholders_in(body), f"{recipe}/{name} must leave the bucket to fill in"
    bucket = load_json(folder / "bucket-policy.example.json")
    assert bucket["Version"] == "2012-10-17"
    org = load_json(folder / "org-access-policy.example.json")
    assert org["version"] == "v1alpha1"
    # short-form WIF principals only: a full ARN fails in organisation policies
    for statement in org["statements"]:
        for principal in statement["principals"]:
            assert principal.startswith("role/https://oidc.cks.coreweave.com/id/"), principal
            assert not principal.startswith("arn:")
            assert principal.endswith(f":system:serviceaccount:<namespace>:{SERVICE_ACCOUNTS[recipe]}")


@pytest.mark.parametrize("recipe", TRAINING_RECIPES)
def test_trainer_writes_only_under_the_hotload_prefix(recipe: str) -> None:
    p, who = policies(recipe), trainer(recipe)
    for action in WRITE_ACTIONS:
        assert p.allowed(who, action, BUCKET, "hotload/run1-v000001/model-00001.safetensors"), action
        assert p.allowed(who, action, BUCKET, "hotload/run1-v000001/model.safetensors.index.json"), action
        # not outside the prefix, not in a look-alike prefix, not in another bucket
        for key in ("base/tiny/model.safetensors", "hotload-other/x", "hotloadx/y", "x/hotload/y", "model.bin"):
            assert not p.allowed(who, action, BUCKET, key), (action, key)
        assert not p.allowed(who, action, "another-bucket", "hotload/run1-v000001/x"), action


@pytest.mark.parametrize("recipe", TRAINING_RECIPES)
def test_trainer_lists_and_reads_what_it_needs(recipe: str) -> None:
    p, who = policies(recipe), trainer(recipe)
    assert p.allowed(who, "s3:ListBucket", BUCKET)
    assert p.allowed(who, "s3:GetObject", BUCKET, "hotload/run1-v000000/manifest.json")
    # resuming an interrupted upload: list the open uploads and their parts
    assert p.allowed(who, "s3:ListBucketMultipartUploads", BUCKET)
    assert p.allowed(who, "s3:ListMultipartUploadParts", BUCKET, "hotload/run1-v000001/model-00001.safetensors")
    assert not p.allowed(who, "s3:ListMultipartUploadParts", BUCKET, "base/tiny/model.safetensors")
    assert not p.allowed(who, "s3:GetObject", BUCKET, "secrets/other-team.bin")


@pytest.mark.parametrize("recipe", RECIPES)
def test_no_identity_of_a_recipe_may_delete_or_change_the_policy(recipe: str) -> None:
    p, who = policies(recipe), trainer(recipe)
    for action in FORBIDDEN_ACTIONS:
        for key in ("hotload/run1-v000001/model-00001.safetensors", "base/tiny/config.json", None):
            assert not p.allowed(who, action, BUCKET, key), (action, key)
    # the explicit Deny statements hold even if another organisation policy allowed everything
    everything = {
        "name": "admin-mistake",
        "version": "v1alpha1",
        "statements": [
            {"name": "all", "effect": "Allow", "actions": ["s3:*"], "resources": ["*"], "principals": ["*"]}
        ],
    }
    widened = Policies(org_id=ORG, organisation=(*p.organisation, everything), bucket=p.bucket)
    for action in FORBIDDEN_ACTIONS:
        assert not widened.allowed(who, action, BUCKET, "hotload/run1-v000001/x"), action
    assert org_decision(widened.organisation, who, "s3:PutBucketPolicy", BUCKET) == "deny"


@pytest.mark.parametrize("recipe", RECIPES)
def test_inference_service_and_organisation_read_but_do_not_write(recipe: str) -> None:
    p = policies(recipe)
    for reader in (INFERENCE, COLLEAGUE):
        assert p.allowed(reader, "s3:ListBucket", BUCKET), reader
        assert p.allowed(reader, "s3:GetObject", BUCKET, "hotload/run1-v000003/model.safetensors"), reader
        assert p.allowed(reader, "s3:GetObject", BUCKET, "base/qwen3-4b/config.json"), reader
    for action in (*WRITE_ACTIONS, *FORBIDDEN_ACTIONS):
        assert not p.allowed(INFERENCE, action, BUCKET, "hotload/run1-v000003/x"), action
    # people of the organisation read through the bucket policy but write nothing into it
    for action in (*WRITE_ACTIONS, "s3:DeleteObject"):
        assert not p.allowed(COLLEAGUE, action, BUCKET, "hotload/run1-v000003/x"), action
    assert bucket_decision(p.bucket, STRANGER, "s3:GetObject", f"{BUCKET}/hotload/x") == "none"
    assert not p.allowed(STRANGER, "s3:GetObject", BUCKET, "hotload/x")


def test_gym_evaluator_only_reads() -> None:
    p, who = policies("nemo-gym"), trainer("nemo-gym")
    assert p.allowed(who, "s3:GetObject", BUCKET, "hotload/run1-v000020/config.json")
    for action in (*WRITE_ACTIONS, *FORBIDDEN_ACTIONS):
        assert not p.allowed(who, action, BUCKET, "hotload/run1-v000020/x"), action


def test_evaluator_is_not_vacuous() -> None:
    """A policy granting delete is caught by the same checks (the evaluator can say yes)."""
    p, who = policies("miles"), trainer("miles")
    loose = json.loads(json.dumps(p.bucket))
    loose["Statement"] = [s for s in loose["Statement"] if s["Effect"] != "Deny"]
    org = json.loads(json.dumps(p.organisation[-1]))
    org["statements"] = [s for s in org["statements"] if s["effect"] != "Deny"]
    org["statements"][0]["actions"].append("s3:DeleteObject")
    loose["Statement"][-1]["Action"].append("s3:DeleteObject")
    leaky = Policies(org_id=ORG, organisation=(ORG_BASELINE, org), bucket=loose)
    assert leaky.allowed(who, "s3:DeleteObject", BUCKET, "hotload/run1-v000001/x")
    assert not p.allowed(who, "s3:DeleteObject", BUCKET, "hotload/run1-v000001/x")
