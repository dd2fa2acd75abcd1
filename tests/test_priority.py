"""Reads before background work (ledger/priority.py): a pause waits for reads in flight, within its bounds."""

from __future__ import annotations

import threading
import time

from ledger.priority import ReadPriority


def _in_thread(target) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_pause_returns_at_once_without_reads() -> None:
    priority = ReadPriority(longest=60)
    done = _in_thread(priority.pause)
    done.join(10)
    assert not done.is_alive()


def test_pause_waits_for_the_read_in_flight_to_end() -> None:
    priority = ReadPriority(longest=60)
    events: list[str] = []
    release = threading.Event()

    def read() -> None:
        with priority.reading():
            with priority.reading():  # reads nest
                release.wait(30)
            events.append("inner read ended")
            release.wait(30)
        events.append("read ended")

    reader = _in_thread(read)
    while not priority.reading_now:
        time.sleep(0.001)
    pauser = _in_thread(lambda: (priority.pause(), events.append("pause returned")))
    pauser.join(0.3)
    assert pauser.is_alive() and events == []
    release.set()
    reader.join(10)
    pauser.join(10)
    assert events == ["inner read ended", "read ended", "pause returned"]


def test_a_pause_is_bounded_and_then_work_goes_on_as_long_as_it_waited() -> None:
    """A read that never ends holds background work for `longest` at a time, and at most half of the time."""
    priority = ReadPriority(longest=0.5)
    release = threading.Event()

    def read() -> None:
        with priority.reading():
            release.wait(30)

    reader = _in_thread(read)
    while not priority.reading_now:
        time.sleep(0.001)
    timings: list[float] = []

    def background() -> None:
        for _ in range(2):
            start = time.monotonic()
            priority.pause()
            timings.append(time.monotonic() - start)

    worker = _in_thread(background)
    worker.join(20)
    release.set()
    reader.join(10)
    assert not worker.is_alive()
    first, second = timings
    assert first >= 0.5  # waited the whole bound: the read was still in flight
    assert second < 0.5  # a wait of the bound cannot take less: it did not wait again at once
