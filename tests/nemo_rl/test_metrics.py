"""cwtrain's metrics reach the run's NeMo-RL logger: grpo_train drops what refit returns and nests
the generation's metrics, which NeMo-RL's TensorBoard backend skips (stand-in logger with its
scalar rule); the run logger of the setup wrapper writes both as scalars at the right step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from cwtrain.integrations.nemo_rl.metrics import RunLogger, flatten_generation_metrics


def test_run_logger_writes_recorded_metrics_at_the_next_calls_step() -> None:
    from nemo_rl.utils.logger import Logger

    logger = Logger()
    run = RunLogger(logger)
    run.record({"hotload/version": 3, "hotload/wire_bytes": 10.0})
    assert run.pending == {"hotload/version": 3.0, "hotload/wire_bytes": 10.0}
    run.log_metrics({"reward": 0.5}, 4, prefix="train")
    run.log_metrics({"reward": 0.6}, 5, prefix="train")
    assert logger.scalars == [
        ("hotload/version", 3.0, 4),
        ("hotload/wire_bytes", 10.0, 4),
        ("train/reward", 0.5, 4),
        ("train/reward", 0.6, 5),
    ]
    assert run.pending == {}
    assert run.scalars is logger.scalars  # everything else is the wrapped logger's


def test_nested_generation_metrics_are_flattened_to_scalars() -> None:
    from nemo_rl.utils.logger import Logger

    nested = {"loss": 1.0, "generation_logger_metrics": {"coreweave/samples": 8.0, "vllm/series": {"0": [1, 2]}}}
    assert flatten_generation_metrics(nested) == {"loss": 1.0, "coreweave/samples": 8.0}
    logger = Logger()
    RunLogger(logger).log_metrics(nested, 2, prefix="train")
    assert logger.scalars == [("train/loss", 1.0, 2), ("train/coreweave/samples", 8.0, 2)]
    assert logger.skipped == []
    plain = Logger()
    plain.log_metrics(nested, 2, prefix="train")
    assert plain.skipped == ["train/generation_logger_metrics"]  # what NeMo-RL's TensorBoard does unwrapped


class InProcessPolicy:
    """NeMo-RL's Policy as the synchronizer and the stand-in grpo_train drive it, one worker in-process."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker

    def run_all_workers_single_data(self, method_name: str, /, **kwargs: Any) -> list[Any]:
        return [getattr(self.worker, method_name)(**kwargs)]

    def train(self, step: int) -> None:
        self.worker.train_step(step)


@pytest.mark.e2e
@pytest.mark.slow
def test_grpo_run_logs_hotload_and_generation_metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import nemo_rl.algorithms.grpo as grpo
    from cwtrain_test_workers import HalfWorker  # type: ignore[import-not-found]
    from nemo_rl.utils.logger import Logger

    from cwtrain.integrations.nemo_rl import install
    from cwtrain.integrations.nemo_rl.refit import uninstall
    from cwtrain.local import LocalStack
    from cwtrain.local.engine.model import Tokenizer, init_weights, write_base_checkpoint

    with LocalStack(replicas=1) as stack:
        for key, value in stack.env().items():
            monkeypatch.setenv(key, value)
        target = stack.deploy(seed=0)
        write_base_checkpoint(tmp_path / "hf", seed=0)
        generation = {
            "backend": "coreweave",
            "max_new_tokens": 4,
            "temperature": 1.0,
            "coreweave_cfg": {
                "base_url": target.base_url,
                "model": target.model,
                "api_key": stack.token,
                "deployment_id": target.deployment_id,
                "run_id": "metrics-test",
                "timeout": 120,
            },
        }
        config = {"policy": {"model_name": str(tmp_path / "hf"), "generation": generation}}
        policy = InProcessPolicy(HalfWorker(0, 1, init_weights(seed=0)))
        hooks = install()
        try:
            result = grpo.setup(config, Tokenizer(), None, None, policy_factory=lambda: policy)
            run_logger = result[7]
            assert isinstance(run_logger, RunLogger)
            batch = {"input_ids": torch.tensor([Tokenizer().encode("ab")] * 2), "input_lengths": torch.tensor([2, 2])}
            timer = grpo.Timer()
            assert grpo.grpo_train(result[0], result[1], run_logger, steps=3, timer=timer, batch=batch) is None
        finally:
            hooks.uninstall()
            uninstall()
            result[1].shutdown()
        logger = run_logger.logger
        assert isinstance(logger, Logger) and logger.skipped == []
        by_name: dict[str, list[tuple[float, int]]] = {}
        for name, value, step in logger.scalars:
            by_name.setdefault(name, []).append((value, step))
        assert by_name["hotload/version"] == [(0.0, 1), (1.0, 2), (2.0, 3)]
        assert by_name["hotload/incremental"] == [(0.0, 1), (1.0, 2), (1.0, 3)]
        assert all(value == 1.0 for value, _ in by_name["hotload/completed"])
        assert [step for _, step in by_name["train/coreweave/samples"]] == [1, 2, 3]
        assert all(value == 2.0 for value, _ in by_name["train/coreweave/samples"])
        assert timer.labels == ["prepare_for_generation/transfer_and_update_weights"] * 3
        assert result[1].served_identities == ("metrics-test-v000002",)
