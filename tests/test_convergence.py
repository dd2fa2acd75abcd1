"""The heart of the project: the same SET of operations gives the same library, whatever the arrival order."""

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.ledgers import open_ledger, random_history


def _deliveries(rng: random.Random, blocks: list, count: int) -> list[list[list[bytes]]]:
    """Several arrival schedules: shuffled, with duplicates, some operations held back to the end, random batches."""
    schedules = []
    for _ in range(count):
        order = [b.data for b in blocks]
        rng.shuffle(order)
        order += [rng.choice(order) for _ in range(rng.randint(0, 4))]  # duplicates
        delayed = [order.pop(rng.randrange(len(order))) for _ in range(rng.randint(0, len(order) // 3))]
        order += delayed
        batches, index = [], 0
        while index < len(order):
            step = rng.randint(1, 6)
            batches.append(order[index : index + step])
            index += step
        schedules.append(batches)
    return schedules


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), size=st.integers(2, 36))
def test_any_arrival_order_gives_identical_snapshots_and_state_roots(tmp_path_factory, seed, size):
    rng = random.Random(seed)
    blocks = random_history(rng, size)
    results = set()
    for number, schedule in enumerate(_deliveries(rng, blocks, 4)):
        ledger = open_ledger(tmp_path_factory.mktemp(f"n{number}"))
        for batch in schedule:
            outcomes = ledger.ingest(batch)
            assert all(o.outcome != "invalid" for o in outcomes), [o.errors for o in outcomes]
        assert ledger.view().pending() == [] and ledger.view().missing() == set()
        results.add((ledger.view().snapshot(), ledger.view().state_root()))
        ledger.rebuild_library()
        results.add((ledger.view().snapshot(), ledger.view().state_root()))
        ledger.close()
    assert len(results) == 1
