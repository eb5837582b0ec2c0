"""Publishing from in-memory tensors, stage by stage: where the time goes, what overlaps, what it costs.

For each ``--sizes`` entry, a child process builds a BF16 model of that size from torch CPU
tensors (the shapes of ``bench/codec.py``: hidden 1024, vocabulary 50,000, 2-6 MB layer
matrices) and a realistic optimizer step (``--changed``, 1 %, of the values move by one or
two units in the last place), then publishes the delta with
:meth:`cwtrain.hotload.store.prefix.SnapshotStore.upload_tensors` (what ``HotLoader.publish`` runs
for tensors) to moto's S3 server on loopback, through :func:`cwtrain.infra.s3_client`: the
real encoder, the real upload path; ``--repeat`` times (2), keeping the fastest, since on a
shared machine one publish may meet other work. Stages are timed where they run, inside
each publish (:class:`cwtrain.hotload.codec.stages.StageStats`; each S3 request is timed from
botocore's ``before-call``/``after-call`` events): ``gather``, ``read``, ``xor`` (XOR +
change detection), ``adler``, ``zstd``, ``sha256``, ``upload`` (PutObject/UploadPart) and
``requests`` (every other S3 call).

Printed per size: each stage's throughput per core (bytes / CPU s), CPU seconds per
published GB (GB = 10^9 bytes of model), its time alone on this machine (CPU s / cores
available; for ``upload``, the time the link carried data), then

- **overlap** = wall time / the slowest stage's time alone (issue goal <= 1.2);
- **floor ratio** = wall time / max(every CPU stage together / cores, link busy time): how
  close the pipeline sits to what this machine's cores and link allow;
- **phases**: the encode (first gather to last compressed chunk) and the tail after it
  (SHA-256 and upload of the shards, which the format lets start only then; see
  ``SnapshotStore.upload_tensors``);
- **memory**: the child's peak RSS during a publish above the RSS it had when that publish
  began (the kernel's high-water mark is reset before each publish; the first starts from
  the tensors alone), the largest over the publishes.

Cores available = encoder threads x the share of their runnable time this process's threads
actually ran during the publish (the kernel's per-thread schedstat: CPU time and time
waiting on a run queue), so a machine busy with other work shows as fewer cores rather than
as a slower code path, while time a thread slept (a stall in the pipeline) is not excused. Tensors larger than ``--pool`` (default 1 GiB) of distinct values
are views into that pool at staggered offsets (same bytes per value, same compression),
so an 8 GiB model fits beside other work; RSS figures are above the pool.

    .venv-3.12/bin/python bench/pipeline.py --sizes 64MiB              # quick check
    .venv-3.12/bin/python bench/pipeline.py --sizes 512MiB,2GiB,8GiB --json > run.json
    .venv-3.12/bin/python scripts/performance_doc.py run.json          # docs/performance.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # when loaded by path, as the tests do
from codec import parse_size, shapes  # bench/codec.py: one model layout for both benches

MIB = 1 << 20
GB = 1e9
BUCKET = "bench-pipeline"
#: The stages of the encode, in pipeline order; the tail follows.
ENCODE_STAGES = ("gather", "read", "xor", "adler", "zstd")
TAIL_STAGES = ("sha256", "upload")
CPU_STAGES = (*ENCODE_STAGES, "sha256")
#: Issue 20's goal for wall time / slowest stage.
OVERLAP_GOAL = 1.2


def make_pool(values: int, changed: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``values`` BF16 weights (as uint16) ~ N(0, 0.02), and a step where ``changed`` of them move 1-2 ulp."""
    rng = np.random.default_rng(seed)
    old = np.empty(values, np.uint16)
    step = 32 * MIB
    for start in range(0, values, step):
        count = min(step, values - start)
        draw = rng.standard_normal(count, dtype=np.float32) * np.float32(0.02)
        old[start : start + count] = draw.view(np.uint32) >> 16
    new = old.copy()
    picks = rng.integers(0, values, size=max(1, int(values * changed)))
    new[picks] += rng.choice(np.array([1, 2, 65535, 65534], np.uint16), size=picks.size)
    return old, new


