"""Two Ray workers each hold half of the tiny model; refits publish from both, hot-load locally.

Three GRPO-style refits (FULL, delta, delta): each encodes on both workers, commits one
index, and ends with every replica of a 2-replica local deployment on the new identity;
``generate`` reports it, the replicas' log-probs equal the trainer's weights' own, and the
manifest's checksums are the Adler-32 of the trainer's bytes.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch
from _reference_snapshot import check_served

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


class PolicyStub:
    """NeMo-RL's Policy as the synchronizer sees it: run a method on every worker."""

    def __init__(self, actors: list[Any]) -> None:
        self.actors = actors

    def run_all_workers_single_data(self, method_name: str, /, **kwargs: Any) -> list[Any]:
        return [getattr(actor, method_name).remote(**kwargs) for actor in self.actors]


def test_three_refits_from_two_ray_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared_stack: Any, ray_session: Any
) -> None:
    # The session's Ray (tests/conftest.py) gives its workers the stand-ins of ./standin on
    # PYTHONPATH and the shared stack's variables.
    ray = ray_session
    from cwtrain.hotload.loader import HotLoader
    from cwtrain.infra import InferenceClient
    from cwtrain.integrations.nemo_rl.generation import CoreWeaveGeneration
    from cwtrain.integrations.nemo_rl.synchronizer import HotLoadWeightSynchronizer
    from cwtrain.local.engine.model import Tokenizer, init_weights, token_logprobs, write_base_checkpoint

    with shared_stack.view("nemo-rl", replicas=2) as stack:
        for key, value in stack.env().items():
            monkeypatch.setenv(key, value)
        target = stack.deploy(seed=0)
        write_base_checkpoint(tmp_path / "hf", seed=0)
        actors: list[Any] = []
        try:
            from cwtrain_test_workers import HalfWorker  # type: ignore[import-not-found]

            weights = init_weights(seed=0)
            actors = [ray.remote(HalfWorker).options(num_cpus=0).remote(r, 2, weights) for r in range(2)]
            config = {
                "max_new_tokens": 6,
                "temperature": 1.0,
                "coreweave_cfg": {
                    "base_url": target.base_url, "model": target.model, "api_key": stack.token,
                    "deployment_id": target.deployment_id, "run_id": "nemo-test", "full_every": 3,
                    "state_dir": str(tmp_path / "state"), "timeout": 120,
                },
            }  # fmt: skip
            tokenizer = Tokenizer()
            generation = CoreWeaveGeneration(config, tokenizer)
            loader = HotLoader(InferenceClient(), deployment_id=target.deployment_id, poll_interval=0.2)
            sync = HotLoadWeightSynchronizer(
                PolicyStub(actors), generation, config, hf_checkpoint=tmp_path / "hf", loader=loader
            )
            assert generation.weight_synchronizer is sync
            prompt = torch.tensor([tokenizer.encode("abc")])
            for step in range(3):
                if step:
                    assert sum(ray.get([a.train_step.remote(step) for a in actors])) > 0
                assert sync.sync_weights() is None  # as NeMo-RL's WeightSynchronizer.sync_weights
                metrics = sync.last_metrics
                identity = f"nemo-test-v{step:06d}"
                assert sync.served_identity == identity
                assert metrics["hotload/incremental"] == (0.0 if step == 0 else 1.0)
                assert metrics["hotload/completed"] == 1.0
                assert (tmp_path / "state" / "served_identity").read_text() == identity + "\n"
                replicas = loader.status(loader.list(limit=1)[0].id).replicas
                assert len(replicas) == 2
                assert {(r.state.name, r.current_snapshot_identity) for r in replicas} == {("READY", identity)}

                trainer: dict[str, torch.Tensor] = {}
                for half in ray.get([a.weights.remote() for a in actors]):
                    trainer.update(half)
                manifest = loader.read_manifest(identity)
                assert manifest is not None
                expected = {
                    n: f"{zlib.adler32(t.contiguous().view(torch.uint8).numpy().tobytes()):08x}"
                    for n, t in trainer.items()
                }
                assert manifest["tensors"] == dict(sorted(expected.items()))
                # byte for byte by the tests' reference reader: the chain in the bucket and every replica
                check_served(stack, target.deployment_id, target.path_prefix, identity, trainer, bucket=target.bucket)

                out = generation.generate({"input_ids": prompt, "input_lengths": torch.tensor([3])})
                assert generation.served_identities == (identity,)
                n = int(out["generation_lengths"][0])
                completion = out["output_ids"][0, 3 : 3 + n].tolist()
                served = out["logprobs"][0, 3 : 3 + n]
                mine = torch.tensor(token_logprobs(trainer, tokenizer.encode("abc"), completion))
                assert torch.allclose(served, mine, atol=1e-4), (served, mine)
            index = json.loads(
                stack.s3_client()
                .get_object(
                    Bucket=target.bucket, Key=f"{target.path_prefix}/nemo-test-v000001/model.safetensors.index.json"
                )["Body"]
                .read()
            )
            assert set(index["weight_map"].values()) <= {
                "model-00000-of-00002.safetensors",
                "model-00001-of-00002.safetensors",
            }
            assert index["metadata"]["base_version"] == "nemo-test-v000000"
        finally:
            for actor in actors:
                ray.kill(actor)
