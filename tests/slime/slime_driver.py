"""A stand-in for slime's delta weight updater: writes versions the way slime does and replays the hook calls.

``SlimeRun`` mirrors ``UpdateWeightFromDiskDelta``: the first ``update_weights`` wipes the
delta root and calls the post-write hook with it on rank 0 (the baseline, seeded from
``--hf-checkpoint``); each later call writes ``weight_v{N:06d}/`` with one safetensors shard
per writing rank (``model-{i:05d}-of-{n:05d}``, 0-based, U8 entries each holding one zstd
frame of ``new XOR old``, Adler-32 of the new bytes in ``__metadata__``), then the index
(compact JSON, ``version``/``base_version`` as ``%06d``), then calls the hook on every rank.
Written independently of cwtrain's codec, so the hook is tested against a second
implementation of the format.
"""

from __future__ import annotations

import argparse
import json
import shutil
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.numpy
import zstandard

Weights = dict[str, np.ndarray]


def slime_args(tmp: Path, hf_checkpoint: Path, **overrides: Any) -> argparse.Namespace:
    """A slime-like namespace with the flags of frameworks.md sections 1.1 and 5.

    Only attributes slime's own parser has (slime has no ``--use-session-server``; the
    contract suite, tests/contracts, checks the names against the real parser).
    """
    values: dict[str, Any] = {
        "rank": 0,
        "hf_checkpoint": str(hf_checkpoint),
        "update_weight_mode": "delta",
        "update_weight_transport": "disk",
        "update_weight_disk_dir": str(tmp / "weights"),
        "update_weight_local_checkpoint_dir": str(tmp / "local"),
        "update_weight_delta_encoding": "xor",
        "update_weight_delta_checksum": "adler32",
        "update_weight_disk_keep_files": False,
        "update_weight_buffer_size": 512 * 1024**2,
        "custom_update_weight_post_write_path": "cwtrain.integrations.slime.hook",
        "rollout_function_path": "cwtrain.integrations.slime.rollout.generate_rollout",
        "rollout_batch_size": 2,
        "over_sampling_batch_size": 2,
        "n_samples_per_prompt": 3,
        "rollout_max_response_len": 6,
        "rollout_temperature": 1.0,
        "rollout_top_p": 1.0,
        "rollout_top_k": -1,
        "rollout_stop": None,
        "rollout_stop_token_ids": None,
        "rollout_global_dataset": True,
        "use_tis": False,
        "use_rollout_logprobs": False,
        "get_mismatch_metrics": False,
        "use_rollout_routing_replay": False,
        "custom_generate_function_path": None,
        "dynamic_sampling_filter_path": None,
        "rollout_sample_filter_path": None,
        "rollout_all_samples_process_path": None,
        "custom_rm_path": None,
        "group_rm": False,
        "rm_type": None,
    }
    values.update(overrides)
    return argparse.Namespace(**values)


def raw(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


class SlimeRun:
    """Replays slime's hook call order over real-format delta directories.

    Args:
        args: the namespace (``update_weight_disk_dir``, ``hf_checkpoint``).
        base: the weights of ``--hf-checkpoint`` (what the baseline seeds from).
        hook: the post-write hook, as ``load_function`` returned it.
        world_size: ranks calling the hook (each gets its own ``args.rank``).
    """

    def __init__(
        self,
        args: argparse.Namespace,
        base: Mapping[str, np.ndarray],
        hook: Callable[..., Any],
        *,
        world_size: int = 1,
    ) -> None:
        self.args = args
        self.snapshot: Weights = {name: array.copy() for name, array in base.items()}
        self.hook = hook
        self.world_size = world_size
        self.version = 0
        self.root = Path(args.update_weight_disk_dir)
        self.results: list[Any] = []

    def _call_hook(self, directory: Path, ranks: range) -> None:
        for rank in ranks:
            args = argparse.Namespace(**{**vars(self.args), "rank": rank})
            result = self.hook(args, str(directory), [])
            if rank == 0:
                self.results.append(result)

    def baseline(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True)
        self._call_hook(self.root, range(1))

    def step(self, new: Mapping[str, np.ndarray], *, writers: int = 1) -> Path:
        """Write the next version (changed tensors spread over ``writers`` shards) and call the hook."""
        self.version += 1
        directory = self.root / f"weight_v{self.version:06d}"
        directory.mkdir(parents=True)
        changed: dict[str, tuple[np.ndarray, str]] = {}
        for name in sorted(new):
            old, cur = raw(self.snapshot[name]), raw(new[name])
            diff = old ^ cur
            if np.count_nonzero(diff):
                frame = zstandard.ZstdCompressor(level=1).compress(diff.tobytes())
                changed[name] = (
                    np.frombuffer(frame, dtype=np.uint8),
                    f"{zlib.adler32(cur.tobytes()) & 0xFFFFFFFF:08x}",
                )
            self.snapshot[name] = np.array(new[name], copy=True)
        names = sorted(changed)
        parts = [names[i::writers] for i in range(writers)]
        parts = [p for p in parts if p]
        weight_map: dict[str, str] = {}
        for i, part in enumerate(parts):
            fname = f"model-{i:05d}-of-{len(parts):05d}.safetensors"
            blob = safetensors.numpy.save({n: changed[n][0] for n in part}, metadata={n: changed[n][1] for n in part})
            (directory / fname).write_bytes(blob)
            weight_map.update({n: fname for n in part})
        index = {
            "metadata": {
                "version": f"{self.version:06d}",
                "base_version": f"{self.version - 1:06d}",
                "delta_encoding": self.args.update_weight_delta_encoding,
                "compression_format": "zstd",
                "checksum_format": self.args.update_weight_delta_checksum,
            },
            "weight_map": weight_map,
        }
        (directory / "model.safetensors.index.json").write_bytes(json.dumps(index).encode())
        self._call_hook(directory, range(self.world_size))
        return directory


def write_hf_checkpoint(directory: Path, weights: Mapping[str, np.ndarray]) -> Path:
    """A one-file HF checkpoint (``model.safetensors`` + ``config.json``)."""
    directory.mkdir(parents=True, exist_ok=True)
    safetensors.numpy.save_file(dict(weights), str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({"model_type": "tiny"}))
    return directory


def tiny_weights(seed: int = 0) -> Weights:
    rng = np.random.default_rng(seed)
    return {
        "lm_head.weight": rng.standard_normal((8, 4)).astype(np.float32),
        "model.embed_tokens.weight": rng.standard_normal((8, 4)).astype(np.float32),
        "model.layers.0.mlp.experts.0.up_proj.weight": rng.standard_normal((4, 4)).astype(np.float16),
        "model.norm.weight": np.ones(4, dtype=np.float32),
    }


def nudge(weights: Mapping[str, np.ndarray], names: list[str], step: int) -> Weights:
    out = {name: array.copy() for name, array in weights.items()}
    for name in names:
        flat = out[name].reshape(-1)
        flat[step % flat.size] += np.asarray(0.5, dtype=flat.dtype)
    return out
