"""A CPU stand-in for NeMo-RL's ``Policy`` in the real-code GRPO run (no GPUs here).

It is what ``grpo_train`` drives: log-probs for a batch, a training step on a batch with
advantages, and ``run_all_workers_single_data`` for cwtrain's synchronizer. The model is
cwtrain-local's tiny model (float32 master weights, Adam, NeMo-RL's own GRPO loss function on
the batch ``grpo_train`` hands it); its one "worker" is cwtrain's
``HotLoadWorkerMixin``, so every refit publishes these weights to the local deployment.
Everything else NeMo-RL's ``Policy`` does (placement, offloading, checkpoints) is a no-op.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from cwtrain.integrations.nemo_rl.worker_mixin import HotLoadWorkerMixin
from cwtrain.local.engine.model import ModelConfig, forward, load_checkpoint


class TinyWorker(HotLoadWorkerMixin):
    """The one policy worker: publishes the policy's weights as BF16, in a fixed order."""

    def __init__(self, params: Mapping[str, torch.Tensor]) -> None:
        self.params = params

    def cwtrain_params(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name in sorted(self.params):
            yield name, self.params[name].detach().to(torch.bfloat16)


class CpuPolicy:
    """NeMo-RL's ``Policy`` (``Policy(cluster, config, tokenizer, ...)``) on the CPU, see the module docs."""

    def __init__(self, cluster: Any = None, config: Any = None, tokenizer: Any = None, **kwargs: Any) -> None:
        self.config = config
        self.worker_extension_cls_fqn = kwargs.get("worker_extension_cls_fqn")
        model_config, weights = load_checkpoint(config["model_name"])
        self.model_config: ModelConfig = model_config
        self.reference = {k: v.float() for k, v in weights.items()}
        self.params = {k: v.float().clone().requires_grad_() for k, v in weights.items()}
        self.optimizer = torch.optim.Adam(list(self.params.values()), lr=3e-3)
        self.worker = TinyWorker(self.params)
        self.steps = 0

    # ------------------------------------------------------------ what cwtrain's synchronizer calls
    def run_all_workers_single_data(self, method_name: str, /, **kwargs: Any) -> list[Any]:
        return [getattr(self.worker, method_name)(**kwargs)]

    # ------------------------------------------------------------ what grpo.setup / grpo_train call
    def print_node_ip_and_gpu_id(self) -> None:
        pass

    def prepare_refit_info(self) -> dict[str, Any]:
        return {name: (tuple(t.shape), torch.bfloat16) for name, t in self.params.items()}

    def prepare_for_lp_inference(self) -> None:
        pass

    def prepare_for_training(self, *args: Any, **kwargs: Any) -> None:
        pass

    def finish_training(self, *args: Any, **kwargs: Any) -> None:
        pass

    def offload_before_refit(self) -> None:
        pass

    def offload_after_refit(self) -> None:
        pass

    def save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        pass

    def shutdown(self) -> bool:
        return True

    def _logprobs(self, params: Mapping[str, torch.Tensor], data: Mapping[str, Any]) -> torch.Tensor:
        """NeMo-RL's convention: ``out[:, t]`` is the log-prob of token ``t``, 0 at position 0."""
        ids = data["input_ids"]
        logits = forward(params, ids, self.model_config)
        token = torch.log_softmax(logits[:, :-1], dim=-1).gather(2, ids[:, 1:, None])[..., 0]
        return torch.cat([torch.zeros((ids.shape[0], 1)), token], dim=1)

    def get_logprobs(self, data: Mapping[str, Any], timer: Any = None, **kwargs: Any) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            return {"logprobs": self._logprobs(self.params, data)}

    def get_reference_policy_logprobs(
        self, data: Mapping[str, Any], timer: Any = None, **kwargs: Any
    ) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            return {"reference_logprobs": self._logprobs(self.reference, data)}

    def train(self, data: Mapping[str, Any], loss_fn: Any, eval_mode: bool = False, **kwargs: Any) -> dict[str, Any]:
        """One optimizer step on the whole batch with NeMo-RL's own loss function (``ClippedPGLossFn``)."""
        mask = data["token_mask"][:, 1:].float() * data["sample_mask"].float()[:, None]
        valid_seqs = data["sample_mask"].float().sum()
        valid_toks = mask.sum()
        next_token_logprobs = self._logprobs(self.params, data)[:, 1:]
        loss, metrics = loss_fn(next_token_logprobs, data, valid_seqs, valid_toks)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(list(self.params.values()), 1e9)
        if not eval_mode:
            self.optimizer.step()
            self.steps += 1
        all_mb_metrics = {name: [float(value)] for name, value in metrics.items() if _scalar(value)}
        all_mb_metrics.update({"lr": [3e-3], "global_valid_seqs": [float(valid_seqs)],
                               "global_valid_toks": [float(valid_toks)]})  # fmt: skip
        return {"loss": loss.detach(), "grad_norm": grad_norm.detach(), "all_mb_metrics": all_mb_metrics}


def _scalar(value: Any) -> bool:
    return isinstance(value, (int, float)) or (isinstance(value, torch.Tensor) and value.numel() == 1)
