"""policies.chunks: a summary's range split into runs that fit the summarizer's window."""

from __future__ import annotations

from policies.chunks import MAX_CALLS, chunks


def test_runs_keep_the_order_and_each_fits_the_room():
    assert chunks([3, 4, 5, 6, 7], [40, 50, 30, 80, 10], 100) == [(3, 4), (5,), (6, 7)]
    assert chunks([1, 2], [10, 10], 100) == [(1, 2)]


def test_one_over_the_room_is_a_run_of_its_own():
    assert chunks([1, 2, 3], [10, 500, 10], 100) == [(1,), (2,), (3,)]


def test_too_many_runs_or_no_room_is_none():
    many = list(range(MAX_CALLS + 1))
    assert chunks(many, [90] * len(many), 100) is None
    assert chunks(many[:-1], [90] * MAX_CALLS, 100) is not None
    assert chunks([1], [1], 0) is None
