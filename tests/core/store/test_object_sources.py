"""Object sources: files read once into reused buffers, hashed and sent from them; changes are errors."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from cwtrain.errors import SnapshotError
from cwtrain.hotload.store import object_buffers as pool_module
from cwtrain.hotload.store import object_source as sources
from cwtrain.hotload.store.object_buffers import BufferPool, release_read_buffers
from cwtrain.hotload.store.object_source import ObjectSource

MIB = 1 << 20


def _file(tmp_path: Path, size: int, name: str = "shard") -> tuple[Path, bytes]:
    data = os.urandom(size)
    path = tmp_path / name
    path.write_bytes(data)
    return path, data


def _sent(reading: sources.Reading, size: int, step: int) -> bytes:
    out = bytearray()
    for offset in range(0, size, step):
        body = reading.part(offset, min(step, size - offset))
        out += b"".join(bytes(v) for v in body.views)
        reading.done(body)
    return bytes(out)


def test_a_file_that_fits_is_read_once_and_its_parts_are_the_hashed_buffers(tmp_path: Path) -> None:
    path, data = _file(tmp_path, 3 * MIB + 5)
    reads: list[int] = []
    source = ObjectSource.from_path(path)
    original = source.read_into  # type: ignore[attr-defined]

    def counting(view: memoryview, offset: int) -> None:
        reads.append(view.nbytes)
        original(view, offset)

    source.read_into = counting  # type: ignore[attr-defined]
    pool = BufferPool(8 * MIB)
    with source.reading(part_size=MIB, pool=pool) as reading:
        assert sum(reads) == len(data)  # read (and hashed) before the first part is asked for
        assert reading.sha256 == hashlib.sha256(data).hexdigest() == source.sha256()
        body = reading.part(MIB, MIB)
        assert all(not isinstance(v.obj, bytes) for v in body.views)  # our buffer, not a copy made for sending
        assert _sent(reading, len(data), MIB) == data
        reading.check()
    assert sum(reads) == len(data)  # never read again
    assert pool.used == 0
    source.close()


def test_a_file_larger_than_the_pool_is_re_read_and_verified_in_order(tmp_path: Path) -> None:
    path, data = _file(tmp_path, 5 * MIB)
    source = ObjectSource.from_path(path)
    pool = BufferPool(2 * MIB)
    with source.reading(part_size=2 * MIB, pool=pool) as reading:
        assert reading.sha256 == hashlib.sha256(data).hexdigest()
        with pytest.raises(SnapshotError, match="read in order"):
            reading.part(2 * MIB, 2 * MIB)
        assert _sent(reading, len(data), 2 * MIB) == data
        assert pool.used == 0  # each part's buffer went back once it was done
        reading.check()
    source.close()


def test_a_re_read_that_differs_from_the_hash_pass_fails_the_check(tmp_path: Path) -> None:
    path, data = _file(tmp_path, 4 * MIB)
    source = ObjectSource.from_path(path)
    with source.reading(part_size=MIB, pool=BufferPool(MIB)) as reading:
        stamp = path.stat()
        with path.open("r+b") as handle:  # same size; mtime put back: only the content differs
            handle.seek(3 * MIB)
            handle.write(b"\x00" * 16)
        os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
        _sent(reading, len(data), MIB)
        with pytest.raises(SnapshotError, match="SHA-256 differs between the hash pass and the bytes sent"):
            reading.check()
    source.close()


@pytest.mark.parametrize("budget", [64 * MIB, MIB])
def test_a_file_that_shrinks_is_a_snapshot_error_naming_it(tmp_path: Path, budget: int) -> None:
    path, _ = _file(tmp_path, 3 * MIB)
    source = ObjectSource.from_path(path)
    os.truncate(path, MIB + 7)
    expected = rf"{path}: the file changed .*it ended at byte {MIB + 7} of the {3 * MIB}"
    with (
        pytest.raises(SnapshotError, match=expected),
        source.reading(part_size=MIB, pool=BufferPool(budget)) as reading,
    ):
        _sent(reading, 3 * MIB, MIB)
    source.close()


def test_a_file_changed_after_it_was_read_fails_the_check_and_verify_unchanged(tmp_path: Path) -> None:
    path, data = _file(tmp_path, MIB)
    source = ObjectSource.from_path(path)
    with source.reading(part_size=MIB, pool=BufferPool(8 * MIB)) as reading:
        assert _sent(reading, len(data), MIB) == data  # the bytes read stay what was hashed
        with path.open("ab") as handle:
            handle.write(b"more")
        with pytest.raises(SnapshotError, match=r"size 1048576 -> 1048580 bytes"):
            reading.check()
    source.close()
    with pytest.raises(SnapshotError, match="changed"):
        source.verify_unchanged()  # by path, after the descriptor is closed
    replaced = tmp_path / "other"
    replaced.write_bytes(data)
    fresh = ObjectSource.from_path(path)
    os.replace(replaced, path)
    with pytest.raises(SnapshotError, match="replaced by another file"):
        fresh.verify_unchanged()
    fresh.close()


def test_only_regular_files_are_sources(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match="not a regular file"):
        ObjectSource.from_path(tmp_path)


def test_pool_hands_out_everything_a_reading_needs_at_once_and_reuses_buffers(tmp_path: Path) -> None:
    """Two files that each fit, but not together: the second waits instead of deadlocking halfway."""
    release_read_buffers()
    paths = [_file(tmp_path, 3 * MIB, name=f"f{i}")[0] for i in range(2)]
    pool = BufferPool(4 * MIB)
    first = ObjectSource.from_path(paths[0]).reading(part_size=MIB, pool=pool)
    assert pool.used == 3 * MIB
    got: list[sources.Reading] = []
    waiter = threading.Thread(
        target=lambda: got.append(ObjectSource.from_path(paths[1]).reading(part_size=MIB, pool=pool))
    )
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive() and pool.used == 3 * MIB  # nothing taken while it waits
    first.close()
    waiter.join(10)
    assert got and pool.used == 3 * MIB
    kept = {id(view.obj) for view in got[0]._parts.values()}  # type: ignore[attr-defined]
    got[0].close()
    assert pool_module._SPARE.total == 3 * MIB  # kept for the next reading
    again = ObjectSource.from_path(paths[0]).reading(part_size=MIB, pool=pool)
    assert {id(view.obj) for view in again._parts.values()} == kept  # type: ignore[attr-defined]
    again.close()
    release_read_buffers()
    assert pool_module._SPARE.total == 0


def test_waiting_for_buffers_stops_when_cancelled() -> None:
    pool = BufferPool(MIB)
    held = pool.take(MIB)
    cancelled = threading.Event()
    cancelled.set()
    with pytest.raises(SnapshotError, match="cancelled"):
        pool.take(MIB, cancelled)
    pool.give(held)
    assert pool.used == 0
