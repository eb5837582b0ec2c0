"""The device path of the torch encoder, in GB/s of input: XOR + change detection, Adler-32, host copy.

Measures, on one flat ``uint8`` tensor pair of ``--size`` bytes on the device (CUDA when
there is one, else CPU tensors; ``--device`` forces one), the functions
:class:`cwtrain.hotload.codec.device.TorchDeltaEncoder` runs, each against a baseline timed in
the same run:

- **xor+detect**: :func:`~cwtrain.hotload.codec.device.xor_changed` (int64 views, one XOR, one
  reduction) and reading its flag; baselines: the same on ``uint8`` elements (the code
  before issue 20) and numpy's XOR + ``any`` on host arrays;
- **adler32**: :func:`~cwtrain.hotload.codec.device.device_adler32` (int8 matrix product, each
  byte read once); baselines: the block loop that widened 8 MiB blocks to int32 (before
  issue 20) and zlib's (or python-isal's) ``adler32`` on the host bytes;
- **host copy**: the XOR into a reused host buffer (pinned on CUDA) as the encoder does.

Every result is checked against zlib / numpy before it is reported. GB/s counts bytes of
one tensor (the new weights), best of ``--repeat`` runs. On CUDA the figures are compared
with issue 20's targets (XOR + detection >= 1000 GB/s, Adler-32 >= 500 GB/s) and each says
pass or FAIL; ``--sweep`` also times the Adler-32 over block and row sizes. On CPU tensors
it runs in a few seconds (CI's ``bench`` smoke test) and states that the targets are for a GPU.

    .venv-3.12/bin/python bench/gpu.py                 # CPU tensors here, CUDA where present
    .venv-3.12/bin/python bench/gpu.py --json --sweep  # on a GPU machine (scripts/gpu-check.sh)
"""

from __future__ import annotations

import argparse
import json
import time
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import cwtrain.hotload.codec.device as device_codec
from cwtrain.hotload.format.checksum import adler32 as host_adler32

MIB = 1 << 20
GB = 1e9
TARGETS = {"xor+detect": 1000.0, "adler32": 500.0}  # GB/s of input on an H100/H200-class GPU


def parse_size(text: str) -> int:
    """``512MiB`` -> bytes."""
    units = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
    lowered = text.strip().lower()
    digits = lowered.rstrip("abcdefghijklmnopqrstuvwxyz")
    return int(float(digits) * units[lowered[len(digits) :]])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_seconds(fn: Callable[[], object], device: torch.device, repeat: int) -> float:
    """Best wall time of ``repeat`` runs of ``fn`` (after one warm-up), with the device synchronised."""
    fn()
    _sync(device)
    times = []
    for _ in range(repeat):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return min(times)


def block_loop_adler32(data: torch.Tensor) -> int:
    """The Adler-32 before issue 20 (baseline): 8 MiB blocks widened to int32, several kernels each."""
    block_size = 1 << 23
    n = data.numel()
    sums = []
    for start in range(0, n, block_size):
        block = data[start : start + block_size].to(torch.int32)
        weights = torch.arange(block.numel(), device=data.device, dtype=torch.int32)
        sums.append(torch.stack([block.sum(dtype=torch.int64), (block * weights).sum(dtype=torch.int64)]))
    a, b = 1, n
    for position, (s1, s2) in enumerate(torch.stack(sums).cpu().tolist() if sums else []):
        a += s1
        b += (n - position * block_size) * s1 - s2
    return ((b % 65521) << 16) | (a % 65521)