def build_model(size: int, pool_bytes: int, changed: float, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(served, new) torch BF16 tensors of a ``size``-byte model; views into one pool of distinct values."""
    import torch

    layout = shapes(size)
    largest = max(int(np.prod(s)) for s in layout.values())
    total = sum(int(np.prod(s)) for s in layout.values())
    values = min(total, max(pool_bytes // 2, largest))
    old_pool, new_pool = make_pool(values, changed, seed)
    old_t = torch.from_numpy(old_pool).view(torch.bfloat16)
    new_t = torch.from_numpy(new_pool).view(torch.bfloat16)
    served: dict[str, Any] = {}
    new: dict[str, Any] = {}
    offset = 0
    for name, shape in layout.items():
        count = int(np.prod(shape))
        if offset + count > values:
            offset = (offset + 4099) % max(1, values - count + 1) if values > count else 0
        served[name] = old_t[offset : offset + count].view(shape)
        new[name] = new_t[offset : offset + count].view(shape)
        offset += count
    return served, new


# ---------------------------------------------------------------------------- measuring


@contextmanager
def timed_requests(s3: Any, stats: Any) -> Iterator[None]:
    """Time every S3 request of ``s3`` into ``stats``: ``upload`` (PutObject, UploadPart) or ``requests``."""

    def before(model: Any, params: Any, context: Any, **_: Any) -> None:
        body = params.get("body") if isinstance(params, dict) else None
        try:
            size = len(body) if body is not None and model.name in ("PutObject", "UploadPart") else 0
        except TypeError:
            size = 0
        context["cwtrain_bench"] = (stats.clock(), size)

    def after(model: Any, context: Any, **_: Any) -> None:
        started = context.pop("cwtrain_bench", None)
        if started is not None:
            mark, size = started
            stage = "upload" if model.name in ("PutObject", "UploadPart") else "requests"
            stats.lap(stage, size, mark)

    events = s3.meta.events
    events.register("before-call.s3", before, unique_id="cwtrain-bench-before")
    events.register("after-call.s3", after, unique_id="cwtrain-bench-after")
    events.register("after-call-error.s3", after, unique_id="cwtrain-bench-error")
    try:
        yield
    finally:
        events.unregister("before-call.s3", unique_id="cwtrain-bench-before")
        events.unregister("after-call.s3", unique_id="cwtrain-bench-after")
        events.unregister("after-call-error.s3", unique_id="cwtrain-bench-error")


class RunQueue:
    """How much of the time this process's threads were runnable they actually ran (kernel schedstat).

    Every ``interval`` seconds each thread's ``/proc/self/task/<tid>/schedstat`` (CPU time,
    time waiting on a run queue) is read; threads that end between samples lose at most one
    interval. ``share`` = CPU / (CPU + wait) over every thread but the sampler: 1.0 on an
    idle machine, lower when other processes hold the cores. Unlike CPU / wall time, it
    does not count time a thread slept (waiting on I/O, a lock or a queue), so a pipeline
    stall is not mistaken for a busy machine.
    """

    def __init__(self, interval: float = 0.02) -> None:
        self.interval = interval
        self._first: dict[int, tuple[int, int]] = {}
        self._last: dict[int, tuple[int, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-runqueue", daemon=True)
        self._own = -1

    @staticmethod
    def _read() -> dict[int, tuple[int, int]]:
        out = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as handle:
                    cpu, wait, _ = handle.read().split()
                out[int(tid)] = (int(cpu), int(wait))
            except (OSError, ValueError):
                continue
        return out

    def _sample(self) -> None:
        for tid, value in self._read().items():
            if tid != self._own:
                self._first.setdefault(tid, (0, 0) if self._last else value)
                self._last[tid] = value

    def _run(self) -> None:
        self._own = threading.get_native_id()
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> RunQueue:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def totals(self) -> tuple[float, float]:
        """(CPU seconds, run-queue wait seconds) of every thread while sampling."""
        cpu = sum(self._last[t][0] - self._first[t][0] for t in self._last) / 1e9
        wait = sum(self._last[t][1] - self._first[t][1] for t in self._last) / 1e9
        return cpu, wait


def _proc_status(field: str) -> int:
    """A ``/proc/self/status`` memory field in bytes (0 where there is none)."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (``clear_refs`` 5); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def derive(run: dict[str, Any]) -> dict[str, Any]:
    """Per-stage rates and the overlap figures of one run (pure arithmetic on the measured numbers)."""
    stages = run["stages"]
    cores = max(run["cores_available"], 1e-9)
    model_gb = run["model_bytes"] / GB
    out: dict[str, Any] = {}
    alone: dict[str, float] = {}
    for name, s in stages.items():
        rate = s["bytes"] / s["cpu_seconds"] / GB if s["cpu_seconds"] > 0 else None
        if name == "upload":
            alone[name] = max(s["busy_seconds"], s["cpu_seconds"] / cores)
        elif name in CPU_STAGES:
            threads = run["encoder_workers"] if name in ENCODE_STAGES else max(1, run["shards"])
            alone[name] = s["cpu_seconds"] / min(cores, threads)
        out[name] = {
            "gb_per_s_per_core": rate,
            "cpu_s_per_gb": s["cpu_seconds"] / model_gb,
            "alone_s": alone.get(name),
        }
    slowest = max(alone, key=lambda k: alone[k]) if alone else None
    cpu_all = sum(stages[k]["cpu_seconds"] for k in stages if k in (*CPU_STAGES, "upload", "requests"))
    link = stages.get("upload", {}).get("busy_seconds", 0.0)
    floor = max(cpu_all / cores, link, max(alone.values(), default=0.0))
    return {
        "stages": out,
        "slowest_stage": slowest,
        "overlap": run["wall_s"] / alone[slowest] if slowest else None,
        "overlap_goal": OVERLAP_GOAL,
        "overlap_pass": bool(slowest and run["wall_s"] / alone[slowest] <= OVERLAP_GOAL),
        "floor_s": floor,
        "floor_ratio": run["wall_s"] / floor if floor else None,
        "cpu_s_per_gb_total": run["cpu_s"] / model_gb,
    }


