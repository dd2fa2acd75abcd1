"""The ingest queue's lanes: every submission is taken exactly once, in order within its lane, lanes in turn,
and one source cannot take more than its share of the room."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.ingest import Source, Submission
from node.service import IngestQueue, Stopping, _Waiting


def items(lane: str, count: int) -> list[_Waiting]:
    return [_Waiting(Submission(f"{lane}/{n}".encode(), Source("test", lane))) for n in range(count)]


def names(batch: list[_Waiting]) -> list[str]:
    return [waiting.submission.data.decode() for waiting in batch]


def test_lanes_are_served_in_turn_so_a_flood_waits_behind_itself():
    async def main() -> None:
        queue = IngestQueue(capacity=100, lane_capacity=50)
        assert queue.put_nowait("flood", items("flood", 40))
        assert queue.put_nowait("honest", items("honest", 2))
        first = names(await queue.take(5))
        assert first == ["flood/0", "honest/0", "flood/1", "honest/1", "flood/2"]
        assert names(await queue.take(100)) == [f"flood/{n}" for n in range(3, 40)]
        assert len(queue) == 0

    trio.run(main)


def test_a_lane_without_room_refuses_the_whole_delivery_and_leaves_others_room():
    async def main() -> None:
        queue = IngestQueue(capacity=10, lane_capacity=4)
        assert queue.put_nowait("a", items("a", 3))
        assert not queue.put_nowait("a", items("a", 2))  # 5 > 4: none of them is queued
        assert len(queue) == 3
        assert queue.put_nowait("b", items("b", 4))
        assert queue.put_nowait("c", items("c", 3))
        assert not queue.put_nowait("d", items("d", 1))  # the queue as a whole is full
        assert len(queue) == 10

    trio.run(main)


def test_put_waits_for_room_and_close_stops_senders_but_not_the_taker():
    async def main() -> None:
        queue = IngestQueue(capacity=2, lane_capacity=2)
        queued: list[int] = []

        async def sender() -> None:
            await queue.put("sync", items("sync", 5))
            queued.append(5)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sender)
            await trio.testing.wait_all_tasks_blocked()
            assert len(queue) == 2 and not queued  # the sender waits for room
            taken = []
            while len(taken) < 5:
                taken += names(await queue.take(1))
            assert taken == [f"sync/{n}" for n in range(5)]
        assert queued == [5]
        queue.put_nowait("rpc", items("rpc", 1))
        queue.close()
        with pytest.raises(Stopping):
            queue.put_nowait("rpc", items("rpc", 1))
        assert names(await queue.take(10)) == ["rpc/0"]  # what was queued is still taken
        assert await queue.take(10) == []

    trio.run(main)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("abcd"), st.integers(1, 6)), max_size=30),
    st.integers(1, 7),
)
def test_every_submission_is_taken_once_in_order_within_its_lane(deliveries, most):
    async def main() -> None:
        queue = IngestQueue(capacity=1000, lane_capacity=1000)
        expected: dict[str, list[str]] = {}
        for lane, count in deliveries:
            start = len(expected.setdefault(lane, []))
            batch = [_Waiting(Submission(f"{lane}/{start + n}".encode())) for n in range(count)]
            assert queue.put_nowait(lane, batch)
            expected[lane] += names(batch)
        taken: dict[str, list[str]] = {}
        while len(queue):
            batch = names(await queue.take(most))
            assert 0 < len(batch) <= most
            lanes_in_batch = [name.split("/")[0] for name in batch]
            # one per lane in turn: no lane appears twice before every lane with work has appeared once
            assert len(set(lanes_in_batch[: len(set(lanes_in_batch))])) == len(set(lanes_in_batch))
            for name in batch:
                taken.setdefault(name.split("/")[0], []).append(name)
        assert taken == {lane: queued for lane, queued in expected.items() if queued}

    trio.run(main)