def uint8_xor_detect(new: torch.Tensor, old: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """XOR + change detection before issue 20 (baseline): element-wise on uint8."""
    xor = torch.bitwise_xor(new, old)
    return xor, bool(xor.any())


def measure(size: int, device: torch.device, repeat: int, *, sweep: bool) -> dict[str, Any]:
    """Every figure of one run (see the module docstring)."""
    g = torch.Generator().manual_seed(0)
    host_new = torch.randint(0, 256, (size,), generator=g, dtype=torch.uint8)
    host_old = host_new.clone()
    host_old[:: max(1, size // 1000)] ^= 1  # a changed tensor
    new, old = host_new.to(device), host_old.to(device)
    reference_xor = np.bitwise_xor(host_new.numpy(), host_old.numpy())
    reference_adler = zlib.adler32(host_new.numpy().tobytes())

    xor, flag = device_codec.xor_changed(new, old)
    if not bool(flag) or not np.array_equal(xor.cpu().numpy(), reference_xor):
        raise SystemExit("xor_changed disagrees with numpy")
    if device_codec.device_adler32(new) != reference_adler or block_loop_adler32(new) != reference_adler:
        raise SystemExit("a device Adler-32 disagrees with zlib")
    pinned = device.type == "cuda"
    host_buffer = torch.empty(size, dtype=torch.uint8, pin_memory=pinned)

    def xor_detect() -> None:
        _, changed = device_codec.xor_changed(new, old)
        bool(changed)

    def host_copy() -> None:
        host_buffer.copy_(xor, non_blocking=pinned)

    a64, b64 = host_new.numpy().view(np.uint64)[: size // 8], host_old.numpy().view(np.uint64)[: size // 8]
    out64 = np.empty_like(a64)

    def numpy_xor_detect() -> None:
        np.bitwise_xor(a64, b64, out=out64)
        bool(out64.any())

    timings = {
        "xor+detect": best_seconds(xor_detect, device, repeat),
        "xor+detect (uint8, before)": best_seconds(lambda: uint8_xor_detect(new, old), device, repeat),
        "xor+detect (numpy, host)": best_seconds(numpy_xor_detect, torch.device("cpu"), repeat),
        "adler32": best_seconds(lambda: device_codec.device_adler32(new), device, repeat),
        "adler32 (block loop, before)": best_seconds(lambda: block_loop_adler32(new), device, repeat),
        "adler32 (zlib, host)": best_seconds(lambda: host_adler32(host_new.numpy()), torch.device("cpu"), repeat),
        "host copy of the XOR": best_seconds(host_copy, device, repeat),
    }
    if not np.array_equal(host_buffer.numpy(), reference_xor):
        raise SystemExit("the host copy of the XOR differs")
    rates = {name: size / seconds / GB for name, seconds in timings.items()}
    result: dict[str, Any] = {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU tensors",
        "bytes": size,
        "repeat": repeat,
        "torch": torch.__version__,
        "cpu_threads": torch.get_num_threads(),
        "seconds": timings,
        "gb_per_s": rates,
        "ratios": {
            "xor+detect / uint8": timings["xor+detect (uint8, before)"] / timings["xor+detect"],
            "adler32 / block loop": timings["adler32 (block loop, before)"] / timings["adler32"],
        },
        "targets_gb_per_s": TARGETS,
        "targets_apply": device.type == "cuda",
        "targets_pass": {name: rates[name] >= goal for name, goal in TARGETS.items()}
        if device.type == "cuda"
        else None,
    }
    if sweep:
        result["adler32_sweep"] = adler_sweep(new, device, repeat, reference_adler)
    return result


def adler_sweep(data: torch.Tensor, device: torch.device, repeat: int, expected: int) -> list[dict[str, Any]]:
    """Adler-32 GB/s over row and block sizes (module constants, restored afterwards)."""
    saved = device_codec._ADLER_ROW, device_codec._ADLER_BLOCK
    rows = []
    try:
        for row in (1024, 4096, 16384):
            for block in (8 * MIB, 32 * MIB, 128 * MIB):
                device_codec._ADLER_ROW, device_codec._ADLER_BLOCK = row, block
                if device_codec.device_adler32(data) != expected:
                    raise SystemExit(f"device Adler-32 wrong with row {row}, block {block}")
                seconds = best_seconds(lambda: device_codec.device_adler32(data), device, repeat)
                rows.append({"row": row, "block": block, "gb_per_s": data.numel() / seconds / GB})
    finally:
        device_codec._ADLER_ROW, device_codec._ADLER_BLOCK = saved
    return rows


def report(result: dict[str, Any]) -> None:
    print(
        f"{result['device_name']} ({result['device']}), {result['bytes'] / MIB:.0f} MiB, best of {result['repeat']}, "
        f"torch {result['torch']}, {result['cpu_threads']} CPU threads"
    )
    for name, rate in result["gb_per_s"].items():
        goal = TARGETS.get(name)
        verdict = ""
        if goal is not None:
            verdict = (
                f"   target >= {goal:.0f}: {'pass' if rate >= goal else 'FAIL'}"
                if result["targets_apply"]
                else f"   (target >= {goal:.0f} GB/s is for an H100/H200-class GPU)"
            )
        print(f"{name:<30}{rate:>10.2f} GB/s{verdict}")
    for name, ratio in result["ratios"].items():
        print(f"{name:<30}{ratio:>10.2f} x")
    for row in result.get("adler32_sweep", []):
        print(f"adler32 row {row['row']:>5} block {row['block'] // MIB:>4} MiB {row['gb_per_s']:>10.2f} GB/s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda if available)")
    parser.add_argument("--size", type=parse_size, default=None, help="bytes per tensor (GPU 2GiB, CPU 8MiB)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure, best kept (3)")
    parser.add_argument("--sweep", action="store_true", help="also time Adler-32 over row and block sizes")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    size = args.size or (2 << 30 if device.type == "cuda" else 8 * MIB)
    size -= size % 8
    result = measure(size, device, args.repeat, sweep=args.sweep)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        report(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
