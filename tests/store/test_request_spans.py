"""Request rows keep dropped positions as spans; rows written before spans still read."""

from __future__ import annotations

import itertools
import sqlite3
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st

from proxy.store.base import positions, row_spans, spans
from proxy.store.sqlite import SqliteStore
from tests.stores import ALICE, msg, req


@given(st.lists(st.integers(min_value=0, max_value=300)))
@example(list(range(5, 2000)))  # one run, the usual trim
@example([*range(1, 900), *range(950, 2000), 1, 7])  # two runs, duplicates
@example([3])
def test_spans_hold_exactly_the_positions(values):
    got = spans(values)
    assert positions(got) == sorted(set(values))
    # Merged: no two spans touch, so the count is the number of runs.
    assert all(a[1] < b[0] for a, b in itertools.pairwise(got))
    assert row_spans(got) == got  # a row in the new shape reads as itself


async def test_a_row_written_before_spans_reads_as_spans(tmp_path: Path):
    store = SqliteStore(tmp_path / "old.db")
    await store.open()
    try:
        record = req(dropped_indexes=[1, 2], messages_dropped=2)
        await store.record_exchange(
            ALICE, [msg("system", "s"), *[msg("user", "u")] * 3], None, record
        )
        # As an older ctxproxy wrote it: every position, and the item ids.
        conn = sqlite3.connect(tmp_path / "old.db")
        conn.execute(
            "UPDATE requests SET dropped_indexes = '[1, 2, 3, 7]',"
            " dropped_item_ids = '[11, 12, 13, 17]' WHERE id = ?",
            (record.id,),
        )
        conn.commit()
        conn.close()

        row = await store.request(record.id)
        assert row is not None
        assert row["dropped_spans"] == [[1, 4], [7, 8]]
        assert "dropped_indexes" not in row and "dropped_item_ids" not in row
        assert (await store.requests(ALICE))[0]["dropped_spans"] == [[1, 4], [7, 8]]
    finally:
        await store.close()
