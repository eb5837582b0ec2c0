"""Chain cadence by cost (``auto``) against a fixed count, on a run whose changed fraction moves (issue 25).

A generated run of ``--versions`` versions of the local stack's tiny model (22 BF16 tensors,
214 KiB) is published to :class:`cwtrain.local.LocalStack` through core's publish session
(:class:`cwtrain.hotload.PublishSession`, as every integration publishes), once with
``CWTRAIN_HOTLOAD_FULL_EVERY=auto`` and once with a fixed count (``--fixed``, 20), the same
weights for both. Each version changes a fraction of every tensor's values by 1 to
``--ulps`` BF16 ulps (an optimizer step's size); the fraction moves in phases (``--phases``,
default 0.5 % for a third of the run, 60 % for the next, then 1 %). A second run that stays
sparse (the first phase's fraction throughout) checks that the two policies then publish
the same snapshots (``--no-sparse-check`` skips it). Every version is hot-loaded on every
replica and verified before the next.

For each policy: FULL and delta counts, bytes stored (every object of every snapshot),
bytes uploaded (what the trainer sent), the largest replay a cold replica would do at any
version (its chain's FULL and every delta since, ``hotload/replay_bytes``) and where, the
encode seconds (wall time inside ``DeltaEncoder.encode`` and ``DeltaEncoder.checksums``: the
deltas' XOR+zstd, the FULL snapshots' Adler-32, and under ``auto`` the encode of a delta a
cut then replaced) and the hot-load seconds (request until every replica serves it); then
the ratios ``auto / fixed`` of the same run, and the acceptance of issue 25 (``auto``'s
worst replay within ``1 + replay budget`` FULLs and at most half the fixed count's, bytes
stored within 1.3x, the sparse run's snapshots identical). Exit 0 when all hold::

    .venv-3.12/bin/python bench/cadence.py                            # 100 versions, two runs, table
    .venv-3.12/bin/python bench/cadence.py --json > bench/results/cadence.json   # the doc's run
    .venv-3.12/bin/python bench/cadence.py --phases 20:0.005,20:1.0 --ulps 256   # a dense phase
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from cwtrain.hotload import HotLoader, HotLoadSettings, PublishOutcome, PublishSession
from cwtrain.hotload.codec.encode import DeltaEncoder
from cwtrain.hotload.lifecycle.cadence import DEFAULT_FULL_SHARE, DEFAULT_REPLAY_BUDGET, CutReason
from cwtrain.infra import InferenceClient
from cwtrain.local import LocalStack
from cwtrain.local.engine.model import ModelConfig, init_weights

#: The issue's phases: 0.5 % of the values change, then 60 %, then 1 % (thirds of the run).
DEFAULT_PHASES = "0.005,0.6,0.01"
#: Acceptance: auto's worst cold replay at most this share of the fixed count's.
WORST_REPLAY_RATIO = 0.5
#: Acceptance: auto's bytes stored at most this many times the fixed count's.
STORED_RATIO = 1.3


def parse_phases(text: str, versions: int) -> list[tuple[int, float]]:
    """``"0.005,0.6,0.01"`` (equal parts) or ``"33:0.005,33:0.6,34:0.01"`` → ``[(versions, fraction), ...]``."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise SystemExit("--phases: give at least one fraction")
    if all(":" in item for item in items):
        phases = [(int(item.split(":")[0]), float(item.split(":")[1])) for item in items]
        if sum(count for count, _ in phases) != versions:
            raise SystemExit(f"--phases: the counts add up to {sum(c for c, _ in phases)}, not --versions {versions}")
    elif any(":" in item for item in items):
        raise SystemExit("--phases: give every phase as COUNT:FRACTION, or none")
    else:
        fractions = [float(item) for item in items]
        base, extra = divmod(versions, len(fractions))
        phases = [(base + (i >= len(fractions) - extra), f) for i, f in enumerate(fractions)]
    if any(not 0 <= f <= 1 for _, f in phases) or any(c < 1 for c, _ in phases):
        raise SystemExit("--phases: fractions in 0..1, counts >= 1")
    return phases


def fractions_of(phases: Sequence[tuple[int, float]]) -> list[float]:
    """The changed fraction of versions 1..N."""
    return [fraction for count, fraction in phases for _ in range(count)]


