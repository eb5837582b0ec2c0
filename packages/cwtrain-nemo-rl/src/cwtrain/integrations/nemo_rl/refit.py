"""Rebind three names of ``nemo_rl.algorithms.grpo`` for the coreweave backend.

::

    from cwtrain.integrations.nemo_rl.refit import grpo_hooks

    hooks = grpo_hooks()          # the process's hooks (found again once installed)
    hooks.install_setup(DTENSOR_WORKER_FQN)
    hooks.install_refit()
    ...
    hooks.uninstall()             # NeMo-RL's own functions are back

- :meth:`GrpoHooks.install_refit` — ``grpo_train`` calls ``refit_policy_generation`` by
  its module-global name when weights are stale. The wrapper calls
  ``policy_generation.weight_synchronizer.sync_weights(timer=..., kv_scales=...)`` for a
  :class:`~cwtrain.integrations.nemo_rl.generation.CoreWeaveGeneration` that has one and
  returns ``None``, as NeMo-RL's function does; every other backend goes to NeMo-RL's own
  function, unchanged.
- :meth:`GrpoHooks.install_setup` — wraps ``setup`` so that with ``policy.generation.backend:
  coreweave`` the policy is built by ``functools.partial(Policy,
  worker_extension_cls_fqn=<worker>)``, the generation gets a
  :class:`~cwtrain.integrations.nemo_rl.synchronizer.HotLoadWeightSynchronizer` seeded from
  ``policy.model_name`` (a local HF checkpoint), and the logger ``setup`` returns is wrapped
  in a :class:`~cwtrain.integrations.nemo_rl.metrics.RunLogger` that writes the sync's
  ``hotload/*`` metrics and flattens the generation's ``coreweave/*`` metrics (``grpo_train``
  logs whatever logger ``setup`` returned). Before ``setup`` it turns
  ``vllm_cfg.enable_vllm_metrics_logger`` off (an inherited vLLM setting that makes
  ``grpo_train`` parse the generation's metrics as vLLM's) and, with ``env.should_use_nemo_gym``,
  checks that ``coreweave_cfg.max_model_len`` is set (NeMo-RL's Gym rollouts read the engine's
  context length). It then arms the sample canary
  (:func:`cwtrain.integrations.nemo_rl.canary.arm`). Other backends are untouched.
- :meth:`GrpoHooks.install_masking` — ``grpo_train`` calls
  ``compute_and_apply_seq_logprob_error_masking(train_data, rewards, threshold)`` by its
  module-global name once ``prev_logprobs`` are computed, before the advantages; the wrapper
  first judges the batch's served version from them (:mod:`~cwtrain.integrations.nemo_rl.canary`:
  a refused version's rows get ``sample_mask`` 0), then calls NeMo-RL's function, unchanged.
  Armed by the setup wrapper for a coreweave generation.

:class:`GrpoHooks` is the plug-in's only process state: the wrappers it put into
``nemo_rl.algorithms.grpo`` and NeMo-RL's functions they replaced. It lives on the
wrappers themselves, so :func:`grpo_hooks` finds the one installed (installing twice is a
no-op) and :meth:`GrpoHooks.uninstall` puts back exactly what it replaced. The module
functions :func:`install`, :func:`install_setup` and :func:`uninstall` do the same on
the process's hooks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from cwtrain.errors import ConfigError
from cwtrain.integrations.frameworks import require
from cwtrain.integrations.nemo_rl.framework import NEMO_RL
from cwtrain.integrations.nemo_rl.protocols import WorkerGroup

__all__ = ["GrpoHooks", "grpo_hooks", "install", "install_setup", "uninstall"]

# The attribute of an installed wrapper that holds its GrpoHooks.
_HOOKS = "__cwtrain_hooks__"
_REFIT = "refit_policy_generation"
_SETUP = "setup"
_MASKING = "compute_and_apply_seq_logprob_error_masking"
# Positions in the tuple grpo.setup returns (NeMo-RL v0.7.0).
_LOGGER_INDEX = 7


@dataclass
class GrpoHooks:
    """cwtrain's wrappers of ``nemo_rl.algorithms.grpo`` and the functions they replaced.

    Attributes:
        grpo: the ``nemo_rl.algorithms.grpo`` module.
        originals: name → NeMo-RL's function, for every name wrapped now.
    """

    grpo: ModuleType
    originals: dict[str, Callable[..., Any]] = field(default_factory=dict)
    #: the coreweave generation the last wrapped ``setup`` built (the masking wrapper judges its samples)
    generation: Any = None

    def _installed(self, name: str) -> Callable[..., Any] | None:
        current: Callable[..., Any] = getattr(self.grpo, name)
        return current if name in self.originals and getattr(current, _HOOKS, None) is self else None

    def _bind(self, name: str, wrapper: Callable[..., Any]) -> Callable[..., Any]:
        setattr(wrapper, _HOOKS, self)
        self.originals[name] = getattr(self.grpo, name)
        setattr(self.grpo, name, wrapper)
        return wrapper

    def install_refit(self) -> Callable[..., Any]:
        """Rebind ``grpo.refit_policy_generation``; returns the wrapper (the same one when installed)."""
        installed = self._installed(_REFIT)
        if installed is not None:
            return installed
        from cwtrain.integrations.nemo_rl.generation import CoreWeaveGeneration

        original = getattr(self.grpo, _REFIT)

        @functools.wraps(original)
        def refit_policy_generation(
            policy: WorkerGroup,
            policy_generation: object,
            colocated_inference: bool,
            _refit_buffer_size_gb: float | None = None,
            timer: object | None = None,
            kv_scales: Mapping[str, float] | None = None,
        ) -> Any:
            sync = policy_generation.weight_synchronizer if isinstance(policy_generation, CoreWeaveGeneration) else None
            if sync is not None:
                sync.sync_weights(timer=timer, kv_scales=kv_scales)
                return None
            return original(
                policy, policy_generation, colocated_inference, _refit_buffer_size_gb, timer=timer, kv_scales=kv_scales
            )

        return self._bind(_REFIT, refit_policy_generation)

    def install_setup(self, worker_fqn: str) -> Callable[..., Any]:
        """Wrap ``grpo.setup`` for the coreweave backend; returns the wrapper (the same one when installed)."""
        installed = self._installed(_SETUP)
        if installed is not None:
            return installed
        policy_cls = require(NEMO_RL, "nemo_rl.models.policy.lm_policy").Policy
        original = getattr(self.grpo, _SETUP)

        @functools.wraps(original)
        def setup(
            master_config: Any,
            tokenizer: Any,
            dataset: Any,
            val_dataset: Any,
            processor: Any = None,
            policy_factory: Any = None,
        ) -> Any:
            policy_config = _section(master_config, "policy")
            generation = policy_config["generation"] or {}
            coreweave = generation.get("backend") == "coreweave"
            if coreweave:
                _check_nemo_gym(master_config, generation)
                _no_vllm_metrics_logger(generation)
            if coreweave and policy_factory is None:
                policy_factory = functools.partial(policy_cls, worker_extension_cls_fqn=worker_fqn)
            result = original(
                master_config, tokenizer, dataset, val_dataset, processor=processor, policy_factory=policy_factory
            )
            if coreweave:
                result = _attach(result, generation, policy_config["model_name"])
                if isinstance(result, tuple) and len(result) > 1:
                    self.arm_canary(result[1], master_config, generation)
            return result

        return self._bind(_SETUP, setup)

    def arm_canary(self, generation: Any, master_config: Any, generation_config: Mapping[str, Any]) -> Any:
        """Arm ``generation``'s sample canary (:func:`cwtrain.integrations.nemo_rl.canary.arm`) and rebind the
        masking step that runs it; returns the canary (``None``: this configuration is not judged)."""
        from cwtrain.integrations.nemo_rl.canary import arm

        canary = arm(generation, master_config, generation_config)
        if canary is not None:
            self.generation = generation
            self.install_masking()
        return canary

    def install_masking(self) -> Callable[..., Any] | None:
        """Rebind ``grpo.compute_and_apply_seq_logprob_error_masking`` (the sample canary runs first); returns the
        wrapper, or ``None`` where NeMo-RL has no such function."""
        installed = self._installed(_MASKING)
        if installed is not None:
            return installed
        original = getattr(self.grpo, _MASKING, None)
        if original is None:
            return None

        @functools.wraps(original)
        def compute_and_apply_seq_logprob_error_masking(
            train_data: Any, rewards: Any, seq_logprob_error_threshold: float | None
        ) -> Any:
            _judge(self.generation, train_data)  # the refused version's rows leave the batch before NeMo-RL's masking
            return original(train_data, rewards, seq_logprob_error_threshold)

        return self._bind(_MASKING, compute_and_apply_seq_logprob_error_masking)

    def uninstall(self) -> None:
        """Put back NeMo-RL's functions where cwtrain's wrappers still stand."""
        for name, original in list(self.originals.items()):
            if self._installed(name) is not None:
                setattr(self.grpo, name, original)
            del self.originals[name]
        self.generation = None


def _section(master_config: Any, name: str) -> Any:
    """A section of NeMo-RL's config: an attribute of its ``MasterConfig`` model, or a key of a plain dict."""
    if isinstance(master_config, Mapping):
        return master_config.get(name)
    return getattr(master_config, name, None)


