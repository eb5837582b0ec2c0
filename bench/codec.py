"""Delta encode throughput: cwtrain's codec against a naive baseline and the zstd ceiling.

A BF16 checkpoint of about ``--size`` bytes (default 0.5 GiB; hidden 1024, vocabulary
50,000: 100 MB embedding and LM head, 2-6 MB layer matrices) is generated
with a realistic optimizer step: ``--changed`` (1 %) of the values move by one or two
units in the last place. Then, in one run, on the same bytes:

- **(a) diff**: ``cwtrain.hotload.files.write.write_delta`` of the two directories (page cache warm);
- **(b) memory**: ``DeltaEncoder.encode`` of the in-memory arrays;
- **(c) naive**: read both tensors of each pair from the files into fresh arrays, numpy
  XOR, single-threaded zstd level 1 of changed ones, ``zlib.adler32`` of the new bytes;
- **(d) ceiling**: zstd level 1 alone on the precomputed XOR of every changed tensor,
  one tensor per task on all cores;
- **(e) the rest**: everything (a) does besides compressing (read both files in 1 MiB
  chunks, XOR, Adler-32 of the new bytes), alone, on all cores. On cores that zstd keeps
  busy this work cannot hide behind compression, so ``d / (d + e)`` bounds what ``a/d``
  can reach on this machine; it is printed as ``bound a/d``.

Ratios are throughput ratios (``a/c`` = time(c) / time(a)), from wall time and, as a
check that survives a busy machine, from this process's CPU time; goals: ``a/d`` and
``b/d`` >= 0.85, ``a/c`` and ``b/c`` >= 4 on 2 cores. ``--memory`` also runs, each in a
child process whose peak RSS (``VmHWM``) is read at its exit, on the same checkpoint:
(a) ``diff``; ``apply`` of (a)'s delta to the old checkpoint (``write_applied_snapshot``,
what ``cwtrain snapshot apply`` runs); ``verify`` of the delta against the old checkpoint
(``verify_snapshot_dir``, what ``cwtrain snapshot verify --base`` runs). Each must stay
within the memory budget (``CWTRAIN_HOTLOAD_MEMORY_BUDGET``, default 1 GiB, passed on to
the children) + 1 GiB; the verdict is printed.

``--big SIZE`` measures instead the peak memory of ``cwtrain snapshot diff`` on a checkpoint
of SIZE (issue 20: 16 GiB must stay within ``CWTRAIN_HOTLOAD_MEMORY_BUDGET`` + 1 GiB). The
two checkpoints are sparse safetensors files (holes read as zeros and take no space): 256
MiB tensors plus a 1 GiB embedding (zstd's threaded path); in the new one, ``--big-dense``
tensors are entirely new random bytes (their XOR does not compress, so each frame in
flight is as large as its tensor: the worst case for memory) and every other tensor
changes in its first 64 KiB. The CLI runs in a child process whose peak RSS (``VmHWM``)
is read at exit; ``--budget`` sets the variable. Put ``--dir`` on a tmpfs (``/dev/shm``)
or a disk with room for the dense bytes (twice ``--big-dense`` x 256 MiB).
``--big-apply-verify`` also measures ``snapshot verify --base`` and ``snapshot apply`` (whose
output is written dense: the whole checkpoint, so keep SIZE small on a small disk).

    .venv-3.12/bin/python bench/codec.py --size 64MiB        # quick check
    .venv-3.12/bin/python bench/codec.py                     # the full 0.5 GiB run
    .venv-3.12/bin/python bench/codec.py --big 16GiB --dir /dev/shm --json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import zstandard

from cwtrain.hotload.codec.common import default_workers, memory_budget_from_env
from cwtrain.hotload.codec.encode import DeltaEncoder
from cwtrain.hotload.files.checkpoint import open_checkpoint
from cwtrain.hotload.files.write import write_delta
from cwtrain.hotload.format.checksum import adler32
from cwtrain.hotload.format.index import INDEX_NAME
from cwtrain.hotload.format.safetensors import TensorEntry, encode_header
from cwtrain.hotload.format.tensors import FileRegion, TensorData

CHUNK = 1 << 20

UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 1000, "mb": 10**6, "gb": 10**9}


def parse_size(text: str) -> int:
    """``512MiB`` -> bytes."""
    lowered = text.strip().lower()
    digits = lowered.rstrip("abcdefghijklmnopqrstuvwxyz")
    return int(float(digits) * UNITS[lowered[len(digits) :]])


def shapes(size: int) -> dict[str, tuple[int, ...]]:
    """Tensor shapes of a decoder-only model of about ``size`` BF16 bytes."""
    hidden, vocab, inter = (1024, 50_000, 2816) if size >= 256 << 20 else (256, 8_000, 704)
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden), "lm_head.weight": (vocab, hidden)}
    per_layer = 2 * (4 * hidden * hidden + 3 * hidden * inter + 2 * hidden)
    layers = max(1, (size - 2 * 2 * vocab * hidden) // per_layer)
    for i in range(layers):
        p = f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out[p + f"self_attn.{name}.weight"] = (hidden, hidden)
        out[p + "mlp.gate_proj.weight"] = (inter, hidden)
        out[p + "mlp.up_proj.weight"] = (inter, hidden)
        out[p + "mlp.down_proj.weight"] = (hidden, inter)
        out[p + "input_layernorm.weight"] = (hidden,)
        out[p + "post_attention_layernorm.weight"] = (hidden,)
    out["model.norm.weight"] = (hidden,)
    return out


def generate(size: int, changed: float, seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Old and new BF16 weights (as uint16 arrays): ``changed`` of the values move by 1-2 ulp."""
    rng = np.random.default_rng(seed)
    old: dict[str, np.ndarray] = {}
    new: dict[str, np.ndarray] = {}
    for name, shape in shapes(size).items():
        count = int(np.prod(shape))
        values = (rng.standard_normal(count, dtype=np.float32) * 0.02).view(np.uint32)
        bf16 = (values >> 16).astype(np.uint16)
        moved = bf16.copy()
        picks = rng.choice(count, size=max(1, int(count * changed)), replace=False)
        moved[picks] += rng.choice(np.array([1, 2, 65535, 65534], np.uint16), size=picks.size)
        old[name], new[name] = bf16, moved
    return old, new


