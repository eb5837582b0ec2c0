"""Decoding stays bounded: frames that expand past their size, checkpoints larger than the budget.

Each command runs in a child process whose peak RSS (``VmHWM``) is read at its exit:

- ``snapshot verify`` of a delta (no base) whose one frame declares 1 TiB in 131 KB of RLE
  blocks is refused at once (the blocks cannot hold it); one that declares the 1 GiB its
  blocks do hold is decoded 1 MiB at a time, never held;
- ``snapshot apply`` and ``snapshot verify --base`` of a 192 MiB checkpoint with a 64 MiB
  memory budget stay well under the checkpoint's size;
- a shard truncated while ``verify`` reads it is a ``SnapshotError`` (files are read with
  ``pread``, never through a mapping that would die of ``SIGBUS``).
"""

from __future__ import annotations

import filecmp
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cwtrain.hotload.files.write import write_delta, write_full_snapshot
from cwtrain.hotload.format.index import INDEX_NAME
from cwtrain.hotload.format.safetensors import TensorEntry, encode_header

pytestmark = [pytest.mark.faults, pytest.mark.fault_row("decode-memory")]

SHARD = "model-00000-of-00001.safetensors"
MiB = 1 << 20
DELTA_METADATA = {
    "version": "2",
    "base_version": "1",
    "delta_encoding": "xor",
    "compression_format": "zstd",
    "checksum_format": "adler32",
}
_RUN = """
import sys
from cwtrain.cli import main
code = main(sys.argv[1:])
peak = [line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")][0]
print("VmHWM", peak, file=sys.stderr)
sys.exit(code)
"""