def publish_once(size: int, args: argparse.Namespace) -> dict[str, Any]:
    """The child's work: build the model, publish it ``--repeat`` times as a delta, keep the fastest (JSON)."""
    import torch

    from cwtrain.hotload.store.prefix import SnapshotStore
    from cwtrain.infra.s3 import s3_client

    torch.set_num_threads(1)
    served, new = build_model(size, args.pool, args.changed, args.seed)
    store = SnapshotStore(s3_client(), BUCKET, "bench")
    # warm-up (not counted): imports, thread pools, connections
    warm = sorted(new)[-3:]
    store.upload_tensors(
        {n: new[n] for n in warm}, f"warm-{size}", previous_identity="base", base={n: served[n] for n in warm}
    )
    rss_inputs = _proc_status("VmRSS")
    runs = []
    for i in range(args.repeat):
        rss_start = _proc_status("VmRSS")
        reset = _reset_peak_rss()
        runs.append(measure_publish(store, new, served, f"step-{size}-{i}", args))
        peak = _proc_status("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        runs[-1]["peak_above_start_bytes"] = max(0, peak - rss_start) if reset else None
        runs[-1]["peak_rss_bytes"] = peak
    run = min(runs, key=lambda r: float(r["wall_s"]))
    peaks = [r["peak_above_start_bytes"] for r in runs if r["peak_above_start_bytes"] is not None]
    run.update(
        {
            "walls_s": [r["wall_s"] for r in runs],
            "rss_inputs_bytes": rss_inputs,
            # each publish's peak above the RSS it started from (memory the allocator kept from an
            # earlier publish is not counted twice); the largest of them
            "peak_above_inputs_bytes": max(peaks) if peaks else None,
        }
    )
    run["derived"] = derive(run)
    return run


def measure_publish(
    store: Any, new: dict[str, Any], served: dict[str, Any], identity: str, args: Any
) -> dict[str, Any]:
    """One publish of ``new`` as a delta on ``served``, every stage timed where it runs."""
    from cwtrain.hotload.codec.stages import StageStats

    stats = StageStats()
    model_bytes = sum(t.numel() * t.element_size() for t in new.values())
    load_before = os.getloadavg()[0]
    cpu0, wall0 = _cpu(), time.perf_counter()
    with timed_requests(store.s3.client, stats), RunQueue() as runqueue:  # the boto3 client's events
        store.upload_tensors(
            new, identity, previous_identity="base", base=served, workers=args.upload_workers, stats=stats
        )
        end = time.perf_counter()
    wall, cpu = end - wall0, _cpu() - cpu0
    ran, waited = runqueue.totals()
    share = ran / (ran + waited) if ran + waited > 0 else 1.0
    load_after = os.getloadavg()[0]
    objects = {item.key.rsplit("/", 1)[1]: item.size for item in store.s3.list_objects(BUCKET, f"bench/{identity}/")}
    shard_bytes = sum(v for k, v in objects.items() if k.endswith(".safetensors"))
    figures = stats.as_dict()
    encode_end = max((figures[k]["last"] for k in ENCODE_STAGES if k in figures), default=wall0)
    return {
        "model_bytes": model_bytes,
        "tensors": len(new),
        "changed_fraction": args.changed,
        "payload_bytes": shard_bytes,
        "payload_ratio": shard_bytes / model_bytes,
        "shards": sum(1 for k in objects if k.endswith(".safetensors")),
        "objects": len(objects),
        "wall_s": wall,
        "cpu_s": cpu,
        "encoder_workers": args.workers,
        "upload_workers": args.upload_workers,
        "cores_nominal": os.cpu_count(),
        # the encoder's threads, times the share of their runnable time they ran
        "cores_available": min(args.workers, os.cpu_count() or 1) * share,
        "run_queue": {"cpu_s": ran, "wait_s": waited, "share": share},
        "load_average_before_after": [load_before, load_after],
        "phases": {
            "encode_s": encode_end - wall0,
            "tail_s": end - encode_end,
            # what the tail is made of: the serial SHA-256 of the shards, data on the link, other requests
            "tail_sha256_s": stats.busy_between("sha256", encode_end, end),
            "tail_upload_s": stats.busy_between("upload", encode_end, end),
            "tail_requests_s": stats.busy_between("requests", encode_end, end),
            "requests_during_encode_s": stats.busy_between("requests", wall0, encode_end),
        },
        "stages": {
            k: {f: v for f, v in s.items() if f not in ("first", "last")}
            | {"start_s": s["first"] - wall0, "end_s": s["last"] - wall0}
            for k, s in figures.items()
        },
    }


# ---------------------------------------------------------------------------- parent


def run_child(size: int, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    """One size in a fresh process (its own peak RSS); returns its JSON."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        str(size),
        "--changed",
        str(args.changed),
        "--workers",
        str(args.workers),
        "--upload-workers",
        str(args.upload_workers),
        "--pool",
        str(args.pool),
        "--seed",
        str(args.seed),
        "--repeat",
        str(args.repeat),
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the {size}-byte run failed:\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    model = ""
    try:
        with open("/proc/cpuinfo") as handle:
            model = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), "")
    except OSError:
        pass
    memory = 0
    try:
        with open("/proc/meminfo") as handle:
            memory = int(next(line.split()[1] for line in handle if line.startswith("MemTotal"))) * 1024
    except (OSError, StopIteration):
        pass
    try:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        gpu = None
    return {
        "cpu": model,
        "cores": len(os.sched_getaffinity(0)),
        "memory_bytes": memory,
        "gpu": gpu,
        "python": platform.python_version(),
        "s3": "moto server on 127.0.0.1 (one process)",
    }


def print_table(runs: list[dict[str, Any]]) -> None:
    for run in runs:
        d = run["derived"]
        print(
            f"\nmodel {run['model_bytes'] / 2**30:.2f} GiB BF16, {run['tensors']} tensors, "
            f"{run['changed_fraction']:.1%} of values changed -> delta {run['payload_ratio']:.2%} "
            f"({run['shards']} shard); cores available {run['cores_available']:.2f} of {run['cores_nominal']}, "
            f"load {run['load_average_before_after'][0]:.1f}"
        )
        print(f"{'stage':<10}{'GB/s/core':>11}{'CPU s/GB':>10}{'alone s':>9}{'busy s':>8}")
        for name, s in run["stages"].items():
            rate = d["stages"][name]["gb_per_s_per_core"]
            alone = d["stages"][name]["alone_s"]
            print(
                f"{name:<10}{(f'{rate:.2f}' if rate else '-'):>11}{d['stages'][name]['cpu_s_per_gb']:>10.3f}"
                f"{(f'{alone:.3f}' if alone is not None else '-'):>9}{s['busy_seconds']:>8.3f}"
            )
        peak = run["peak_above_inputs_bytes"]
        print(
            f"wall {run['wall_s']:.3f} s (encode {run['phases']['encode_s']:.3f} + tail {run['phases']['tail_s']:.3f}), "
            f"CPU {d['cpu_s_per_gb_total']:.3f} s/GB, {run['model_bytes'] / run['wall_s'] / GB:.2f} GB/s of model; "
            f"overlap {d['overlap']:.2f} (slowest: {d['slowest_stage']}; goal <= {OVERLAP_GOAL}: "
            f"{'pass' if d['overlap_pass'] else 'FAIL'}); floor ratio {d['floor_ratio']:.2f}; "
            f"peak RSS above inputs {peak / 2**20 if peak is not None else float('nan'):.0f} MiB"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="512MiB,2GiB,8GiB", help="model sizes (512MiB,2GiB,8GiB)")
    parser.add_argument("--changed", type=float, default=0.01, help="fraction of values changed (0.01)")
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)), help="encoder threads (CPUs)")
    parser.add_argument("--upload-workers", type=int, default=8, help="objects and parts in flight (8)")
    parser.add_argument("--pool", type=parse_size, default=1 << 30, help="distinct weight bytes (1GiB)")
    parser.add_argument("--repeat", type=int, default=2, help="publishes per size, the fastest kept (2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child is not None:
        print(json.dumps(publish_once(args.child, args)))
        return 0

    from cwtrain.local.harness.objectstore import DEFAULT_REGION, MotoS3Server

    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    runs = []
    with MotoS3Server() as server:
        env = {**os.environ, **server.credentials}
        env.pop("AWS_PROFILE", None)
        client = server.client()
        for size in sizes:
            server.reset()
            client.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": DEFAULT_REGION})
            runs.append(run_child(size, args, env))
        server.reset()
    document = {
        "bench": "pipeline",
        "machine": machine(),
        "settings": {
            "changed_fraction": args.changed,
            "encoder_workers": args.workers,
            "upload_workers": args.upload_workers,
            "pool_bytes": args.pool,
            "repeat": args.repeat,
        },
        "runs": runs,
    }
    if args.json:
        print(json.dumps(document, indent=1))
    else:
        print(f"machine: {document['machine']}")
        print_table(runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