def _check_nemo_gym(master_config: Any, generation: Mapping[str, Any]) -> None:
    env = _section(master_config, "env") or {}
    if not env.get("should_use_nemo_gym"):
        return
    if not (generation.get("coreweave_cfg") or {}).get("max_model_len"):
        raise ConfigError(
            "env.should_use_nemo_gym with the coreweave backend needs policy.generation.coreweave_cfg.max_model_len "
            "(the deployment's context length: NeMo-RL's Gym rollouts read it, and cwtrain's model_server caps "
            "each turn's max_tokens with it)"
        )


def _no_vllm_metrics_logger(generation: Any) -> None:
    """Turn ``vllm_cfg.enable_vllm_metrics_logger`` off: there is no vLLM engine to report.

    With it on and ``vllm_cfg.async_engine`` (which NeMo-RL's Gym setup forces), ``grpo_train``
    reads the generation's logger metrics as vLLM's per-worker series and fails on cwtrain's.
    """
    vllm_cfg = generation.get("vllm_cfg") if isinstance(generation, Mapping) else None
    if isinstance(vllm_cfg, dict) and vllm_cfg.get("enable_vllm_metrics_logger"):
        vllm_cfg["enable_vllm_metrics_logger"] = False


def _attach(result: Any, generation: Mapping[str, Any], model_name: str) -> Any:
    """Give a coreweave generation its synchronizer and ``grpo_train`` the :class:`RunLogger`."""
    from cwtrain.integrations.nemo_rl.generation import CoreWeaveGeneration
    from cwtrain.integrations.nemo_rl.metrics import RunLogger
    from cwtrain.integrations.nemo_rl.synchronizer import HotLoadWeightSynchronizer

    policy, policy_generation = result[0], result[1]
    if not isinstance(policy_generation, CoreWeaveGeneration):
        return result
    if policy_generation.weight_synchronizer is None:
        HotLoadWeightSynchronizer(policy, policy_generation, generation, hf_checkpoint=model_name)
    if not isinstance(result, tuple) or len(result) <= _LOGGER_INDEX:
        return result  # not NeMo-RL v0.7.0's 13-tuple: leave the logger alone
    logger = result[_LOGGER_INDEX]
    run_logger = logger if isinstance(logger, RunLogger) else RunLogger(logger)
    sync = policy_generation.weight_synchronizer
    if isinstance(sync, HotLoadWeightSynchronizer):
        sync.metrics_sink = run_logger.record
    return (*result[:_LOGGER_INDEX], run_logger, *result[_LOGGER_INDEX + 1 :])