def _cli(*argv: str, budget: int | None = None) -> tuple[int, str, str, int]:
    """``cwtrain <argv>`` in a child: (exit code, stdout, stderr without the RSS line, peak RSS bytes)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CWTRAIN_")}
    if budget is not None:
        env["CWTRAIN_HOTLOAD_MEMORY_BUDGET"] = str(budget)
    done = subprocess.run(
        [sys.executable, "-c", _RUN, *argv], capture_output=True, text=True, env=env, timeout=240, check=False
    )
    lines = done.stderr.splitlines()
    peaks = [line for line in lines if line.startswith("VmHWM ")]
    assert peaks, f"the child died (exit {done.returncode}): {done.stderr[-2000:]}"
    rest = "\n".join(line for line in lines if not line.startswith("VmHWM "))
    return done.returncode, done.stdout, rest, int(peaks[0].split()[1]) * 1024


def _rle_frame(declared: int, blocks: int) -> bytes:
    """A zstd frame of ``blocks`` RLE blocks of 128 KiB, declaring ``declared`` bytes of content."""
    frame = b"\x28\xb5\x2f\xfd" + bytes([0xC0, (17 - 10) << 3]) + declared.to_bytes(8, "little")
    for i in range(blocks):
        header = (1 if i == blocks - 1 else 0) | (1 << 1) | ((128 << 10) << 3)
        frame += header.to_bytes(3, "little") + b"\x00"
    return frame


def _delta_dir(root: Path, payload: bytes) -> Path:
    root.mkdir(parents=True)
    entry = TensorEntry("w", "U8", (len(payload),), 0, len(payload))
    (root / SHARD).write_bytes(encode_header([entry], {"w": "00000001"}) + payload)
    (root / INDEX_NAME).write_text(json.dumps({"metadata": DELTA_METADATA, "weight_map": {"w": SHARD}}))
    return root


def _one_error(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


def test_a_frame_declaring_1_tib_is_refused_before_decoding(tmp_path: Path) -> None:
    delta = _delta_dir(tmp_path / "bomb", _rle_frame(1 << 40, 32_768))  # 131 KB
    code, out, err, peak = _cli("snapshot", "verify", str(delta))
    line = _one_error(err)
    assert code == 1 and out == "" and "tensor 'w'" in line and "1099511627776" in line, err
    assert peak < 200 * MiB, f"peak RSS {peak / MiB:.0f} MiB"


def test_a_frame_expanding_to_1_gib_streams(tmp_path: Path) -> None:
    delta = _delta_dir(tmp_path / "zeros", _rle_frame(1 << 30, 8_192))  # 32 KB that hold 1 GiB of zeros
    code, out, err, peak = _cli("snapshot", "verify", str(delta))
    assert code == 1 and json.loads(out)["result"] == "unverified", err  # frames decode; no base, no Adler-32
    assert "--base" in _one_error(err)
    assert peak < 200 * MiB, f"peak RSS {peak / MiB:.0f} MiB for a frame of 1 GiB"


def _sparse_checkpoint(
    root: Path, sizes: dict[str, int], touched: dict[str, bytes], metadata: dict[str, str] | None = None
) -> Path:
    """One U8 safetensors file: holes (zeros) except ``touched`` bytes at each named tensor's start."""
    root.mkdir(parents=True)
    entries, offset = [], 0
    for name, size in sizes.items():
        entries.append(TensorEntry(name, "U8", (size,), offset, offset + size))
        offset += size
    header = encode_header(entries, metadata or {"format": "pt"})
    with open(root / "model.safetensors", "wb") as out:
        out.write(header)
        for entry in entries:
            if entry.name in touched:
                out.seek(len(header) + entry.begin)
                out.write(touched[entry.name])
        out.truncate(len(header) + offset)
    (root / "config.json").write_text("{}")
    return root


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A 192 MiB checkpoint (three 64 MiB tensors), its successor, and the delta between them."""
    root = tmp_path_factory.mktemp("big")
    sizes = {f"layer.{i}.weight": 64 * MiB for i in range(3)}
    rng = np.random.default_rng(0)
    old = _sparse_checkpoint(root / "old", sizes, {})
    touched = {name: rng.integers(0, 256, 8 * MiB, dtype=np.uint8).tobytes() for name in sizes}
    new = _sparse_checkpoint(root / "new", sizes, touched)
    write_delta(old, new, root / "delta", version="2", base_version="1", workers=2)
    return old, new, root / "delta"


def test_apply_stays_within_the_budget(big: tuple[Path, Path, Path], tmp_path: Path) -> None:
    old, new, delta = big
    code, out, err, peak = _cli(
        "snapshot", "apply", str(old), str(delta), "--out", str(tmp_path / "applied"), budget=64 * MiB
    )
    assert code == 0, err
    assert json.loads(out)["tensors_verified"] == 3
    reference = write_full_snapshot(new, tmp_path / "reference")  # what a FULL of the new weights holds
    assert filecmp.cmp(tmp_path / "applied" / "model.safetensors", reference / "model.safetensors", shallow=False)
    assert peak < 160 * MiB, f"peak RSS {peak / MiB:.0f} MiB applying a 192 MiB checkpoint with a 64 MiB budget"


def test_verify_with_base_stays_within_the_budget(big: tuple[Path, Path, Path]) -> None:
    old, _, delta = big
    code, out, err, peak = _cli("snapshot", "verify", str(delta), "--base", str(old), budget=64 * MiB)
    assert code == 0 and json.loads(out)["verified"] == 3, err
    assert peak < 160 * MiB, f"peak RSS {peak / MiB:.0f} MiB verifying against a 192 MiB base"


_SHRINK = """
import os, sys
from cwtrain.errors import SnapshotError
from cwtrain.hotload.codec.decode import load_full
from cwtrain.hotload.files.checkpoint import open_snapshot_dir
snap = open_snapshot_dir(sys.argv[1])
os.truncate(os.path.join(sys.argv[1], "model.safetensors"), 4096)
try:
    load_full(snap.index, snap.shards, workers=1)
except SnapshotError as exc:
    print("SnapshotError:", exc)
finally:
    snap.close()
"""


def test_a_shard_truncated_while_verify_reads_it_is_an_error(tmp_path: Path) -> None:
    sizes = {f"t{i}": 4 * MiB for i in range(2)}
    checksums = {"format": "pt", "t0": "00000001", "t1": "00000001"}  # verify must read every byte
    ckpt = _sparse_checkpoint(tmp_path / "full", sizes, {"t1": b"\x01" * 1024}, checksums)
    done = subprocess.run([sys.executable, "-c", _SHRINK, str(ckpt)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"killed by signal {-done.returncode}" if done.returncode < 0 else done.stderr
    assert done.stdout.startswith("SnapshotError:") and "shrink" in done.stdout, done.stdout
