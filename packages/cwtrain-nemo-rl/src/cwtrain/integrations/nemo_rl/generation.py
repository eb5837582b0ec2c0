"""``CoreWeaveGeneration``: NeMo-RL's ``GenerationInterface`` served by a remote deployment.

Selected with ``policy.generation.backend: coreweave`` (plus the recipe's patch to
``nemo_rl.algorithms.grpo.setup``, see :mod:`cwtrain.integrations.nemo_rl.patch`). Rows
with the same prompt and stop strings become one ``/v1/completions`` request with ``n`` =
their count (a GRPO group); prompts go as token ids; exact completion ids and log-probs
come back through :mod:`cwtrain.integrations.rollout`. Weights move by hot-load
(:class:`~cwtrain.integrations.nemo_rl.synchronizer.HotLoadWeightSynchronizer`), so the
collective and IPC refit methods are never used: ``init_collective`` returns no futures.

With NeMo Gym (``env.should_use_nemo_gym``), Gym's model server samples through
``dp_openai_server_base_urls``: the URL of cwtrain-gym's
:mod:`~cwtrain.integrations.gym.model_server` endpoint, which this object starts in the
driver on first use (rendering chats with the trainer's tokenizer, salting with the
synchronizer's served identity). ``served_model_name`` is the deployment's model name
(what NeMo-RL's patched ``setup`` gives Gym as ``policy_model_name``), and
:meth:`~CoreWeaveGeneration.configure_nemo_gym` puts the endpoint's bearer token into the Gym
config as its model server's ``api_key`` (the patched ``setup`` calls it before Gym starts). ``cfg`` carries
``vllm_cfg.max_model_len`` = ``coreweave_cfg.max_model_len`` when that is set, since
NeMo-RL's Gym rollouts read the engine's context length there.

Output (``BatchedDataDict``): ``output_ids`` (prompt + generation, right-padded with
``_pad_token_id``, else the tokenizer's pad, else EOS), ``logprobs`` (float32, zero
outside the generation), ``generation_lengths``, ``unpadded_sequence_lengths``,
``truncated``, and one extra field (``GenerationOutputSpec`` allows model-specific ones):
``weight_version`` (int64 per row: the version of this run that served the row, -1 when
the endpoint named none or another run's identity), the per-sample counterpart of the
``weight_version`` NeMo-RL's async replay buffer keeps per trajectory, for off-policy
correction.

Samples are fenced by version (:mod:`cwtrain.integrations.rollout.sampler`): the samplers
sample for ``run_id``, learn each version the synchronizer publishes
(:meth:`CoreWeaveGeneration.note_published`) and each one whose hot-load failed
(:meth:`CoreWeaveGeneration.note_burned`); with ``coreweave_cfg.max_staleness`` /
``CWTRAIN_ROLLOUT_MAX_STALENESS`` stale completions are re-requested, and so are those
served by a version newer than the newest published or by a burned one. ``max_tokens = max(1, min(max_new_tokens, max_model_len - prompt))``;
``greedy`` means temperature 0; stop strings are kept in the output.

``get_logger_metrics()`` returns the last batch's ``coreweave/*`` numbers, the versions
it served (``coreweave/served_version_*``, ``coreweave/stale_rerequested``,
``coreweave/unpublished_rerequested``, ``coreweave/mixed_groups_resampled``) summed over its requests, and the model_server
endpoint's ``coreweave/gym_*`` ones; ``grpo_train`` nests them under
``generation_logger_metrics``, which the run logger of the setup wrapper flattens
(:mod:`cwtrain.integrations.nemo_rl.metrics`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from cwtrain.errors import RolloutError
from cwtrain.integrations.frameworks import require
from cwtrain.integrations.nemo_rl.config import CoreWeaveConfig
from cwtrain.integrations.nemo_rl.framework import NEMO_RL
from cwtrain.integrations.nemo_rl.protocols import Tokenizer, WeightSync
from cwtrain.integrations.rollout import Completion, CompletionSampler, SamplingParams, ServedLedger, merge_batches

if TYPE_CHECKING:
    from cwtrain.integrations.gym import GymModelServer

# NeMo-RL's classes, loaded at import (NeMo-RL is not importable where cwtrain is type-checked).
BatchedDataDict: Any = require(NEMO_RL, "nemo_rl.distributed.batched_data_dict").BatchedDataDict
GenerationInterface: Any = require(NEMO_RL, "nemo_rl.models.generation.interfaces").GenerationInterface

__all__ = ["CoreWeaveGeneration"]

log = logging.getLogger(__name__)


class CoreWeaveGeneration(GenerationInterface):  # type: ignore[misc]
    """Generation from a CoreWeave Dedicated Inference deployment.

    Args:
        config: NeMo-RL's ``policy.generation`` dict (``max_new_tokens``, ``temperature``,
            ``top_p``, ``top_k``, ``stop_token_ids``, ``stop_strings``, ``_pad_token_id``,
            and ``coreweave_cfg``: see :mod:`cwtrain.integrations.nemo_rl.config`).
        tokenizer: the trainer's tokenizer (pad/EOS ids; decoding for a text fallback).
        environ: variables to read instead of ``os.environ`` (tests).
        sampler: an existing sampler (tests); default one built from the config.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        tokenizer: Tokenizer,
        *,
        environ: Mapping[str, str] | None = None,
        sampler: CompletionSampler | None = None,
    ) -> None:
        self.cfg = dict(config)
        self.tokenizer = tokenizer
        self.settings = CoreWeaveConfig.from_generation_config(self.cfg, environ)
        if self.settings.max_model_len is not None:  # where NeMo-RL's Gym rollouts read the context length
            self.cfg["vllm_cfg"] = {**(self.cfg.get("vllm_cfg") or {}), "max_model_len": self.settings.max_model_len}
        run_id = self.settings.hotload.run_id
        self.sampler = sampler or CompletionSampler(self.settings.rollout, tokenizer=tokenizer, run_id=run_id)
        if self.sampler.run_id is None:
            self.sampler.set_run(run_id)
        self._gym_server: GymModelServer | None = None
        self._gym_lock = threading.Lock()
        #: Set by :class:`~cwtrain.integrations.nemo_rl.synchronizer.HotLoadWeightSynchronizer`;
        #: NeMo-RL's refit calls it (see :mod:`cwtrain.integrations.nemo_rl.refit`).
        self.weight_synchronizer: WeightSync | None = None
        self.refit_info: dict[str, Any] | None = None
        self.served_identities: tuple[str, ...] = ()
        self._metrics: dict[str, float] = {}

    # ------------------------------------------------------------ NeMo-RL API

    @property
    def dp_openai_server_base_urls(self) -> list[str]:
        """Where NeMo Gym's model server samples: cwtrain-gym's model_server endpoint (started on first use)."""
        return [self.gym_model_server().base_url]

    @property
    def served_model_name(self) -> str:
        """The deployment's model name (``coreweave_cfg.model`` / ``CWTRAIN_ROLLOUT_MODEL``)."""
        return self.settings.rollout.model

    def configure_nemo_gym(self, nemo_gym: MutableMapping[str, Any], server_name: str = "policy_model") -> None:
        """Give Gym's model server the model_server endpoint's bearer token (starting the endpoint).

        ``nemo_gym`` is NeMo-RL's ``env.nemo_gym``, the Gym config it hands Gym on top of the
        config files (Gym merges it last). NeMo-RL sets ``policy_api_key`` to a placeholder
        there; the ``api_key`` of the model server itself (``<server_name>`` with Gym's
        ``vllm_model``, as ``vllm_model_for_training.yaml`` names it) takes precedence.
        """
        servers = nemo_gym.setdefault(server_name, {}).setdefault("responses_api_models", {})
        servers.setdefault("vllm_model", {})["api_key"] = self.gym_model_server().token

    def gym_model_server(self) -> GymModelServer:
        """The :mod:`~cwtrain.integrations.gym.model_server` endpoint of this generation, started once."""
        with self._gym_lock:
            if self._gym_server is None:
                from cwtrain.integrations.gym import ChatRenderer, GymModel, GymModelServer

                # its own sampler without a tokenizer: a refused token-id prompt must fail, not go as text
                sampler = CompletionSampler(self.settings.rollout, run_id=self.sampler.run_id)
                sampler.ledger = self.sampler.ledger  # one record of who served what, for the sample canary
                if self.sampler.published_version is not None:
                    sampler.note_published(self.sampler.published_version)
                for version in sorted(self.sampler.burned_versions):
                    sampler.note_burned(version)
                model = GymModel(
                    sampler,
                    ChatRenderer(self.tokenizer),  # type: ignore[arg-type]
                    max_model_len=self.settings.max_model_len,
                    salt=self._served_salt,
                )
                self._gym_server = GymModelServer(model).start()
            return self._gym_server

    def _served_salt(self) -> str:
        from cwtrain.integrations.nvext import read_served_identity, rollout_cache_salt

        sync = self.weight_synchronizer
        identity = getattr(sync, "served_identity", None) or read_served_identity(
            self.settings.hotload.state_dir or None
        )
        salt = rollout_cache_salt(identity)
        if salt is None:
            raise RolloutError(
                "no snapshot identity is served yet: the first refit publishes one (the model_server endpoint salts "
                "the prompt cache with it and samples nothing before)"
            )
        return salt

    @property
    def ledger(self) -> ServedLedger:
        """Who served each recent completion, by its tokens (the model_server endpoint's sampler shares it)."""
        return self.sampler.ledger

    def note_published(self, version: int) -> None:
        """The synchronizer published ``version`` of the run: the samplers fence by it from now on."""
        self.sampler.note_published(version, run_id=self.settings.hotload.run_id)
        server = self._gym_server
        if server is not None:
            server.model.sampler.note_published(version, run_id=self.settings.hotload.run_id)

    def note_burned(self, version: int) -> None:
        """The synchronizer's hot-load of ``version`` failed and the fleet was brought back: the samplers refuse it."""
        self.sampler.note_burned(version, run_id=self.settings.hotload.run_id)
        server = self._gym_server
        if server is not None:
            server.model.sampler.note_burned(version, run_id=self.settings.hotload.run_id)

    def init_collective(
        self, ip: str, port: int, world_size: int, *, train_world_size: int | None = None, **kwargs: Any
    ) -> list[Any]:
        """No collective: weights travel by hot-load.

        NeMo-RL's abstract signature is ``(ip, port, world_size)``; ``grpo.setup`` adds
        ``train_world_size=`` (and ``refit_backend=`` for Megatron) when not colocated. All are accepted.
        """
        return []

    def prepare_for_generation(self, *args: Any, **kwargs: Any) -> bool:
        """Nothing to wake up: the deployment is always serving."""
        return True

    def finish_generation(self, *args: Any, **kwargs: Any) -> bool:
        """Nothing to put to sleep."""
        return True

    def prepare_refit_info(self, state_dict_info: dict[str, Any]) -> None:
        """Keep the policy's state-dict description (names, shapes, dtypes)."""
        self.refit_info = state_dict_info

    def shutdown(self) -> bool:
        """Stop the model_server endpoint, if started, and close the connection pools."""
        with self._gym_lock:
            server, self._gym_server = self._gym_server, None
        if server is not None:
            server.close()
            server.model.sampler.close()
        self.sampler.close()
        return True

    def get_logger_metrics(self) -> dict[str, Any]:
        """The last batch's ``coreweave/*`` metrics (and the model_server endpoint's since the last clear)."""
        metrics = dict(self._metrics)
        server = self._gym_server
        if server is not None:
            metrics.update(server.model.metrics())
            gym_identities = [i for i in server.model.identities if i not in self.served_identities]
            self.served_identities = (*self.served_identities, *gym_identities)
        return metrics

    def clear_logger_metrics(self) -> None:
        """Forget the metrics and served identities of earlier batches."""
        self._metrics = {}
        self.served_identities = ()
        server = self._gym_server
        if server is not None:
            server.model.clear_metrics()

    def generate(self, data: Mapping[str, Any], greedy: bool = False) -> Any:
        """Sample completions for right-padded ``input_ids`` / ``input_lengths``.

        Rows with equal prompts and stop strings share one request (``n`` = count).
        """
        input_ids = data["input_ids"]
        lengths = [int(x) for x in data["input_lengths"]]
        rows = len(lengths)
        row_stops = self._row_stops(data, rows)
        prompts = [tuple(int(t) for t in input_ids[i, : lengths[i]].tolist()) for i in range(rows)]

        # (prompt, stops) -> rows; grouped again by sampling parameters (max_tokens, stops).
        groups: dict[tuple[tuple[int, ...], tuple[str, ...]], list[int]] = {}
        for i in range(rows):
            groups.setdefault((prompts[i], row_stops[i]), []).append(i)
        buckets: dict[SamplingParams, list[tuple[tuple[int, ...], list[int]]]] = {}
        for (prompt, stops), members in groups.items():
            buckets.setdefault(self._params(len(prompt), stops, greedy), []).append((prompt, members))

        # one batch per bucket; what the whole generate held is counted over all of them
        batch = merge_batches(
            [
                self.sampler.sample_groups_sync([p for p, _ in items], [len(m) for _, m in items], params)
                for params, items in buckets.items()
            ]
        )
        row_groups = [ids for items in buckets.values() for _, ids in items]
        results = {row: c for ids, group in zip(row_groups, batch.groups, strict=True) for row, c in zip(ids, group)}
        self.served_identities = batch.identities
        self._metrics = dict(batch.metrics)
        return self._output(input_ids, lengths, results)

    # ------------------------------------------------------------ helpers

    def _row_stops(self, data: Mapping[str, Any], rows: int) -> list[tuple[str, ...]]:
        default = tuple(self.cfg.get("stop_strings") or ())
        per_row = data.get("stop_strings")
        out = []
        for i in range(rows):
            extra = per_row[i] if per_row is not None and i < len(per_row) and per_row[i] else ()
            out.append(tuple(dict.fromkeys([*default, *extra])))
        return out

    def _params(self, prompt_len: int, stops: Sequence[str], greedy: bool) -> SamplingParams:
        max_new = int(self.cfg.get("max_new_tokens") or 1)
        limit = self.settings.max_model_len
        max_tokens = max(1, min(max_new, limit - prompt_len)) if limit else max(1, max_new)
        top_k = self.cfg.get("top_k")
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=0.0 if greedy else float(self.cfg.get("temperature", 1.0)),
            top_p=float(self.cfg.get("top_p") or 1.0),
            top_k=int(top_k) if top_k and int(top_k) > 0 else 0,
            stop=tuple(stops),
            stop_token_ids=tuple(int(t) for t in (self.cfg.get("stop_token_ids") or ())),
            include_stop_str_in_output=bool(stops),
        )

    def _pad_id(self) -> int:
        for value in (self.cfg.get("_pad_token_id"), self.tokenizer.pad_token_id, self.tokenizer.eos_token_id):
            if value is not None:
                return int(value)
        return 0

    def _output(self, input_ids: torch.Tensor, lengths: list[int], results: Mapping[int, Completion]) -> Any:
        rows = len(lengths)
        gen_lengths = [len(results[i].response_ids) for i in range(rows)]
        width = max([int(input_ids.shape[1])] + [lengths[i] + gen_lengths[i] for i in range(rows)])
        output_ids = torch.full((rows, width), self._pad_id(), dtype=input_ids.dtype)
        logprobs = torch.zeros((rows, width), dtype=torch.float32)
        for i in range(rows):
            length, completion = lengths[i], results[i]
            output_ids[i, :length] = input_ids[i, :length]
            if gen_lengths[i]:
                output_ids[i, length : length + gen_lengths[i]] = torch.tensor(completion.response_ids)
                if completion.logprobs is not None:
                    logprobs[i, length : length + gen_lengths[i]] = torch.tensor(completion.logprobs)
        return BatchedDataDict(
            {
                "output_ids": output_ids,
                "logprobs": logprobs,
                "generation_lengths": torch.tensor(gen_lengths, dtype=torch.long),
                "unpadded_sequence_lengths": torch.tensor(
                    [lengths[i] + gen_lengths[i] for i in range(rows)], dtype=torch.long
                ),
                "truncated": torch.tensor([results[i].truncated for i in range(rows)], dtype=torch.bool),
                "weight_version": torch.tensor(
                    [-1 if results[i].version is None else results[i].version for i in range(rows)], dtype=torch.long
                ),
            }
        )