def _judge(policy_generation: Any, train_data: Any) -> None:
    """The sample canary on one batch (see :mod:`~cwtrain.integrations.nemo_rl.canary`); its metrics to the run logger."""
    from cwtrain.integrations.nemo_rl.canary import judge_train_data

    sync = getattr(policy_generation, "weight_synchronizer", None)
    canary = getattr(sync, "sample_canary", None)
    if sync is None or canary is None:
        return
    before = float(train_data["sample_mask"].sum())
    verdict = judge_train_data(canary, policy_generation.ledger, train_data)
    metrics = verdict.metrics()
    if metrics:
        metrics["hotload/canary_dropped_rows"] = before - float(train_data["sample_mask"].sum())
        sink = getattr(sync, "metrics_sink", None)
        if sink is not None:
            sink(metrics)


def grpo_hooks() -> GrpoHooks:
    """The process's :class:`GrpoHooks`: the installed one, else a new one (nothing installed yet)."""
    grpo = require(NEMO_RL, "nemo_rl.algorithms.grpo")
    for name in (_REFIT, _SETUP, _MASKING):
        hooks = getattr(getattr(grpo, name, None), _HOOKS, None)
        if isinstance(hooks, GrpoHooks):
            return hooks
    return GrpoHooks(grpo)


def install() -> Callable[..., Any]:
    """Rebind ``nemo_rl.algorithms.grpo.refit_policy_generation``; returns the wrapper."""
    return grpo_hooks().install_refit()


def install_setup(worker_fqn: str) -> Callable[..., Any]:
    """Wrap ``nemo_rl.algorithms.grpo.setup`` for the coreweave backend; returns the wrapper."""
    return grpo_hooks().install_setup(worker_fqn)


def uninstall() -> None:
    """Put NeMo-RL's own ``refit_policy_generation`` and ``setup`` back."""
    grpo_hooks().uninstall()
