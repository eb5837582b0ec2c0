"""One progress protocol: upload and hot-load events share ProgressEvent; ByteProgress draws them."""

from __future__ import annotations

import io
import threading

import pytest

from cwtrain.hotload import ProgressEvent as PublicProgressEvent
from cwtrain.hotload.follow import ProgressEvent, UploadProgress
from cwtrain.hotload.loader import ProgressEvent as LoaderProgressEvent
from cwtrain.infra.models import HotLoad, HotLoadReplica
from cwtrain.progress import ByteProgress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _hot_load_event() -> ProgressEvent:
    hot = HotLoad.from_api({"spec": {"id": "h", "identity": "a"}, "status": {"state": "HOT_LOAD_STATE_IN_PROGRESS"}})
    replica = HotLoadReplica.from_api({"name": "r0", "state": "UPDATING"})
    return ProgressEvent.of(hot, [replica], 3.0)


def test_one_class_under_every_import_path() -> None:
    assert PublicProgressEvent is ProgressEvent is LoaderProgressEvent


def test_upload_events_keep_the_documented_fields_typed() -> None:
    event = ProgressEvent.uploading("run-v000001", 3 << 20, 12 << 20, 4.4)
    assert event.stage == "upload" and (event.bytes_done, event.bytes_total) == (3 << 20, 12 << 20)
    assert isinstance(event.hot_load, HotLoad) and event.hot_load.identity == "run-v000001"
    assert (event.replicas, event.ready, event.total, event.elapsed) == ((), 0, 0, 4.4)
    assert event.summary() == "uploading 3.0 MiB of 12.0 MiB after 4s"
    assert _hot_load_event().stage == "hot_load"
    assert _hot_load_event().summary() == "in_progress after 3s (ready=0, updating=1)"


def test_upload_progress_throttles_worker_threads_and_sends_the_last_event_once() -> None:
    events: list[ProgressEvent] = []
    counter = UploadProgress("run-v000002", 400, events.append, interval=3600.0)

    def work() -> None:
        for _ in range(100):
            counter(1)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(events) == 1 and events[0].bytes_done == 1  # the first count, then nothing for an hour
    counter.finish()
    assert len(events) == 2
    last = events[-1]
    assert last.stage == "upload" and last.bytes_done == last.bytes_total == 400
    assert last.hot_load.identity == "run-v000002"


def test_upload_progress_leaves_the_complete_count_to_finish() -> None:
    events: list[ProgressEvent] = []
    counter = UploadProgress("x", 10, events.append, interval=0.0)
    for _ in range(10):
        counter(1)
    assert [e.bytes_done for e in events] == list(range(1, 10))
    counter.finish()
    assert [e.bytes_done for e in events][-1] == 10
    assert sum(e.bytes_done >= e.bytes_total for e in events) == 1


def test_upload_progress_reports_more_bytes_than_announced_as_complete() -> None:
    events: list[ProgressEvent] = []
    counter = UploadProgress("x", 10, events.append)
    counter(12)  # e.g. a rewritten delta index larger than the local one
    counter.finish()
    assert (events[-1].bytes_done, events[-1].bytes_total) == (12, 12)


def test_byte_progress_draws_upload_events_and_ends_the_line_once() -> None:
    screen = Terminal()
    progress = ByteProgress("uploading run-v000003", stream=screen, interval=0.0)
    progress(ProgressEvent.uploading("run-v000003", 5, 10, 1.0))
    assert screen.getvalue().rsplit("\r", 1)[-1].startswith("\x1b[Kuploading run-v000003: 5 B/10 B (50%)")
    progress(ProgressEvent.uploading("run-v000003", 10, 10, 2.0))
    progress(ProgressEvent.uploading("run-v000003", 10, 10, 2.0))  # a repeated last event draws nothing
    progress(_hot_load_event())  # the loader logs the hot-load itself
    progress.close()  # already ended: nothing more
    text = screen.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")
    last = text.rstrip("\n").rsplit("\r", 1)[-1]
    assert last == "\x1b[Kuploading run-v000003: 10 B/10 B (100%) 5 B/s in 2.0s"  # measured, not estimated
    assert (progress.done, progress.total) == (10, 10)


def test_byte_progress_logs_one_final_line_when_not_a_terminal(caplog: pytest.LogCaptureFixture) -> None:
    stream = io.StringIO()
    progress = ByteProgress("uploading y", stream=stream)
    with caplog.at_level("INFO", logger="cwtrain.progress"):
        for done, elapsed in ((1, 0.1), (2, 5.0), (3, 30.0)):
            progress(ProgressEvent.uploading("y", done, 4, elapsed))  # not drawn, however far apart
        progress(ProgressEvent.uploading("y", 4, 4, 40.0))  # the last one: one line
    lines = [r.getMessage() for r in caplog.records if r.name == "cwtrain.progress"]
    assert lines == ["uploading y: 4 B/4 B (100%) 0 B/s in 40s"] and stream.getvalue() == ""
    assert caplog.records[-1].progress == {"label": "uploading y", "done": 4, "total": 4}  # type: ignore[attr-defined]


def test_byte_progress_still_counts_raw_bytes() -> None:
    screen = Terminal()
    progress = ByteProgress("diff", 8, stream=screen, interval=0.0)
    for _ in range(4):
        progress.add(2)
    progress.close()
    assert progress.done == 8 and screen.getvalue().endswith("\n")
    assert "8 B/8 B (100%)" in screen.getvalue().rsplit("\r", 1)[-1]