def step_weights(
    weights: dict[str, torch.Tensor], fraction: float, ulps: int, rng: np.random.Generator
) -> dict[str, torch.Tensor]:
    """New BF16 weights: ``fraction`` of each tensor's values moved by 1..``ulps`` ulps (up or down)."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        bits = tensor.view(torch.int16).numpy().copy()
        flat = bits.reshape(-1)
        count = round(flat.size * fraction)
        if count:
            index = rng.choice(flat.size, count, replace=False)
            moves = rng.integers(1, ulps + 1, count) * rng.choice(np.array([-1, 1]), count)
            flat[index] = (flat[index].astype(np.int32) + moves).astype(np.int16)
        out[name] = torch.from_numpy(bits).view(torch.bfloat16)
    return out


class EncodeClock:
    """Wall seconds spent inside ``DeltaEncoder.encode`` and ``DeltaEncoder.checksums`` while active."""

    def __init__(self) -> None:
        self.seconds = 0.0

    @contextmanager
    def active(self) -> Iterator[EncodeClock]:
        originals = {name: getattr(DeltaEncoder, name) for name in ("encode", "checksums")}

        def timed(original: Callable[..., Any]) -> Callable[..., Any]:
            def run(encoder: DeltaEncoder, *args: Any, **kwargs: Any) -> Any:
                started = time.perf_counter()
                try:
                    return original(encoder, *args, **kwargs)
                finally:
                    self.seconds += time.perf_counter() - started

            return run

        for name, original in originals.items():
            setattr(DeltaEncoder, name, timed(original))
        try:
            yield self
        finally:
            for name, original in originals.items():
                setattr(DeltaEncoder, name, original)


def run_policy(
    loader: HotLoader,
    deployment_id: str,
    run_id: str,
    full_every: int | str,
    fractions: Sequence[float],
    *,
    seed: int,
    ulps: int,
) -> dict[str, Any]:
    """Publish the baseline and one version per fraction with ``full_every``; every figure per version."""
    rng = np.random.default_rng(seed)  # the same weights for every policy of a run
    served = init_weights(seed=seed)
    config_json = json.dumps(ModelConfig().to_json()).encode()
    settings = HotLoadSettings(deployment_id, run_id, full_every=full_every, verify=True, timeout=120.0)
    session = PublishSession(settings, target=loader.target)
    files = {"config.json": config_json}
    records = []
    clock = EncodeClock()
    with clock.active():
        for version, fraction in enumerate([0.0, *fractions]):
            new = served if version == 0 else step_weights(served, fraction, ulps, rng)
            before = clock.seconds
            outcome = session.publish_tensors(session.begin(version), new, base=served, extra_files=files)
            if not outcome.completed or outcome.replicas_verified != outcome.replicas_total:
                raise SystemExit(f"{run_id}: version {version} was not served by every replica")
            served = new
            records.append(_record(outcome, fraction, clock.seconds - before))
    return summarize(run_id, full_every, records)


def _record(outcome: PublishOutcome, fraction: float, encode_seconds: float) -> dict[str, Any]:
    return {
        "version": outcome.version,
        "changed_fraction": fraction,
        "type": outcome.kind,
        "cut_reason": CutReason(outcome.cut_reason).label,
        "snapshot_bytes": outcome.snapshot_bytes,
        "wire_bytes": outcome.wire_bytes,
        "replay_bytes": outcome.replay_bytes,
        "chain_length": outcome.chain_length,
        "encode_seconds": encode_seconds,
        "hot_load_seconds": outcome.hot_load_seconds,
    }


def summarize(run_id: str, full_every: int | str, records: list[dict[str, Any]]) -> dict[str, Any]:
    """The totals of one policy's run (the baseline included)."""
    worst = max(records, key=lambda r: r["replay_bytes"])
    fulls = [r for r in records if r["type"] == "FULL"]
    reasons: dict[str, int] = {}
    for r in fulls:
        reasons[r["cut_reason"]] = reasons.get(r["cut_reason"], 0) + 1
    return {
        "run_id": run_id,
        "full_every": full_every,
        "full_snapshots": len(fulls),
        "delta_snapshots": sum(r["type"] == "INCREMENTAL" for r in records),
        "full_reasons": reasons,
        "full_bytes": records[0]["snapshot_bytes"],
        "bytes_stored": sum(r["snapshot_bytes"] for r in records),
        "bytes_uploaded": sum(r["wire_bytes"] for r in records),
        "worst_replay_bytes": worst["replay_bytes"],
        "worst_replay_version": worst["version"],
        "encode_seconds": sum(r["encode_seconds"] for r in records),
        "hot_load_seconds": sum(r["hot_load_seconds"] for r in records),
        "versions": records,
    }


def ratios(auto: dict[str, Any], fixed: dict[str, Any]) -> dict[str, float]:
    """``auto / fixed`` of each total (same run, same machine)."""
    keys = ("bytes_stored", "bytes_uploaded", "worst_replay_bytes", "encode_seconds", "hot_load_seconds")
    return {key: auto[key] / fixed[key] if fixed[key] else float("nan") for key in keys}