def save(root: Path, tensors: dict[str, np.ndarray], shard_bytes: int = 256 << 20) -> None:
    """A sharded BF16 checkpoint written with cwtrain's header writer."""
    root.mkdir(parents=True)
    groups: list[list[str]] = [[]]
    size = 0
    for name in tensors:
        if groups[-1] and size + tensors[name].nbytes > shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += tensors[name].nbytes
    weight_map = {}
    for i, names in enumerate(groups):
        shard = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        entries, offset = [], 0
        for name in names:
            entries.append(TensorEntry(name, "BF16", tuple(tensors[name].shape), offset, offset + tensors[name].nbytes))
            offset += tensors[name].nbytes
        with open(root / shard, "wb") as out:
            out.write(encode_header(entries, {"format": "pt"}))
            for name in names:
                out.write(memoryview(tensors[name]))
        weight_map.update(dict.fromkeys(names, shard))
    total = sum(t.nbytes for t in tensors.values())
    (root / INDEX_NAME).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    (root / "config.json").write_text("{}")


def best(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Best wall time and best CPU time (this process, all threads) of ``repeat`` runs."""
    walls, cpus = [], []
    for _ in range(repeat):
        start, cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return min(walls), min(cpus)


def naive(base: Path, new: Path) -> int:
    """(c): fresh reads, numpy XOR, single-threaded zstd level 1, zlib Adler-32."""
    compressor = zstandard.ZstdCompressor(level=1, write_content_size=True, write_checksum=False)
    payload = 0
    with open_checkpoint(base) as old_ckpt, open_checkpoint(new) as new_ckpt:
        for name, tensor in new_ckpt.tensors.items():
            a_region, b_region = tensor.data, old_ckpt.tensors[name].data
            a = np.fromfile(
                new_ckpt.path / new_ckpt.index["weight_map"][name],
                np.uint8,
                count=a_region.nbytes,
                offset=a_region.offset,
            )  # type: ignore[union-attr]
            b = np.fromfile(
                old_ckpt.path / old_ckpt.index["weight_map"][name],
                np.uint8,
                count=b_region.nbytes,
                offset=b_region.offset,
            )  # type: ignore[union-attr]
            xor = np.bitwise_xor(a, b)
            zlib.adler32(a)
            if xor.any():
                payload += len(compressor.compress(xor))
    return payload


def ceiling(xors: list[np.ndarray], workers: int) -> int:
    """(d): zstd level 1 alone on the XOR bytes, one tensor per task, all cores."""

    def one(x: np.ndarray) -> int:
        return len(zstandard.ZstdCompressor(level=1, write_content_size=True, write_checksum=False).compress(x))

    with ThreadPoolExecutor(workers) as pool:
        return sum(pool.map(one, xors))


def rest(base: Path, new: Path, workers: int) -> int:
    """(e): read both tensors of each pair in 1 MiB chunks, XOR, Adler-32 of the new bytes; no zstd."""
    local = threading.local()
    with open_checkpoint(base) as old_ckpt, open_checkpoint(new) as new_ckpt:

        def one(name: str) -> int:
            if not hasattr(local, "a"):
                local.a, local.b = np.empty(CHUNK, np.uint8), np.empty(CHUNK, np.uint8)
            a_region = new_ckpt.tensors[name].data
            b_region = old_ckpt.tensors[name].data
            assert isinstance(a_region, FileRegion) and isinstance(b_region, FileRegion)
            value = 1
            for offset in range(0, a_region.nbytes, CHUNK):
                length = min(CHUNK, a_region.nbytes - offset)
                a, b = local.a[:length], local.b[:length]
                os.preadv(a_region.fd, [a], a_region.offset + offset)
                os.preadv(b_region.fd, [b], b_region.offset + offset)
                value = adler32(a, value)
                np.bitwise_xor(a, b, out=b)
            return value

        with ThreadPoolExecutor(workers) as pool:
            return len(list(pool.map(one, sorted(new_ckpt.tensors))))


_PEAK = "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')][0])"


def _peak_rss(code: str, *args: str) -> int:
    """Peak RSS (bytes) of a child process running ``code`` with ``args`` (its VmHWM, read at exit)."""
    done = subprocess.run([sys.executable, "-c", f"{code}; {_PEAK}", *args], check=True, capture_output=True, text=True)
    return int(done.stdout.split()[-1]) * 1024


def child_peak_rss(base: Path, new: Path, out: Path, workers: int) -> int:
    """Peak RSS (bytes) of a child process that only runs write_delta (its VmHWM, read at exit)."""
    code = (
        "import sys; from cwtrain.hotload.files.write import write_delta; "
        "write_delta(sys.argv[1], sys.argv[2], sys.argv[3], version='2', base_version='1', workers=int(sys.argv[4]))"
    )
    return _peak_rss(code, str(base), str(new), str(out), str(workers))


def child_peak_rss_apply(base: Path, delta: Path, out: Path, workers: int) -> int:
    """Peak RSS (bytes) of a child that applies ``delta`` to ``base`` into ``out`` (``snapshot apply``)."""
    code = (
        "import sys; from cwtrain.hotload.files.write import write_applied_snapshot; "
        "write_applied_snapshot(sys.argv[1], sys.argv[2], sys.argv[3], workers=int(sys.argv[4]))"
    )
    return _peak_rss(code, str(base), str(delta), str(out), str(workers))


def child_peak_rss_verify(base: Path, delta: Path, workers: int) -> int:
    """Peak RSS (bytes) of a child that verifies ``delta`` against ``base`` (``snapshot verify --base``)."""
    code = (
        "import sys; from cwtrain.hotload.codec.decode import verify_snapshot_dir; "
        "r = verify_snapshot_dir(sys.argv[2], base=sys.argv[1], workers=int(sys.argv[3])); assert r.verified == r.tensors"
    )
    return _peak_rss(code, str(base), str(delta), str(workers))


BIG_TENSOR = 256 << 20
BIG_EMBEDDING = 1 << 30
BIG_TOUCH = 64 << 10


def save_sparse(path: Path, sizes: dict[str, int], dense: dict[str, np.ndarray]) -> None:
    """One U8 safetensors file of ``sizes``: holes, except the ``dense`` bytes at each tensor's start."""
    entries, offset = [], 0
    for name, size in sizes.items():
        entries.append(TensorEntry(name, "U8", (size,), offset, offset + size))
        offset += size
    header = encode_header(entries, {"format": "pt"})
    with open(path, "wb") as out:
        out.write(header)
        for entry in entries:
            if entry.name in dense:
                out.seek(len(header) + entry.begin)
                out.write(memoryview(dense[entry.name]))
        out.truncate(len(header) + offset)


def write_sparse_pair(root: Path, size: int, dense_tensors: int, seed: int) -> tuple[int, int]:
    """Checkpoints ``root/old`` and ``root/new`` of ``size`` bytes; returns (tensors, dense bytes written)."""
    rng = np.random.default_rng(seed)
    sizes = {"model.embed_tokens.weight": BIG_EMBEDDING}
    for i in range(max(1, (size - BIG_EMBEDDING) // BIG_TENSOR)):
        sizes[f"model.layers.{i}.weight"] = BIG_TENSOR
    names = list(sizes)
    dense: dict[str, np.ndarray] = {}
    for i, name in enumerate(names):
        whole = 0 < i <= dense_tensors
        dense[name] = rng.integers(0, 256, sizes[name] if whole else BIG_TOUCH, dtype=np.uint8)
    for side, content in (("old", {}), ("new", dense)):
        (root / side).mkdir(parents=True)
        save_sparse(root / side / "model.safetensors", sizes, content)
        (root / side / "config.json").write_text("{}")
    return len(sizes), sum(a.nbytes for a in dense.values())


def cli_peak_rss(argv: list[str], env: dict[str, str]) -> tuple[int, float, str]:
    """(peak RSS in bytes, wall seconds, its stdout before the RSS) of ``cwtrain <argv>`` in a child process."""
    code = (
        "import sys; from cwtrain.cli import main; code = main(sys.argv[1:]); "
        "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]); sys.exit(code)"
    )
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"cwtrain {' '.join(argv)} failed:\n{done.stderr[-2000:]}")
    lines = done.stdout.strip().splitlines()
    return int(lines[-1]) * 1024, wall, "\n".join(lines[:-1])


def big_diff(args: argparse.Namespace) -> int:
    """``--big``: peak RSS of ``cwtrain snapshot diff`` on a sparse checkpoint of ``--big`` bytes."""
    budget = args.budget
    scratch = Path(tempfile.mkdtemp(prefix="cwtrain-bench-big-", dir=args.dir))
    try:
        tensors, dense = write_sparse_pair(scratch, args.big, args.big_dense, args.seed)
        env = {**os.environ, "CWTRAIN_HOTLOAD_MEMORY_BUDGET": str(budget)}
        argv = ["snapshot", "diff", str(scratch / "old"), str(scratch / "new"), "--out", str(scratch / "delta")]
        argv += ["--version", "2", "--base-version", "1", "--workers", str(args.workers)]
        peak, wall, answer = cli_peak_rss(argv, env)
        summary = json.loads(answer) if answer.lstrip().startswith("{") else {}
        others: dict[str, dict[str, float]] = {}
        if args.big_apply_verify:  # the same delta through `snapshot verify --base` and `snapshot apply`
            for name, command in (
                ("verify", ["snapshot", "verify", str(scratch / "delta"), "--base", str(scratch / "old")]),
                (
                    "apply",
                    [
                        "snapshot",
                        "apply",
                        str(scratch / "old"),
                        str(scratch / "delta"),
                        "--out",
                        str(scratch / "applied"),
                        "--base-version",
                        "1",
                    ],
                ),
            ):
                other_peak, other_wall, _ = cli_peak_rss(command, env)
                others[name] = {"seconds": other_wall, "peak_rss_bytes": other_peak}
        result = {
            "checkpoint_bytes": args.big,
            "tensors": tensors,
            "dense_bytes_in_new": dense,
            "memory_budget": budget,
            "workers": args.workers,
            "load_average": os.getloadavg()[0],
            "diff_seconds": wall,
            "diff_gb_per_s": args.big / wall / 1e9,
            "payload_bytes": summary.get("payload_bytes"),
            "peak_rss_bytes": peak,
            "limit_bytes": budget + (1 << 30),
            "within_limit": peak <= budget + (1 << 30),
            "others": others,
        }
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"snapshot diff of a {args.big / 2**30:.0f} GiB checkpoint ({tensors} tensors, {dense / 2**20:.0f} MiB of "
            f"new dense bytes), budget {budget / 2**20:.0f} MiB, {args.workers} workers: {wall:.1f} s, "
            f"peak RSS {peak / 2**20:.0f} MiB (limit budget + 1 GiB = {result['limit_bytes'] / 2**20:.0f} MiB: "
            f"{'pass' if result['within_limit'] else 'FAIL'})"
        )
        for name, figures in others.items():
            print(f"snapshot {name}: {figures['seconds']:.1f} s, peak RSS {figures['peak_rss_bytes'] / 2**20:.0f} MiB")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=parse_size, default=512 << 20, help="checkpoint size (default 512MiB)")
    parser.add_argument("--changed", type=float, default=0.01, help="fraction of values changed (0.01)")
    parser.add_argument("--workers", type=int, default=default_workers(), help="threads (default: CPUs)")
    parser.add_argument("--repeat", type=int, default=2, help="runs per measurement, best kept (2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--memory", action="store_true", help="also measure (a)'s peak RSS in a child process")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--big", type=parse_size, default=None, help="peak RSS of `snapshot diff` at this size")
    parser.add_argument("--big-dense", type=int, default=4, help="--big: tensors of new random bytes (4)")
    parser.add_argument("--budget", type=parse_size, default=1 << 30, help="--big: the memory budget (1GiB)")
    parser.add_argument(
        "--big-apply-verify", action="store_true", help="--big: also `snapshot verify --base` and `snapshot apply`"
    )
    args = parser.parse_args(argv)
    if args.big is not None:
        return big_diff(args)

    scratch = Path(tempfile.mkdtemp(prefix="cwtrain-bench-codec-", dir=args.dir))
    try:
        old, new = generate(args.size, args.changed, args.seed)
        total = sum(t.nbytes for t in new.values())
        save(scratch / "old", old)
        save(scratch / "new", new)
        old_td = {n: TensorData("BF16", a.shape, a) for n, a in old.items()}
        new_td = {n: TensorData("BF16", a.shape, a) for n, a in new.items()}
        xors = [
            np.bitwise_xor(new[n], old[n]).view(np.uint8) for n in sorted(new) if not np.array_equal(new[n], old[n])
        ]

        runs = 0

        def diff() -> None:
            nonlocal runs
            runs += 1
            write_delta(
                scratch / "old",
                scratch / "new",
                scratch / f"delta{runs}",
                version="2",
                base_version="1",
                workers=args.workers,
            )

        naive(scratch / "old", scratch / "new")  # warm the page cache
        with DeltaEncoder(workers=args.workers) as encoder:
            encoder.encode(new_td, old_td)  # warm buffers and threads
            t_b, cpu_b = best(lambda: encoder.encode(new_td, old_td), args.repeat)
            payload = encoder.encode(new_td, old_td).stats.payload_bytes
        t_a, cpu_a = best(diff, args.repeat)
        t_c, cpu_c = best(lambda: naive(scratch / "old", scratch / "new"), args.repeat)
        t_d, cpu_d = best(lambda: ceiling(xors, args.workers), args.repeat)
        t_e, cpu_e = best(lambda: rest(scratch / "old", scratch / "new", args.workers), args.repeat)
        peaks: dict[str, int] = {}
        if args.memory:
            peaks["diff"] = child_peak_rss(scratch / "old", scratch / "new", scratch / "delta-mem", args.workers)
            peaks["apply"] = child_peak_rss_apply(
                scratch / "old", scratch / "delta-mem", scratch / "applied", args.workers
            )
            peaks["verify"] = child_peak_rss_verify(scratch / "old", scratch / "delta-mem", args.workers)
        budget = memory_budget_from_env()

        wall = {"a": t_a, "b": t_b, "c": t_c, "d": t_d, "e": t_e}
        cpu = {"a": cpu_a, "b": cpu_b, "c": cpu_c, "d": cpu_d, "e": cpu_e}
        pairs = (("a", "c"), ("b", "c"), ("a", "d"), ("b", "d"))
        result = {
            "checkpoint_bytes": total,
            "tensors": len(new),
            "changed_fraction": args.changed,
            "workers": args.workers,
            "load_average": os.getloadavg()[0],
            "seconds": wall,
            "cpu_seconds": cpu,
            "gb_per_s": {k: total / t / 1e9 for k, t in wall.items()},
            "ratios": {f"{x}/{y}": wall[y] / wall[x] for x, y in pairs},
            "cpu_ratios": {f"{x}/{y}": cpu[y] / cpu[x] for x, y in pairs},
            "bound_a/d": t_d / (t_d + t_e),
            "cpu_bound_a/d": cpu_d / (cpu_d + cpu_e),
            "delta_percent_of_full": 100.0 * payload / total,
            "peak_rss_bytes_a": peaks.get("diff"),
            "peak_rss_bytes": peaks or None,
            "memory_budget": budget,
            "memory_limit_bytes": budget + (1 << 30),
            "within_memory_limit": all(peak <= budget + (1 << 30) for peak in peaks.values()) if peaks else None,
        }
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            print(
                f"checkpoint {total / 2**20:.0f} MiB BF16, {len(new)} tensors, {args.changed:.1%} of values changed, "
                f"{args.workers} workers, load average {result['load_average']:.1f}"
            )
            print(f"{'run':<28}{'seconds':>10}{'GB/s':>8}{'CPU s':>10}")
            labels = {
                "a": "(a) diff of directories",
                "b": "(b) encode from memory",
                "c": "(c) naive baseline",
                "d": "(d) zstd ceiling",
                "e": "(e) (a) without zstd",
            }
            for key, label in labels.items():
                print(f"{label:<28}{wall[key]:>10.3f}{total / wall[key] / 1e9:>8.2f}{cpu[key]:>10.3f}")
            print(f"{'ratio (throughput)':<28}{'wall':>10}{'CPU':>8}")
            for name in result["ratios"]:
                print(f"{name:<28}{result['ratios'][name]:>10.2f}{result['cpu_ratios'][name]:>8.2f}")
            print(f"{'bound a/d = d / (d + e)':<28}{result['bound_a/d']:>10.2f}{result['cpu_bound_a/d']:>8.2f}")
            print(f"delta size {result['delta_percent_of_full']:.2f} % of full")
            if peaks:
                shown = ", ".join(f"{name} {peak / 2**20:.0f} MiB" for name, peak in peaks.items())
                verdict = "pass" if result["within_memory_limit"] else "FAIL"
                print(
                    f"peak RSS: {shown} (limit: budget {budget / 2**20:.0f} MiB + 1 GiB = "
                    f"{result['memory_limit_bytes'] / 2**20:.0f} MiB: {verdict})"
                )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