def same_snapshots(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two runs published the same snapshot type and size at every version."""
    key = [(r["version"], r["type"], r["snapshot_bytes"]) for r in a["versions"]]
    return key == [(r["version"], r["type"], r["snapshot_bytes"]) for r in b["versions"]]


def acceptance(doc: dict[str, Any]) -> dict[str, bool]:
    """Issue 25's checks on a document of :func:`main`."""
    auto, fixed = doc["phased"]["auto"], doc["phased"]["fixed"]
    budget = 1 + doc["settings"]["replay_budget"]
    checks = {
        "auto_replay_within_budget": all(r["replay_bytes"] <= budget * auto["full_bytes"] for r in auto["versions"]),
        "auto_worst_replay_at_most_half_of_fixed": auto["worst_replay_bytes"]
        <= WORST_REPLAY_RATIO * fixed["worst_replay_bytes"],
        "bytes_stored_within_1.3x": auto["bytes_stored"] <= STORED_RATIO * fixed["bytes_stored"],
    }
    if doc.get("sparse"):
        checks["sparse_run_same_snapshots"] = same_snapshots(doc["sparse"]["auto"], doc["sparse"]["fixed"])
    return checks


def _table(name: str, runs: dict[str, dict[str, Any]], ratio: dict[str, float]) -> list[str]:
    rows = [
        f"{name}: policy   FULL/delta  stored KiB  uploaded KiB  worst replay (version, FULLs)  encode s  hot-load s"
    ]
    for label, run in runs.items():
        rows.append(
            f"  {label:<14} {run['full_snapshots']:>3}/{run['delta_snapshots']:<4} {run['bytes_stored'] / 1024:>10.0f}"
            f"  {run['bytes_uploaded'] / 1024:>12.0f}  {run['worst_replay_bytes'] / 1024:>8.0f} KiB "
            f"(v{run['worst_replay_version']}, {run['worst_replay_bytes'] / run['full_bytes']:.2f})"
            f"{'':>8}{run['encode_seconds']:>6.2f}  {run['hot_load_seconds']:>10.2f}"
        )
    rows.append("  auto / fixed: " + ", ".join(f"{key} {value:.2f}" for key, value in ratio.items()))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--versions", type=int, default=100, help="versions after the baseline (100)")
    parser.add_argument("--phases", default=DEFAULT_PHASES, help=f"changed fraction per phase ({DEFAULT_PHASES})")
    parser.add_argument("--ulps", type=int, default=8, help="a changed value moves by 1..ULPS BF16 ulps (8)")
    parser.add_argument("--fixed", type=int, default=20, help="the fixed count compared with auto (20)")
    parser.add_argument("--replicas", type=int, default=1, help="engine replicas (1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-sparse-check", dest="sparse", action="store_false", help="skip the sparse run")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout (tables on stderr)")
    args = parser.parse_args(argv)
    if args.versions < 1 or args.ulps < 1 or not 1 <= args.fixed <= 64:
        parser.error("--versions and --ulps must be >= 1, --fixed in 1..64")
    phases = parse_phases(args.phases, args.versions)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    out = sys.stderr if args.json else sys.stdout
    runs: dict[str, dict[str, dict[str, Any]]] = {}
    plans = {"phased": fractions_of(phases)}
    if args.sparse:
        plans["sparse"] = [phases[0][1]] * args.versions
    started = time.perf_counter()
    with LocalStack(replicas=args.replicas) as stack:
        target = stack.deploy(name="cadence", replicas=args.replicas, seed=args.seed)
        client = InferenceClient(stack.token, base_url=stack.api_url)
        loader = HotLoader(client, target.deployment_id, s3=stack.s3_client(), timeout=120, poll_interval=0.05)
        try:
            for name, fractions in plans.items():
                # run ids of one length: a delta's index names its identities, so equal snapshots have equal sizes
                policies = (("auto", "auto", "auto"), ("fixed", args.fixed, f"f{args.fixed:03d}"))
                runs[name] = {}
                for label, every, tag in policies:
                    run_id = f"{name}-{tag}"
                    runs[name][label] = run_policy(
                        loader, target.deployment_id, run_id, every, fractions, seed=args.seed, ulps=args.ulps
                    )
                print(f"{name} run published ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
        finally:
            client.close()
    doc: dict[str, Any] = {
        "settings": {
            "versions": args.versions,
            "phases": [{"versions": count, "changed_fraction": fraction} for count, fraction in phases],
            "ulps": args.ulps,
            "fixed": args.fixed,
            "replicas": args.replicas,
            "seed": args.seed,
            "full_share": DEFAULT_FULL_SHARE,
            "replay_budget": DEFAULT_REPLAY_BUDGET,
            "model_bytes": sum(t.numel() * t.element_size() for t in init_weights(seed=args.seed).values()),
        },
        "machine": {"cores": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "wall_seconds": time.perf_counter() - started,
    }
    for name, pair in runs.items():
        doc[name] = {**pair, "ratios": ratios(pair["auto"], pair["fixed"])}
        for line in _table(name, {"auto": pair["auto"], f"fixed {args.fixed}": pair["fixed"]}, doc[name]["ratios"]):
            print(line, file=out)
    doc["acceptance"] = acceptance(doc)
    for check, ok in doc["acceptance"].items():
        print(f"{'ok ' if ok else 'NOT'} {check}", file=out)
    if args.json:
        json.dump(doc, sys.stdout, indent=1, sort_keys=True)
        print()
    return 0 if all(doc["acceptance"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
